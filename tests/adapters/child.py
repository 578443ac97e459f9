"""An agent in a process of its own, for the scenarios that SIGKILL it:

    python -m tests.adapters.child DRIVER AGENT_JSON

runs (or resumes) the run once through the driver; the work directory's
`kill` file says where the process dies (`world.KillPoint`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.adapters import world
from tests.adapters.drivers import driver
from tests.adapters.drivers.base import Agent


def agent_from(spec: dict[str, object]) -> Agent:
    script = tuple(
        tuple(world.Call(c, i) for c, i in turn)
        for turn in spec["script"]  # type: ignore[attr-defined]
    )
    return Agent(
        target=str(spec["target"]),
        workdir=Path(str(spec["workdir"])),
        run_id=str(spec["run_id"]),
        script=script,
        wrapped=bool(spec["wrapped"]),
        approval=bool(spec["approval"]),
    )


def spec_of(agent: Agent) -> str:
    return json.dumps(
        {
            "target": agent.target,
            "workdir": str(agent.workdir),
            "run_id": agent.run_id,
            "script": [[(c.call_id, c.item) for c in turn] for turn in agent.script],
            "wrapped": agent.wrapped,
            "approval": agent.approval,
        }
    )


if __name__ == "__main__":
    driver(sys.argv[1]).run(agent_from(json.loads(sys.argv[2])))
