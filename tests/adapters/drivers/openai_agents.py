"""The OpenAI Agents SDK driver: an `Agent` of a scripted `Model` (the
script's calls as `function_call` items, no network) and the function tool
`book`, wrapped by `AgentLedger.tool` under `ledger.run(run_id)`; the
control is the bare function tool. The run's `RunState` is serialized to the
work directory at each interruption (`result.to_state().to_string()`) and a
run resumes from it in any process (`RunState.from_string`, then
`ledger.apply_decisions`); a run killed before any interruption has no
RunState and is started again under the same run id, with the same
transcript (the model's answers follow from what it is given, so its call
ids are the same: the ledger's key).

A pause is the SDK's own approval interruption (`result.interruptions`), or
a `LedgerInterruption`: every call its `calls` names (UNKNOWN: reconcile;
AWAITING_APPROVAL: approve); a call still in a killed attempt's lease is
resumed again once the lease is out. An approval given in the SDK alone is
`RunState.approve`; an edited one is `ledger.approve` of the item with
other arguments. The SDK re-runs a finished step only by running the run
again (a RunState resumes from an interruption; there is no time travel):
a finished step runs again from the run's original input."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from agents import (
    Agent as SdkAgent,
)
from agents import (
    FunctionTool,
    ModelResponse,
    Runner,
    RunState,
    ToolApprovalItem,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from agents.models.interface import Model
from agents.testing import assistant_message, function_call

from effectd_client import AsyncClient, State
from effectd_client.contrib.openai_agents import (
    AgentLedger,
    ApprovalMismatch,
    LedgerInterruption,
    ToolPolicy,
)
from tests.adapters import world
from tests.adapters.drivers.base import Agent, Answer, Outcome, Paused, PauseKind

set_tracing_disabled(True)  # no trace export (no OpenAI key, no network)

STATE = "runstate.json"
POLICY = '[tools.book]\neffect = "side-effect"\n'
APPROVAL = POLICY + "require_approval = true\n"
# Resumes of a run waiting for a killed attempt's lease, this far apart.
WAITS, WAIT_SECONDS = 40, 0.25
KINDS = {
    State.UNKNOWN: PauseKind.RECONCILE,
    State.AWAITING_APPROVAL: PauseKind.APPROVAL,
}

# What a resume does to the restored RunState before the run goes on.
Decide = Callable[[AgentLedger, RunState[Any, Any]], Awaitable[None]]


class ScriptModel(Model):
    """The scripted model: the n-th turn of the script for the n-th answer
    (a turn is answered once the input holds its calls), then the final text
    of every tool output it was given."""

    def __init__(self, agent: Agent, client: AsyncClient) -> None:
        self.agent, self.client = agent, client

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        agent = self.agent
        items = (
            [i for i in input if isinstance(i, dict)] if isinstance(input, list) else []
        )
        called = {i.get("call_id") for i in items if i.get("type") == "function_call"}
        seen = {
            str(i["call_id"]): str(i["output"])
            for i in items
            if i.get("type") == "function_call_output"
        }
        turn = sum(any(c.call_id in called for c in t) for t in agent.script)
        if agent.before_turn is not None:
            stepped = agent.before_turn(self.client)
            if inspect.isawaitable(stepped):
                await stepped
        world.model_turn(agent.workdir, turn, answered=False)
        if turn < len(agent.script):
            output: list[Any] = [
                function_call("book", {"item": c.item}, call_id=c.call_id)
                for c in agent.script[turn]
            ]
        else:
            order = [c.call_id for t in agent.script for c in t]
            output = [
                assistant_message(
                    world.final_text([seen[c] for c in order if c in seen])
                )
            ]
        world.model_turn(agent.workdir, turn, answered=True)
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the driver runs the agent unstreamed")


def _tool(agent: Agent) -> FunctionTool:
    workdir = agent.workdir

    # failure_error_function=None: an exception reaches the ledger.
    @function_tool(failure_error_function=None)
    async def book(item: str) -> str:
        """Books an item (the side effect); in a thread, so that parallel
        calls held in it do not hold the event loop."""
        return await asyncio.to_thread(world.book, workdir, item)

    return book


def _stopped(agent: Agent, stop: LedgerInterruption) -> Outcome:
    """Every call the interruption names; a call in a live lease (no human
    to ask yet) is a pause of another kind: the run is resumed again."""
    items = {c.call_id: c.item for t in agent.script for c in t}
    calls = stop.calls or ((stop.call,) if stop.call is not None else ())
    paused = tuple(
        Paused(
            c.call_id,
            KINDS.get(c.state, PauseKind.OTHER),
            {"item": items.get(c.call_id, "")},
            stop,
        )
        for c in calls
    )
    return Outcome(paused or (Paused("", PauseKind.OTHER, {}, stop),))


def _approvals(result: Any) -> Outcome:
    return Outcome(
        tuple(
            Paused(
                str(item.call_id),
                PauseKind.APPROVAL,
                json.loads(item.arguments or "{}"),
                item,
            )
            for item in result.interruptions
        )
    )


class OpenAIAgentsDriver:
    def __init__(self) -> None:
        self.name = "openai_agents"
        self.not_applicable: dict[world.Scenario, str] = {}

    async def _run(self, agent: Agent, decide: Decide | None = None) -> Outcome:
        saved = agent.workdir / STATE
        async with AsyncClient(agent.target) as client:
            policy = ToolPolicy.from_toml(APPROVAL if agent.approval else POLICY)
            ledger = AgentLedger(client, policy=policy, lease_ms=1000)
            book = _tool(agent)
            sdk_agent: SdkAgent[Any] = SdkAgent(
                name="booker",
                model=ScriptModel(agent, client),
                tools=[ledger.tool(book) if agent.wrapped else book],
            )
            with ledger.run(agent.run_id):
                try:
                    if saved.exists():
                        state = await RunState.from_string(sdk_agent, saved.read_text())
                        if agent.wrapped:
                            await ledger.apply_decisions(state)
                        if decide is not None:
                            await decide(ledger, state)
                        result = await Runner.run(sdk_agent, state)
                    else:
                        result = await Runner.run(sdk_agent, "book")
                except LedgerInterruption as stop:
                    return _stopped(agent, stop)
        if result.interruptions:
            saved.write_text(result.to_state().to_string())
            return _approvals(result)
        return Outcome(final=str(result.final_output))

    def run(self, agent: Agent) -> Outcome:
        """A call waiting for a killed attempt's lease is resumed again once
        the lease is out."""
        for _ in range(WAITS):
            out = asyncio.run(self._run(agent))
            if not out.paused or any(p.kind is not PauseKind.OTHER for p in out.paused):
                return out
            time.sleep(WAIT_SECONDS)
        return out

    def restart(self, agent: Agent) -> None:
        (agent.workdir / STATE).unlink(missing_ok=True)

    def replay_step(self, agent: Agent) -> Outcome:
        self.restart(agent)
        return self.run(agent)

    def answer(self, agent: Agent, paused: Paused, answer: Answer) -> Outcome:
        if answer is Answer.DECIDED_IN_EFFECTD:
            return self.run(agent)
        if answer is Answer.FRAMEWORK_ONLY:

            async def sdk_only(ledger: AgentLedger, state: RunState[Any, Any]) -> None:
                for item in state.get_interruptions():
                    state.approve(item)

            return asyncio.run(self._run(agent, sdk_only))

        async def edited(ledger: AgentLedger, state: RunState[Any, Any]) -> None:
            [item] = state.get_interruptions()
            raw = item.raw_item
            args = json.dumps({"item": "edited"})
            shown: Any = (
                {**raw, "arguments": args}
                if isinstance(raw, dict)
                else raw.model_copy(update={"arguments": args})
            )
            changed: ToolApprovalItem = dataclasses.replace(item, raw_item=shown)
            await ledger.approve(changed, approver="ann", state=state)

        with contextlib.suppress(ApprovalMismatch):
            # Refused before anything is decided; resumed, it is asked again.
            return asyncio.run(self._run(agent, edited))
        return self.run(agent)


DRIVER = OpenAIAgentsDriver()
