"""effectd_client.contrib.google_adk: a real ADK agent (a scripted BaseLlm,
no network) in `.venv-adk`, its tools wrapped in `LedgeredTool`, against a
real daemon run by the test: each call is recorded under the ADK session and
the model's function call id with the policy's effect; an approval pause
carries the ledger's facts, `decide` binds the decision to the arguments the
pause showed, and ADK's own confirmation authorizes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from effectd_client import Client, Effect, State
from effectd_client.pytest_plugin import effectd_daemon  # noqa: F401
from effectd_client.testing import TestDaemon
from tests.support.processes import ROOT

PYTHON = ROOT / ".venv-adk" / "bin" / "python"


def run_agent(
    daemon: TestDaemon, workdir: Path, session: str, answer: str = ""
) -> dict[str, Any]:
    """The agent of `tests/clients/adk_agent.py` once, in ADK's venv."""
    assert PYTHON.exists(), ".venv-adk is missing: run `make frameworks`"
    done = subprocess.run(
        [
            str(PYTHON),
            "-m",
            "tests.clients.adk_agent",
            daemon.target,
            str(workdir),
            session,
            answer,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def ran(workdir: Path) -> list[str]:
    path = workdir / "ran"
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def session() -> str:
    return f"adk-{uuid.uuid4().hex[:10]}"


def test_calls_are_recorded_with_the_policys_effect_and_pause_for_approval(
    effectd_daemon: TestDaemon,  # noqa: F811
    tmp_path: Path,
    session: str,
) -> None:
    """The READ runs at once; the unnamed tool is a SIDE_EFFECT waiting for
    an approver, under the session id and the model's call id; the pause
    shows the ledger's facts; ADK's "confirmed" alone runs nothing."""
    out = run_agent(effectd_daemon, tmp_path, session)
    [paused] = out["paused"]
    assert paused["call_id"] == "m2"
    assert paused["arguments"] == {"item": "room"}
    assert paused["effectd"]["action"] == "approve"
    assert paused["effectd"]["run_id"] == session
    with Client(effectd_daemon.target) as client:
        look = client.get_tool_call(session, "m1")
        book = client.get_tool_call(session, "m2")
    assert (look.effect, look.state) == (Effect.READ, State.COMMITTED)
    assert (book.effect, book.state) == (Effect.SIDE_EFFECT, State.AWAITING_APPROVAL)
    again = run_agent(effectd_daemon, tmp_path, session, "confirm")
    assert again["still_waiting"] == "approve"
    assert [p["call_id"] for p in again["paused"]] == ["m2"]
    assert ran(tmp_path) == []


def test_a_decision_binds_to_the_shown_arguments(
    effectd_daemon: TestDaemon,  # noqa: F811
    tmp_path: Path,
    session: str,
) -> None:
    """`decide` with other arguments than the pause showed is refused and
    records nothing; with the shown ones it approves, and the resumed run
    books once, the model seeing both results."""
    run_agent(effectd_daemon, tmp_path, session)
    edited = run_agent(effectd_daemon, tmp_path, session, "decide-edited")
    assert "other arguments" in edited["refused"]
    assert edited["still_waiting"] == "approve"
    assert ran(tmp_path) == []
    out = run_agent(effectd_daemon, tmp_path, session, "decide")
    assert "refused" not in out
    assert out["paused"] == []
    assert out["final"] == '{"result": "sunny in Oslo"} | {"result": "booked room"}'
    assert ran(tmp_path) == ["room"]
    with Client(effectd_daemon.target) as client:
        assert client.get_tool_call(session, "m2").state is State.COMMITTED


def test_a_rejected_call_answers_the_model_and_never_runs(
    effectd_daemon: TestDaemon,  # noqa: F811
    tmp_path: Path,
    session: str,
) -> None:
    """Rejected in effectd: the resumed run gives the model an error result
    naming the rejection; the tool never ran."""
    run_agent(effectd_daemon, tmp_path, session)
    with Client(effectd_daemon.target) as client:
        call = client.get_tool_call(session, "m2")
        client.decide_approval(
            session,
            "m2",
            approve=False,
            approver="ann",
            reason="too dear",
            expected_revision=call.revision,
            input_fingerprint=call.input_fingerprint,
        )
    out = run_agent(effectd_daemon, tmp_path, session, "confirm")
    assert out["paused"] == []
    assert "an approver rejected the call" in out["final"]
    assert ran(tmp_path) == []
