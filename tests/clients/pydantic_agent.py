"""A Pydantic AI agent for the adapter's tests: a scripted model (FunctionModel,
no network) that calls `send` (a side effect), then `lookup` (a read), then
answers with what it saw.

Each tool appends one line to its counter file in the state directory (the
external system); a marker file `crash-{tool}` makes the tool kill its own
process with SIGKILL right after its effect, before it returns (only in a
child process: the test's own process never kills itself). The run persists
its message history after every step, as an application's checkpointer
would, and a run started again resumes from it.

The module-level `agent*` functions are what `crash_and_resume` runs, in a
spawned child first and in the test's process after.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset

from effectd_client import AsyncClient, Effect, current_call
from effectd_client.contrib.pydantic_ai import EffectdToolset

# A short lease: a crashed call's runs out quickly.
LEASE_MS = 300
HISTORY = "history.json"


def executions(state: Path, tool: str) -> list[str]:
    """The effects `tool` had on the external system, one line each."""
    counter = state / f"{tool}.count"
    return counter.read_text().splitlines() if counter.exists() else []


def _effect(state: Path, tool: str, what: str) -> int:
    with (state / f"{tool}.count").open("a") as counter:
        counter.write(what + "\n")
        counter.flush()
        os.fsync(counter.fileno())
    marker = state / f"crash-{tool}"
    if marker.exists() and multiprocessing.parent_process() is not None:
        marker.unlink()
        os.kill(os.getpid(), signal.SIGKILL)
    return len(executions(state, tool))


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The model: send, then lookup, then a text of every result it saw."""
    calls = {
        p.tool_name
        for m in messages
        if isinstance(m, ModelResponse)
        for p in m.parts
        if isinstance(p, ToolCallPart)
    }
    returns = {
        p.tool_name: p.model_response_str()
        for m in messages
        for p in getattr(m, "parts", ())
        if isinstance(p, ToolReturnPart)
    }
    if "send" not in calls:
        part = ToolCallPart("send", {"to": "ann"}, tool_call_id="tc-send")
        return ModelResponse(parts=[part])
    if "lookup" not in calls:
        part = ToolCallPart("lookup", {"city": "Oslo"}, tool_call_id="tc-lookup")
        return ModelResponse(parts=[part])
    return ModelResponse(parts=[TextPart(json.dumps(returns, sort_keys=True))])


def tools(
    state: Path, *, approval: bool = False, failing: bool = False, lost: bool = False
) -> FunctionToolset[None]:
    toolset: FunctionToolset[None] = FunctionToolset()

    @toolset.tool_plain(requires_approval=approval)
    async def send(to: str) -> str:
        """Sends a message (a side effect); `failing`: refused, after it
        reached the external system; `lost`: its answer lost on the way."""
        n = _effect(state, "send", to)
        call = current_call()  # the ledger's call, for an IDEMPOTENT_WRITE's key
        if call is not None and call.idempotency_key:
            (state / "send.key").write_text(call.idempotency_key)
        if lost:
            raise ConnectionResetError("the mail server hung up")
        if failing:
            raise ToolFailed(f"mailbox of {to} full (#{n})")
        return f"sent #{n} to {to}"

    @toolset.tool_plain
    async def lookup(city: str) -> str:
        """Looks the weather up (a read)."""
        _effect(state, "lookup", city)
        return f"{city}: sunny"

    return toolset


async def run_agent(
    target: str,
    state: Path,
    *,
    wrapped: bool = True,
    approval: bool = False,
    results: DeferredToolResults | None = None,
    approver: str | None = "pydantic-ai",
    deferred_output: bool = True,
    failing: bool = False,
    send_effect: Effect = Effect.SIDE_EFFECT,
    lost: bool = False,
    run_id: str | None = None,
) -> Any:
    """One run: from the persisted history when there is one, else from the
    prompt; the history saved after every step."""
    saved = state / HISTORY
    history = (
        ModelMessagesTypeAdapter.validate_json(saved.read_bytes())
        if (saved.exists())
        else None
    )
    async with AsyncClient(target) as effectd:
        toolset: AbstractToolset[None] = tools(
            state, approval=approval, failing=failing, lost=lost
        )
        if wrapped:
            toolset = EffectdToolset(
                toolset,
                client=effectd,
                policy={"lookup": Effect.READ, "send": send_effect},
                lease_ms=LEASE_MS,
                approver=approver,
                run_id=run_id,
            )
        agent = Agent(
            FunctionModel(script),
            toolsets=[toolset],
            output_type=[str, DeferredToolRequests] if deferred_output else str,
        )
        async with agent.iter(
            None if history else "go",
            message_history=history,
            deferred_tool_results=results,
        ) as run:
            async for _ in run:
                saved.write_bytes(
                    ModelMessagesTypeAdapter.dump_json(run.all_messages())
                )
            assert run.result is not None
            saved.write_bytes(ModelMessagesTypeAdapter.dump_json(run.all_messages()))
            return run.result.output


def agent(target: str, state: str) -> Any:
    """The agent with its tools wrapped by `EffectdToolset`."""
    return asyncio.run(run_agent(target, Path(state)))


def unwrapped_agent(target: str, state: str) -> Any:
    """Negative control: the same agent, Pydantic AI's own tool execution."""
    return asyncio.run(run_agent(target, Path(state), wrapped=False))


def approving_agent(target: str, state: str) -> Any:
    """The agent resumed with a Pydantic AI approval of the send call."""
    results = DeferredToolResults(approvals={"tc-send": True})
    return asyncio.run(run_agent(target, Path(state), approval=True, results=results))
