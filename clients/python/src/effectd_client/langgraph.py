"""LangGraph tool calls through the ledger: `LedgeredToolCalls`.

Install with `pip install effectd-client[langgraph]`; `import effectd_client`
alone never imports LangGraph. `LedgeredToolCalls` is a `ToolNode` tool-call
wrapper (`wrap_tool_call` / `awrap_tool_call`): every call of the node's tools
runs through the safe call, keyed by the graph run's thread id (the run id)
and the model's tool call id (the call id), with the effect the operator's
`ToolPolicy` gives the tool (SIDE_EFFECT when it says nothing):

  committed before (same call id)     -> its stored output (the same
    (a resumed graph re-runs the          ToolMessage or Command); the tool is
    tools node from its start)            not called
  the tool returns                    -> committed, then handed on
  ToolNode turns a failure into an    -> committed as an error result
    error ToolMessage                     (LANGGRAPH_TOOL_ERROR), replayed as
                                          the same message
  the tool raises                     -> committed ERROR, or UNKNOWN when it
                                          cannot know whether it acted (the
                                          safe call's rules); re-raised
  the policy requires approval        -> `interrupt()` with an approval
                                          request; resumed with `approve()` or
                                          `reject()` of it, the decision is
                                          recorded in effectd, bound to the
                                          call's arguments and revision
  a SIDE_EFFECT of unknown outcome    -> `interrupt()` with a reconcile
    (the process died mid-call)           request: never run again; an
                                          operator reconciles it in effectd,
                                          then the graph is resumed
  a READ / IDEMPOTENT_WRITE of        -> `interrupt()` with a retry request;
    unknown outcome                       `retry()` of it runs it again
  rejected by an approver             -> an error ToolMessage for the model
  another attempt holds a live lease  -> waits for it to end (a crashed
                                          process's lease runs out), at most
                                          `in_progress_wait` seconds, then an
                                          `interrupt()`: resumed, it waits
                                          again

The call ids are the model's, kept in the graph's checkpoint: the graph must
checkpoint the model's message before its tools run, so the wrapper refuses
to run in a graph whose durability is not "sync" (`DurabilityError`; a model
called again after a crash would name its calls anew). Tool call ids must be
unique in a thread, as ToolNode's own answers assume.

    ledger = LedgeredToolCalls(Client(target), policy=POLICY)
    builder.add_node("tools", ledger.tool_node([book, search]))
    graph = builder.compile(checkpointer=saver)
    graph.invoke(inputs, {"configurable": {"thread_id": "trip-7"}},
                 durability="sync")
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command, interrupt

from effectd_client import (
    ApprovalPending,
    AsyncClient,
    AsyncRun,
    CallInProgress,
    CallRejected,
    Client,
    Effect,
    InvalidTransition,
    ReconciliationNeeded,
    RetryRequired,
    RevisionConflict,
    Run,
    ToolFailed,
)
from effectd_client._langgraph_parts import (
    KIND,
    TOOL_ERROR,
    ApprovalMismatch,
    GraphToolCall,
    ToolErrorMessage,
    approve,
    asks_retry,
    decision,
    decision_in,
    reject,
    rejected_message,
    request,
    restored,
    retry,
    stored,
    stored_error,
    thread_run_id,
)
from effectd_client.policy import PolicyError, ToolDecision, ToolPolicy, ToolRule

__all__ = [
    "KIND",
    "TOOL_ERROR",
    "ApprovalMismatch",
    "DurabilityError",
    "LedgeredToolCalls",
    "PolicyError",
    "ToolDecision",
    "ToolPolicy",
    "ToolRule",
    "approve",
    "reject",
    "retry",
    "thread_run_id",
]

Output = ToolMessage | Command[Any]
# Runs kept for their lease watchers, by run id (least recently used dropped).
MAX_RUNS = 256
# Interrupts a call may be resumed from in one node run, and the pause
# between looks at a call another attempt holds: bounded loops.
MAX_ROUNDS = 50
IN_PROGRESS_POLL = 0.2
_DURABILITY = "__pregel_durability"


class DurabilityError(RuntimeError):
    """The graph runs with a durability other than "sync": the model's tool
    calls might not be checkpointed before the tools run, and a model called
    again after a crash would give them new ids."""


class LedgeredToolCalls:
    """A ToolNode wrapper that runs every tool call through the ledger.

    Args:
        client: The connection to effectd: a `Client` for graphs run with
            `invoke`/`stream`, an `AsyncClient` for `ainvoke`/`astream`.
        policy: The operator's `ToolPolicy` (or its rules by tool name: a
            `ToolRule` or an `Effect`); None: every tool a SIDE_EFFECT
            without approval. A rule's `retry_unknown=True` runs a READ or
            IDEMPOTENT_WRITE of unknown outcome again without asking; by
            default an interrupt asks a human.
        run_id: The run id of a graph run's config; default its thread id.
        approver: The connection that records decisions given as resume
            values (an approver's credential when effectd checks tokens);
            default `client`.
        lease_ms: The lease of each attempt (0: the daemon's default).
        timeout: Seconds a tool may run; past it the outcome is unknown.
        in_progress_wait: Seconds to wait for another attempt's lease to end
            (a crashed process's) before interrupting.
        require_sync_durability: Refuse graphs run with durability other
            than "sync" (see the module docs).
    """

    def __init__(
        self,
        client: Client | AsyncClient,
        *,
        policy: ToolPolicy | Mapping[str, ToolRule | Effect] | None = None,
        run_id: Callable[[RunnableConfig], str] = thread_run_id,
        approver: Client | AsyncClient | None = None,
        lease_ms: int = 0,
        timeout: float | None = None,
        in_progress_wait: float = 120.0,
        require_sync_durability: bool = True,
    ) -> None:
        if approver is not None and isinstance(approver, AsyncClient) != isinstance(
            client, AsyncClient
        ):
            raise TypeError("client and approver: both sync, or both async")
        self.client, self.approver = client, approver or client
        self.policy = ToolPolicy.of(policy)
        self.run_id, self.lease_ms, self.timeout = run_id, lease_ms, timeout
        self.in_progress_wait = in_progress_wait
        self.require_sync_durability = require_sync_durability
        self._runs: OrderedDict[str, Run | AsyncRun] = OrderedDict()

    def tool_node(
        self, tools: Sequence[BaseTool | Callable[..., Any]], **kwargs: Any
    ) -> ToolNode:
        """A `ToolNode` of `tools` wrapped by this ledger (more ToolNode
        arguments by keyword)."""
        if isinstance(self.client, AsyncClient):
            return ToolNode(
                tools,
                wrap_tool_call=self._sync_refused,
                awrap_tool_call=self.awrap,
                **kwargs,
            )
        return ToolNode(tools, wrap_tool_call=self, **kwargs)

    def identify(self, req: ToolCallRequest) -> GraphToolCall:
        """The ledger's identity of a request, and its policy decision."""
        config = req.runtime.config
        if self.require_sync_durability:
            durability = (config.get("configurable") or {}).get(_DURABILITY, "async")
            if durability != "sync":
                raise DurabilityError(
                    f"the graph runs with durability={durability!r}: run it with "
                    "durability='sync', so that the model's tool calls are "
                    "checkpointed before they run"
                )
        tc = req.tool_call
        if not tc.get("id"):
            raise ValueError(f"the call of {tc['name']!r} has no tool call id")
        return GraphToolCall(
            self.run_id(config),
            str(tc["id"]),
            tc["name"],
            dict(tc["args"]),
            self.policy.decide(tc["name"]),
        )

    def _run(self, run_id: str) -> Any:
        run = self._runs.get(run_id)
        if run is None:
            if isinstance(self.client, AsyncClient):
                run = AsyncRun(self.client, run_id, lease_ms=self.lease_ms)
            else:
                run = Run(self.client, run_id, lease_ms=self.lease_ms)
            self._runs[run_id] = run
            while len(self._runs) > MAX_RUNS:
                self._runs.popitem(last=False)
        self._runs.move_to_end(run_id)
        return run

    def _rounds(self) -> range:
        """The looks at a call one node run takes at most: the interrupts it
        is resumed from, and the polls while another attempt holds it."""
        polls = math.ceil(self.in_progress_wait / IN_PROGRESS_POLL)
        return range(MAX_ROUNDS + polls + 1)

    def _options(self, call: GraphToolCall, retry_unknown: bool) -> dict[str, Any]:
        return {
            "call_id": call.call_id,
            "effect": call.decision.effect,
            "require_approval": call.decision.require_approval,
            "retry_unknown": retry_unknown or call.decision.retry_unknown is True,
            "timeout": self.timeout,
            # A tool that interrupts itself may have acted before it asked.
            "unknown_on": (GraphBubbleUp,),
            "serialize": stored,
        }

    # -- sync ---------------------------------------------------------------

    def __call__(
        self, req: ToolCallRequest, execute: Callable[[ToolCallRequest], Output]
    ) -> Output:
        """The `wrap_tool_call` of a ToolNode (graphs run with `invoke`)."""
        if not isinstance(self.client, Client):
            self._sync_refused(req, execute)
        call = self.identify(req)
        run: Run = self._run(call.run_id)
        retry_unknown, waiting_until = False, 0.0
        for _ in self._rounds():
            try:
                return self._once(run, call, req, execute, retry_unknown)
            except ApprovalPending as stop:
                answer = interrupt(request("approval", call, stop.call))
                if decision_in(answer, call, stop.call):
                    self._decide(call, answer)
            except ReconciliationNeeded as stop:
                interrupt(request("reconcile", call, stop.call))
            except RetryRequired as stop:
                answer = interrupt(request("retry", call, stop.call))
                retry_unknown = asks_retry(answer, call, stop.call)
            except CallInProgress as stop:
                waiting_until = (
                    waiting_until or time.monotonic() + self.in_progress_wait
                )
                if time.monotonic() < waiting_until:
                    time.sleep(IN_PROGRESS_POLL)
                    continue
                # Never an error result: the model would call it anew.
                interrupt(request("in_progress", call, stop.call))
                waiting_until = 0.0
            except CallRejected as rejected:
                return rejected_message(call, rejected)
        raise RuntimeError(f"{call.call_id}: stopped after {len(self._rounds())} looks")

    def _once(
        self,
        run: Run,
        call: GraphToolCall,
        req: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Output],
        retry_unknown: bool,
    ) -> Output:
        try:
            with run.call(
                call.tool, call.arguments, **self._options(call, retry_unknown)
            ) as step:
                if not step.execute:
                    return restored(step.result, call)
                output = execute(req)
                if isinstance(output, ToolMessage) and output.status == "error":
                    raise ToolErrorMessage(output)
                step.set_result(output)
                return output
        except ToolErrorMessage as error:
            return error.message
        except ToolFailed as failed:
            return stored_error(call, failed)

    def _decide(self, call: GraphToolCall, answer: Any) -> None:
        assert isinstance(self.approver, Client)
        # Decided already (before a crash, or in effectd): the next look says.
        with suppress(InvalidTransition, RevisionConflict):
            self.approver.decide_approval(call.run_id, call.call_id, **decision(answer))

    def _sync_refused(self, req: ToolCallRequest, execute: Any) -> Output:
        raise TypeError(
            "this ledger has an AsyncClient: run the graph with ainvoke/astream "
            "(a sync run would call the tools without the ledger)"
        )

    # -- async --------------------------------------------------------------

    async def awrap(
        self,
        req: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Awaitable[Output]],
    ) -> Output:
        """The `awrap_tool_call` of a ToolNode (graphs run with `ainvoke`)."""
        if not isinstance(self.client, AsyncClient):
            raise TypeError(
                "awrap needs an AsyncClient; a sync Client wraps with wrap_tool_call"
            )
        call = self.identify(req)
        run: AsyncRun = self._run(call.run_id)
        retry_unknown, waiting_until = False, 0.0
        for _ in self._rounds():
            try:
                return await self._aonce(run, call, req, execute, retry_unknown)
            except ApprovalPending as stop:
                answer = interrupt(request("approval", call, stop.call))
                if decision_in(answer, call, stop.call):
                    await self._adecide(call, answer)
            except ReconciliationNeeded as stop:
                interrupt(request("reconcile", call, stop.call))
            except RetryRequired as stop:
                answer = interrupt(request("retry", call, stop.call))
                retry_unknown = asks_retry(answer, call, stop.call)
            except CallInProgress as stop:
                waiting_until = (
                    waiting_until or time.monotonic() + self.in_progress_wait
                )
                if time.monotonic() < waiting_until:
                    await asyncio.sleep(IN_PROGRESS_POLL)
                    continue
                # Never an error result: the model would call it anew.
                interrupt(request("in_progress", call, stop.call))
                waiting_until = 0.0
            except CallRejected as rejected:
                return rejected_message(call, rejected)
        raise RuntimeError(f"{call.call_id}: stopped after {len(self._rounds())} looks")

    async def _aonce(
        self,
        run: AsyncRun,
        call: GraphToolCall,
        req: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Awaitable[Output]],
        retry_unknown: bool,
    ) -> Output:
        try:
            async with run.call(
                call.tool, call.arguments, **self._options(call, retry_unknown)
            ) as step:
                if not step.execute:
                    return restored(step.result, call)
                output = await execute(req)
                if isinstance(output, ToolMessage) and output.status == "error":
                    raise ToolErrorMessage(output)
                step.set_result(output)
                return output
        except ToolErrorMessage as error:
            return error.message
        except ToolFailed as failed:
            return stored_error(call, failed)

    async def _adecide(self, call: GraphToolCall, answer: Any) -> None:
        assert isinstance(self.approver, AsyncClient)
        with suppress(InvalidTransition, RevisionConflict):
            await self.approver.decide_approval(
                call.run_id, call.call_id, **decision(answer)
            )
