"""effectd_client.contrib.crewai: a real CrewAI crew (a scripted BaseLLM,
CrewAI's custom LLM interface, no network) in `.venv-crewai`, its tools
wrapped by a `CrewLedger`, against a real daemon run by the test: each call
is recorded under the run and its place in the run with the policy's effect;
a tool's definite error reaches the model once and is never retried by
CrewAI; an approval stops the crew with the ledger's facts (`LedgerPause`)
and `decide` binds the decision to the arguments the pause showed."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

from effectd_client import Client, Effect, State
from effectd_client.pytest_plugin import effectd_daemon  # noqa: F401
from effectd_client.testing import TestDaemon
from tests.support.processes import ROOT

PYTHON = ROOT / ".venv-crewai" / "bin" / "python"


def run_crew(
    daemon: TestDaemon, workdir: Path, run_id: str, answer: str = ""
) -> dict[str, Any]:
    """The crew of `tests/clients/crew_agent.py` once, in CrewAI's venv."""
    assert PYTHON.exists(), ".venv-crewai is missing: run `make frameworks`"
    done = subprocess.run(
        [
            str(PYTHON),
            "-m",
            "tests.clients.crew_agent",
            daemon.target,
            str(workdir),
            run_id,
            answer,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def ran(workdir: Path) -> list[str]:
    path = workdir / "ran"
    return path.read_text().splitlines() if path.exists() else []


def test_a_crew_pauses_for_approval_and_a_decision_binds_to_its_arguments(
    effectd_daemon: TestDaemon,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The READ and the failing tool run once each (the error committed and
    handed to the model, not retried by CrewAI); the SIDE_EFFECT stops the
    crew waiting for an approver; a decision showing other arguments is
    refused and the crew stops again; the right one lets the crew finish,
    the failing tool's stored error replayed, never run again."""
    run_id = f"crew-{uuid.uuid4().hex[:10]}"
    first = run_crew(effectd_daemon, tmp_path, run_id)
    facts = first["paused"]
    assert (facts["call_id"], facts["action"]) == ("book-3", "approve")
    assert facts["arguments"] == {"item": "room"}
    with Client(effectd_daemon.target) as client:
        look = client.get_tool_call(run_id, "look-1")
        fail = client.get_tool_call(run_id, "fail-2")
        book = client.get_tool_call(run_id, "book-3")
    assert (look.effect, look.state) == (Effect.READ, State.COMMITTED)
    assert (fail.effect, fail.state) == (Effect.SIDE_EFFECT, State.COMMITTED)
    assert fail.result is not None
    assert "no such code 7" in fail.result.error_message
    assert book.state is State.AWAITING_APPROVAL
    assert ran(tmp_path) == ["fail 7"]
    edited = run_crew(effectd_daemon, tmp_path, run_id, "decide-edited")
    assert "other arguments" in edited["refused"]
    assert edited["paused"]["call_id"] == "book-3"
    assert ran(tmp_path) == ["fail 7"]
    done = run_crew(effectd_daemon, tmp_path, run_id, "decide")
    assert "refused" not in done
    assert done["final"] == "sunny in Oslo | error: no such code 7 | booked room"
    assert ran(tmp_path) == ["fail 7", "room"]


def test_a_rejected_call_answers_the_model_and_never_runs(
    effectd_daemon: TestDaemon,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Rejected in effectd: the crew started again gives the model an error
    naming the rejection and finishes; the tool never ran."""
    run_id = f"crew-{uuid.uuid4().hex[:10]}"
    run_crew(effectd_daemon, tmp_path, run_id)
    with Client(effectd_daemon.target) as client:
        call = client.get_tool_call(run_id, "book-3")
        client.decide_approval(
            run_id,
            "book-3",
            approve=False,
            approver="ann",
            reason="too dear",
            expected_revision=call.revision,
            input_fingerprint=call.input_fingerprint,
        )
    out = run_crew(effectd_daemon, tmp_path, run_id)
    assert "an approver rejected the call" in out["final"]
    assert ran(tmp_path) == ["fail 7"]
