"""The CrewAI driver, run in `.venv-crewai` (`VenvDriver`): a one-task crew
of an agent whose LLM is a scripted `BaseLLM` (CrewAI's custom LLM
interface; it answers in CrewAI's ReAct format, one `Action:` per answer,
so a script's turn of n calls is n answers) and the tool `book`, wrapped by
a `CrewLedger`. CrewAI keeps no state of an agent's loop to resume from: a
run starts the crew again (`kickoff`), a finished step runs again through
`crew.replay(task_id)` from the kickoff's stored task outputs (kept in the
work directory). A pause is a `LedgerPause` out of `kickoff`. CrewAI's own
approval gate is a `before_tool_call` hook: letting the call through is the
framework-only approval; editing `tool_input` in it, the edited one."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
from typing import Any

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
# No first-run prompt asking on stdin whether to show traces (CrewAI asks
# each new storage directory's first run, unless it is a test environment).
os.environ.setdefault("CREWAI_TESTING", "true")

from crewai import Agent as CrewAgent
from crewai import Crew, Task
from crewai.hooks import ToolCallHookContext, register_before_tool_call_hook
from crewai.llms.base_llm import BaseLLM
from crewai.tools import BaseTool, tool

from effectd_client import Client
from effectd_client.contrib.crewai import CrewLedger, LedgerPause, ToolPolicy
from tests.adapters import world
from tests.adapters.drivers.base import (
    Agent,
    Answer,
    Outcome,
    Paused,
    PauseKind,
)
from tests.adapters.drivers.crewai import NOT_APPLICABLE

POLICY = '[tools.book]\neffect = "side-effect"\n'
APPROVAL = POLICY + "require_approval = true\n"
KINDS = {"approve": PauseKind.APPROVAL, "reconcile": PauseKind.RECONCILE}
OBSERVED = "\nObservation:"


def observed(said: str) -> str:
    """The tool's result in an answer CrewAI completed with it (without the
    reminder of the tools it appends to some)."""
    return said.split(OBSERVED, 1)[1].split("\n\n\n", 1)[0].strip()


class ScriptedLLM(BaseLLM):  # type: ignore[misc]  # CrewAI's types live in .venv-crewai
    """The n-th answer for the n-th model turn of the task."""

    def __init__(self, agent: Agent, client: Client) -> None:
        super().__init__(model="scripted")
        self.agent, self.client = agent, client

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        agent = self.agent
        said = [m["content"] for m in messages if m["role"] == "assistant"]
        turn = len(said)
        if agent.before_turn is not None:
            stepped = agent.before_turn(self.client)
            if inspect.iscoroutine(stepped):
                asyncio.run(stepped)
        world.model_turn(agent.workdir, turn, answered=False)
        calls = [c for t in agent.script for c in t]
        if turn < len(calls):
            given = json.dumps({"item": calls[turn].item})
            text = f"Thought: book it\nAction: book\nAction Input: {given}"
        else:
            seen = [observed(s) for s in said if OBSERVED in s]
            final = world.final_text(seen)
            text = f"Thought: I now know the final answer\nFinal Answer: {final}"
        world.model_turn(agent.workdir, turn, answered=True)
        return text

    def supports_function_calling(self) -> bool:
        return False

    def supports_stop_words(self) -> bool:
        return True

    def get_context_window_size(self) -> int:
        return 8192


def _crew(agent: Agent, client: Client) -> Crew:
    workdir = agent.workdir

    @tool("book")  # type: ignore[untyped-decorator]  # CrewAI's types live in .venv-crewai
    def book(item: str) -> str:
        """Books an item (the side effect)."""
        return world.book(workdir, item)

    tools: list[BaseTool] = [book]
    if agent.wrapped:
        policy = ToolPolicy.from_toml(APPROVAL if agent.approval else POLICY)
        ledger = CrewLedger(
            client,
            agent.run_id,
            policy=policy,
            lease_ms=1000,
            in_progress_wait=10.0,
            # The n-th call is the script's: c1, c2, ... (as the model named them).
            call_id=lambda tool, n: f"c{n}",
        )
        tools = ledger.wrap(tools)
    booker = CrewAgent(
        role="booker",
        goal="book the items",
        backstory="books what is asked",
        llm=ScriptedLLM(agent, client),
        tools=tools,
        max_iter=50,
        verbose=False,
    )
    task = Task(
        description="book the items", expected_output="what was booked", agent=booker
    )
    return Crew(agents=[booker], tasks=[task], verbose=False, tracing=False)


def _kickoff(agent: Agent, replay: bool = False) -> Outcome:
    # The kickoff's task outputs (what `crew.replay` starts from) stay in
    # the work directory.
    os.environ["XDG_DATA_HOME"] = str(agent.workdir / "crewai")
    os.environ["CREWAI_STORAGE_DIR"] = "conformance"
    with Client(agent.target) as client:
        crew = _crew(agent, client)
        try:
            if replay:
                [first, *_] = crew._task_output_handler.load()
                out = crew.replay(first["task_id"])
            else:
                out = crew.kickoff()
        except LedgerPause as pause:
            facts = pause.facts
            kind = KINDS.get(facts["action"], PauseKind.OTHER)
            return Outcome((Paused(facts["call_id"], kind, facts["arguments"], facts),))
        return Outcome(final=str(out.raw))


class CrewAIDriver:
    def __init__(self) -> None:
        self.name = "crewai"
        self.not_applicable = NOT_APPLICABLE

    def run(self, agent: Agent) -> Outcome:
        return _kickoff(agent)

    def restart(self, agent: Agent) -> None:
        """CrewAI keeps no state of a run's agent loop: a run starts over."""

    def replay_step(self, agent: Agent) -> Outcome:
        return _kickoff(agent, replay=True)

    def answer(self, agent: Agent, paused: Paused, answer: Answer) -> Outcome:
        if answer is not Answer.DECIDED_IN_EFFECTD:
            edited = answer is Answer.EDITED

            def gate(context: ToolCallHookContext) -> bool:
                """CrewAI's approval gate says yes (with other arguments)."""
                if edited:
                    context.tool_input["item"] = "edited"
                return True

            register_before_tool_call_hook(gate)
        return _kickoff(agent)


DRIVER = CrewAIDriver()
