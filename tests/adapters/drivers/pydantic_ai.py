"""The Pydantic AI driver: an `Agent` of a `FunctionModel` (the script) and a
`FunctionToolset` of `book`, wrapped in `EffectdToolset`; the run's history
(`all_messages()`) saved in the work directory after every step, as an
application's checkpointer would, and a run resumed from it with
`resume_results(history)`. A pause is the run's `DeferredToolRequests`
output (approvals, and calls deferred with the ledger's facts). The toolset
has no approver name: an approval given in Pydantic AI alone records
nothing, only one decided in effectd counts. A finished step runs again
from the history cut after the model response that made its calls."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset

from effectd_client import AsyncClient, InputMismatch
from effectd_client.pydantic_ai import METADATA_KEY, EffectdToolset, ToolPolicy
from tests.adapters import world
from tests.adapters.drivers.base import Agent, Answer, Outcome, Paused, PauseKind

HISTORY = "history.json"
POLICY = '[tools.book]\neffect = "side-effect"\n'
# Resumes of a run deferred to wait for a lease, this far apart.
WAITS, WAIT_SECONDS = 40, 0.25
APPROVAL = POLICY + "require_approval = true\n"


def _model(agent: Agent, client: AsyncClient) -> FunctionModel:
    order = [c.call_id for turn in agent.script for c in turn]

    async def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        if agent.before_turn is not None:
            stepped = agent.before_turn(client)
            if inspect.isawaitable(stepped):
                await stepped
        world.model_turn(agent.workdir, turn, answered=False)
        if turn < len(agent.script):
            parts: list[Any] = [
                ToolCallPart("book", {"item": c.item}, tool_call_id=c.call_id)
                for c in agent.script[turn]
            ]
        else:
            seen = {
                p.tool_call_id: p.model_response_str()
                for m in messages
                for p in getattr(m, "parts", ())
                if isinstance(p, ToolReturnPart)
            }
            parts = [TextPart(world.final_text([seen[c] for c in order if c in seen]))]
        world.model_turn(agent.workdir, turn, answered=True)
        return ModelResponse(parts=parts)

    return FunctionModel(script)


def _toolset(agent: Agent, client: AsyncClient) -> AbstractToolset[None]:
    toolset: FunctionToolset[None] = FunctionToolset()
    workdir = agent.workdir

    @toolset.tool_plain
    async def book(item: str) -> str:
        """Books an item (the side effect); in a thread, so that parallel
        calls held in it do not hold the event loop."""
        return await asyncio.to_thread(world.book, workdir, item)

    if not agent.wrapped:
        return toolset
    return EffectdToolset(
        toolset,
        client=client,
        policy=ToolPolicy.from_toml(APPROVAL if agent.approval else POLICY),
        lease_ms=1000,
        approver=None,
        run_id=agent.run_id,
    )


def _outcome(output: Any) -> Outcome:
    if not isinstance(output, DeferredToolRequests):
        return Outcome(final=str(output))
    paused = []
    for part, shown in [(p, PauseKind.APPROVAL) for p in output.approvals] + [
        (p, PauseKind.OTHER) for p in output.calls
    ]:
        facts = output.metadata.get(part.tool_call_id, {}).get(METADATA_KEY, {})
        kind = PauseKind.RECONCILE if facts.get("action") == "reconcile" else shown
        paused.append(Paused(part.tool_call_id, kind, part.args_as_dict(), part))
    return Outcome(tuple(paused))


class PydanticAIDriver:
    def __init__(self) -> None:
        self.name = "pydantic_ai"
        self.not_applicable: dict[world.Scenario, str] = {}

    def _history(self, agent: Agent) -> list[ModelMessage] | None:
        saved = agent.workdir / HISTORY
        if not saved.exists():
            return None
        return list(ModelMessagesTypeAdapter.validate_json(saved.read_bytes()))

    def _save(self, agent: Agent, messages: list[ModelMessage]) -> None:
        data = ModelMessagesTypeAdapter.dump_json(messages)
        (agent.workdir / HISTORY).write_bytes(data)

    async def _run(self, agent: Agent, given: DeferredToolResults | None) -> Outcome:
        history = self._history(agent)
        async with AsyncClient(agent.target) as client:
            toolset = _toolset(agent, client)
            results = given
            if history and isinstance(toolset, EffectdToolset):
                results = await toolset.resume_results(history, given)
            framework = PydanticAgent(
                _model(agent, client),
                toolsets=[toolset],
                output_type=[str, DeferredToolRequests],
            )
            async with framework.iter(
                None if history else "book",
                message_history=history,
                deferred_tool_results=results,
            ) as run:
                async for _ in run:
                    self._save(agent, run.all_messages())
                assert run.result is not None
                self._save(agent, run.all_messages())
                return _outcome(run.result.output)

    def run(self, agent: Agent) -> Outcome:
        """A call deferred to wait (another attempt's lease, a killed
        process's, still live) is resumed again once the lease is out."""
        for _ in range(WAITS):
            out = asyncio.run(self._run(agent, None))
            if not out.paused or any(p.kind is not PauseKind.OTHER for p in out.paused):
                return out
            time.sleep(WAIT_SECONDS)
        return out

    def restart(self, agent: Agent) -> None:
        (agent.workdir / HISTORY).unlink(missing_ok=True)

    def replay_step(self, agent: Agent) -> Outcome:
        kept: list[ModelMessage] = []
        for message in self._history(agent) or []:
            kept.append(message)
            if isinstance(message, ModelResponse):
                break
        self._save(agent, kept)
        return self.run(agent)

    def answer(self, agent: Agent, paused: Paused, answer: Answer) -> Outcome:
        if answer is Answer.DECIDED_IN_EFFECTD:
            return self.run(agent)
        approval: Any = True
        if answer is Answer.EDITED:
            approval = ToolApproved(override_args={"item": "edited"})
        given = DeferredToolResults(approvals={paused.call_id: approval})
        try:
            return asyncio.run(self._run(agent, given))
        except InputMismatch:
            # Refused before anything ran: the run, resumed, asks again.
            return self.run(agent)


DRIVER = PydanticAIDriver()
