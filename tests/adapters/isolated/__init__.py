"""Drivers whose framework lives in a virtual environment of its own.

Some frameworks pin packages the daemon's environment pins otherwise (Google
ADK requires opentelemetry-api<=1.44 and mcp<2), so they are installed in
`.venv-<name>` (`make frameworks`) and their agents run there, in child
processes, while the test process, with the daemon, stays in `.venv`.

`VenvDriver` is the driver the suite sees: each of its operations (`run`,
`restart`, `replay_step`, `answer`) runs the framework's own driver (a
module of this package holding `DRIVER`) once in that venv's Python
(`tests.adapters.isolated.child`), and reads the `Outcome` it prints. A
kill scenario runs the same child with a kill point (`child_command`). The
daemon-restart hook (`Agent.before_turn`) stays in the test process: the
child asks for it before each model turn, over its stdin and stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.adapters.drivers.base import Agent, Answer, Outcome, Paused, PauseKind
from tests.adapters.world import Scenario

ROOT = Path(__file__).resolve().parents[3]
# Lines of the child's stdout meant for the driver start with this.
TAG = "@effectd-driver "
CHILD_SECONDS = 120.0


def spec_of(agent: Agent, *, hook: bool = False) -> str:
    return json.dumps(
        {
            "target": agent.target,
            "workdir": str(agent.workdir),
            "run_id": agent.run_id,
            "script": [[(c.call_id, c.item) for c in turn] for turn in agent.script],
            "wrapped": agent.wrapped,
            "approval": agent.approval,
            "hook": hook,
        }
    )


def paused_to_json(p: Paused) -> dict[str, Any]:
    return {
        "call_id": p.call_id,
        "kind": p.kind.value,
        "arguments": dict(p.arguments),
        "raw": p.raw,
    }


def paused_of(data: Mapping[str, Any]) -> Paused:
    return Paused(
        str(data["call_id"]),
        PauseKind(data["kind"]),
        dict(data["arguments"]),
        data.get("raw"),
    )


def outcome_to_json(out: Outcome) -> dict[str, Any]:
    return {"paused": [paused_to_json(p) for p in out.paused], "final": out.final}


def outcome_of(data: Mapping[str, Any]) -> Outcome:
    return Outcome(tuple(paused_of(p) for p in data["paused"]), str(data["final"]))


class _Witness:
    """The client the test's daemon-restart hook is given: the agent's own
    client is in the child, which waits itself for its connection to go;
    the hook looking at this one's session says it killed the daemon."""

    def __init__(self) -> None:
        self.asked = False

    @property
    def _session(self) -> None:
        self.asked = True


@dataclass
class VenvDriver:
    """The suite's driver for a framework run in `venv` (see the module)."""

    name: str
    venv: str
    module: str
    not_applicable: Mapping[Scenario, str] = field(default_factory=dict)

    @property
    def python(self) -> Path:
        python = ROOT / self.venv / "bin" / "python"
        if not python.exists():
            raise RuntimeError(f"{self.venv} is missing: run `make frameworks`")
        return python

    def child_command(self, agent: Agent, op: str = "run", *extra: str) -> list[str]:
        """The child process running `op` of the framework's driver once."""
        return [
            str(self.python),
            "-m",
            "tests.adapters.isolated.child",
            self.module,
            op,
            spec_of(agent, hook=agent.before_turn is not None),
            *extra,
        ]

    def _call(self, agent: Agent, op: str, *extra: str) -> Outcome:
        child = subprocess.Popen(
            self.child_command(agent, op, *extra),
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdin is not None
        assert child.stdout is not None
        outcome: Outcome | None = None
        try:
            for line in child.stdout:
                if not line.startswith(TAG):
                    continue
                message = json.loads(line[len(TAG) :])
                if "turn" in message:
                    witness = _Witness()
                    assert agent.before_turn is not None
                    agent.before_turn(witness)
                    child.stdin.write(json.dumps({"killed": witness.asked}) + "\n")
                    child.stdin.flush()
                elif "outcome" in message:
                    outcome = outcome_of(message["outcome"])
            _, err = child.communicate(timeout=CHILD_SECONDS)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        if child.returncode != 0 or outcome is None:
            raise RuntimeError(
                f"{self.name} {op} failed ({child.returncode}): {err[-4000:]}"
            )
        return outcome

    def run(self, agent: Agent) -> Outcome:
        return self._call(agent, "run")

    def restart(self, agent: Agent) -> None:
        self._call(agent, "restart")

    def replay_step(self, agent: Agent) -> Outcome:
        return self._call(agent, "replay_step")

    def answer(self, agent: Agent, paused: Paused, answer: Answer) -> Outcome:
        return self._call(
            agent, "answer", json.dumps(paused_to_json(paused)), answer.value
        )
