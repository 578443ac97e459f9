"""A CrewAI crew for tests/clients/test_crewai.py, run in `.venv-crewai`:

    python -m tests.clients.crew_agent TARGET WORKDIR RUN [ANSWER]

A scripted `BaseLLM` (CrewAI's custom LLM interface, its ReAct format)
calls `look(city)` (a READ in the policy), `fail(code)` (raises) and
`book(item)` (named nowhere: a SIDE_EFFECT, with approval by the policy's
default), then answers every observation it saw. ANSWER (`decide`,
`decide-edited`) decides the pause the first run left, from its facts
(saved in WORKDIR), before the crew starts again. Prints one JSON line:
the pause's facts, the crew's final answer, what `decide` refused."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
os.environ.setdefault("CREWAI_TESTING", "true")

from crewai import Agent, Crew, Task
from crewai.llms.base_llm import BaseLLM
from crewai.tools import tool

from effectd_client import Client
from effectd_client.contrib.crewai import (
    ApprovalMismatch,
    CrewLedger,
    LedgerPause,
    ToolPolicy,
    decide,
)

POLICY = """
require_approval = true

[tools.look]
effect = "read"
require_approval = false

[tools.fail]
require_approval = false
"""
CALLS = [("look", {"city": "Oslo"}), ("fail", {"code": 7}), ("book", {"item": "room"})]
OBSERVED = "\nObservation:"


def observed(said: str) -> str:
    """The tool's result in an answer CrewAI completed with it (without the
    reminder of the tools it appends to some)."""
    return said.split(OBSERVED, 1)[1].split("\n\n\n", 1)[0].strip()


class Scripted(BaseLLM):  # type: ignore[misc]  # CrewAI's types live in .venv-crewai
    def __init__(self) -> None:
        super().__init__(model="scripted")

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        said = [m["content"] for m in messages if m["role"] == "assistant"]
        if len(said) < len(CALLS):
            name, given = CALLS[len(said)]
            return f"Thought: go\nAction: {name}\nAction Input: {json.dumps(given)}"
        seen = [observed(s) for s in said if OBSERVED in s]
        return "Thought: I now know the final answer\nFinal Answer: " + " | ".join(seen)

    def supports_function_calling(self) -> bool:
        return False

    def supports_stop_words(self) -> bool:
        return True

    def get_context_window_size(self) -> int:
        return 8192


def main(target: str, workdir: Path, run_id: str, answer: str) -> None:
    ran = workdir / "ran"

    def record(what: str) -> None:
        with ran.open("a") as f:
            f.write(what + "\n")

    @tool("look")  # type: ignore[untyped-decorator]  # CrewAI's types live in .venv-crewai
    def look(city: str) -> str:
        """Looks a city up."""
        return f"sunny in {city}"

    @tool("fail")  # type: ignore[untyped-decorator]  # CrewAI's types live in .venv-crewai
    def fail(code: int) -> str:
        """Fails, definitely."""
        record(f"fail {code}")
        raise ValueError(f"no such code {code}")

    @tool("book")  # type: ignore[untyped-decorator]  # CrewAI's types live in .venv-crewai
    def book(item: str) -> str:
        """Books an item."""
        record(item)
        return f"booked {item}"

    out: dict[str, Any] = {}
    saved = workdir / "pause.json"
    with Client(target) as client:
        if answer.startswith("decide"):
            facts = json.loads(saved.read_text())
            shown = (
                {"item": "suite"} if answer == "decide-edited" else facts["arguments"]
            )
            try:
                decide(
                    client,
                    facts,
                    approve=True,
                    approver="ann",
                    reason="ok",
                    arguments=shown,
                )
            except ApprovalMismatch as refused:
                out["refused"] = str(refused)
        ledger = CrewLedger(client, run_id, policy=ToolPolicy.from_toml(POLICY))
        agent = Agent(
            role="planner",
            goal="plan the trip",
            backstory="plans trips",
            llm=Scripted(),
            tools=ledger.wrap([look, fail, book]),
            verbose=False,
        )
        task = Task(description="plan", expected_output="the plan", agent=agent)
        crew = Crew(agents=[agent], tasks=[task], verbose=False, tracing=False)
        try:
            out["final"] = str(crew.kickoff().raw)
        except LedgerPause as pause:
            out["paused"] = pause.facts
            saved.write_text(json.dumps(pause.facts))
    print(json.dumps(out))


if __name__ == "__main__":
    args = [*sys.argv[1:], ""]
    main(args[0], Path(args[1]), args[2], args[3])
    # Out at once, as `tests.adapters.isolated.child.leave` says why: CrewAI
    # would wait 5 s at exit for a crew tree it never builds here.
    sys.stdout.flush()
    os._exit(0)
