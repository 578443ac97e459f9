"""The child side of a `VenvDriver`, run in the framework's own venv:

    python -m tests.adapters.isolated.child MODULE OP AGENT_JSON [PAUSED ANSWER]

runs `OP` of `MODULE.DRIVER` once and prints the outcome (a line tagged
`TAG`). With the agent's `hook`, before each model turn it asks the test
process to run its daemon-restart hook, and when that killed the daemon it
waits until its own client has seen its connection go."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.adapters import world
from tests.adapters.drivers.base import Agent, Answer, Outcome
from tests.adapters.isolated import TAG, outcome_to_json, paused_of

# Every wait here is bounded: this many polls of this many seconds.
POLLS, POLL = 6000, 0.01


def tell(message: dict[str, Any]) -> None:
    sys.stdout.write(TAG + json.dumps(message) + "\n")
    sys.stdout.flush()


def _saw_it_go(client: Any) -> bool:
    """No session stream open. A session on the framed transport has none
    and no reader: its next message finds the connection closed."""
    session = client._session
    return session is None or getattr(session, "_stream", None) is None


async def before_turn(client: Any) -> None:
    """The test process's hook, asked for over stdin and stdout."""
    tell({"turn": True})
    answer = json.loads(sys.stdin.readline())
    if not answer["killed"]:
        return
    for _ in range(POLLS):
        if _saw_it_go(client):
            return
        await asyncio.sleep(POLL)
    raise AssertionError("the client did not see the daemon go")


def agent_from(spec: dict[str, Any]) -> Agent:
    script = tuple(tuple(world.Call(c, i) for c, i in turn) for turn in spec["script"])
    return Agent(
        target=str(spec["target"]),
        workdir=Path(str(spec["workdir"])),
        run_id=str(spec["run_id"]),
        script=script,
        wrapped=bool(spec["wrapped"]),
        approval=bool(spec["approval"]),
        before_turn=before_turn if spec.get("hook") else None,
    )


def main(argv: list[str]) -> None:
    module, op, spec = argv[0], argv[1], json.loads(argv[2])
    driver = importlib.import_module(module).DRIVER
    agent = agent_from(spec)
    out: Outcome | None
    if op == "answer":
        out = driver.answer(agent, paused_of(json.loads(argv[3])), Answer(argv[4]))
    elif op == "restart":
        driver.restart(agent)
        out = Outcome()
    else:
        out = getattr(driver, op)(agent)
    assert out is not None
    tell({"outcome": outcome_to_json(out)})
    leave()


def leave() -> None:
    """Ends the process at once, its output flushed. CrewAI's console
    listener waits up to 5 s, in a handler thread the interpreter joins at
    exit, for a crew tree that a crew with `verbose=False` never builds:
    5 s of nothing per child. What the run wrote is on disk already: the
    side-effect counter is fsynced by the tool, and the framework's saved
    state is written before the driver returns its outcome."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
