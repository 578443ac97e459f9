"""What the Node drivers share: the agent runs in a Node process of its own
(`tests/adapters/node/child.mjs FRAMEWORK SPEC`, the package's pinned
frameworks), once per `run`, `replay_step` or `answer`, and prints its outcome.
The daemon-restart scenario's hook runs here, in the driver's process, while
the Node agent waits before each model turn (a line each way). A Node agent
SIGKILLed at a kill point takes this process with it, so that a scenario's
killed child (`tests.adapters.child`) dies as the agent did."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from effectd_client import Client
from tests.adapters import world
from tests.adapters.drivers.base import Agent, Answer, Outcome, Paused, PauseKind

ROOT = Path(__file__).resolve().parents[3]
CHILD = ROOT / "tests" / "adapters" / "node" / "child.mjs"
NODE_SECONDS = 120.0
KINDS = {"approval": PauseKind.APPROVAL, "reconcile": PauseKind.RECONCILE}


def spec_of(agent: Agent, command: str, **more: Any) -> dict[str, Any]:
    return {
        "target": agent.target,
        "workdir": str(agent.workdir),
        "run_id": agent.run_id,
        "script": [[[c.call_id, c.item] for c in turn] for turn in agent.script],
        "wrapped": agent.wrapped,
        "approval": agent.approval,
        "hook": agent.before_turn is not None,
        "command": command,
        **more,
    }


def run_node(framework: str, agent: Agent, spec: Mapping[str, Any]) -> Outcome:
    """Runs the Node agent once; its outcome (this process dies with it)."""
    outcome: dict[str, Any] | None = None
    hook_client: Client | None = None
    with subprocess.Popen(
        ["node", str(CHILD), framework, json.dumps(spec)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        try:
            for line in proc.stdout:  # bounded: the agent's turns, then its outcome
                message = json.loads(line)
                if "turn" in message:
                    if agent.before_turn is not None:
                        hook_client = hook_client or Client(agent.target)
                        agent.before_turn(hook_client)
                    proc.stdin.write("\n")
                    proc.stdin.flush()
                elif "outcome" in message:
                    outcome = message["outcome"]
            _, stderr = proc.communicate(timeout=NODE_SECONDS)
        finally:
            if proc.poll() is None:
                proc.kill()
            if hook_client is not None:
                hook_client.close()
    if proc.returncode == -signal.SIGKILL and world.kill_point(agent.workdir):
        os.kill(os.getpid(), signal.SIGKILL)  # the agent died at its kill point
    if proc.returncode != 0 or outcome is None:
        raise RuntimeError(f"the Node agent failed ({proc.returncode}): {stderr}")
    return Outcome(
        tuple(
            Paused(
                p["call_id"],
                KINDS.get(p["kind"], PauseKind.OTHER),
                p["arguments"],
                p["raw"],
            )
            for p in outcome["paused"]
        ),
        outcome["final"],
    )


class NodeDriver:
    """A Node framework's driver; `state` names the files of its saved run."""

    def __init__(self, name: str, framework: str, state: tuple[str, ...]) -> None:
        self.name = name
        self.framework = framework
        self.state = state
        self.not_applicable: dict[world.Scenario, str] = {}

    def run(self, agent: Agent) -> Outcome:
        return run_node(self.framework, agent, spec_of(agent, "run"))

    def restart(self, agent: Agent) -> None:
        for name in self.state:
            (agent.workdir / name).unlink(missing_ok=True)

    def replay_step(self, agent: Agent) -> Outcome:
        return run_node(self.framework, agent, spec_of(agent, "replay"))

    def answer(self, agent: Agent, paused: Paused, answer: Answer) -> Outcome:
        spec = spec_of(agent, "answer", answer=answer.value, raw=paused.raw)
        return run_node(self.framework, agent, spec)
