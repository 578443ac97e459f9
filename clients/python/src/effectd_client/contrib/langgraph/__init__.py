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
  the policy requires approval        -> an approval request: `approve()` or
                                          `reject()` of it, recorded in effectd,
                                          bound to the call's arguments
  a SIDE_EFFECT of unknown outcome    -> a reconcile request: never run
    (the process died mid-call)           again; an operator reconciles it
  a READ / IDEMPOTENT_WRITE of        -> a retry request; `retry()` of it
    unknown outcome                       runs it again
  rejected by an approver             -> an error ToolMessage for the model
  another attempt holds a live lease  -> waits for it, at most
                                          `in_progress_wait` seconds, then an
                                          in-progress request

A request is the value of an `interrupt()` of the tools node; it names, in
`calls`, every call of the same model message that waits for a human, so
that one resume answers them all (a list of answers; `_step`).
An answer that fits no call waiting (another call, other arguments than
effectd recorded) is refused: the node asks again, saying why (`refused`).

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
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest

from effectd_client import AsyncClient, AsyncRun, Client, Effect, Run, ToolFailed
from effectd_client.contrib.langgraph._parts import (
    KIND,
    TOOL_ERROR,
    ApprovalMismatch,
    GraphToolCall,
    ToolErrorMessage,
    approve,
    call_options,
    decision,
    reject,
    restored,
    retry,
    stored_error,
    thread_run_id,
)
from effectd_client.contrib.langgraph._step import (
    IN_PROGRESS_POLL,
    Ask,
    Asking,
    Conduct,
    Decide,
    Done,
    Look,
    Once,
    Op,
    Output,
    Pause,
    Prepare,
    Steps,
    advance,
    conduct,
    siblings,
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

# Runs kept for their lease watchers, by run id (least recently used dropped).
MAX_RUNS = 256
# Interrupts a call may be resumed from in one node run: a bounded loop.
MAX_ROUNDS = 50
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
        self._steps = Steps(threads=not isinstance(client, AsyncClient))

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

    def _conduct(self, req: ToolCallRequest) -> tuple[GraphToolCall, Conduct]:
        """The call of a request, and what is to be done about it."""
        call = self.identify(req)
        step_calls = siblings(req, call, self.policy)
        step = self._steps.of(step_calls)
        rounds = self._rounds()
        return call, conduct(call, step_calls, step, rounds, self.in_progress_wait)

    def _thunk(self, op: Op, once: Callable[[bool], Any]) -> Callable[[], Any]:
        """What an op asks of the daemon (a value with a `Client`, an
        awaitable with an `AsyncClient`), the lock's ops aside."""
        client, approver = self.client, self.approver
        match op:
            case Once(retry_unknown=retry_unknown):
                return lambda: once(retry_unknown)
            case Pause(seconds=seconds):
                sleep = asyncio.sleep if isinstance(client, AsyncClient) else time.sleep
                return lambda: sleep(seconds)
            case Look(call=c):
                return lambda: client.get_tool_call(c.run_id, c.call_id)
            case Prepare(call=c):
                return lambda: client.prepare_tool(
                    c.run_id,
                    c.call_id,
                    c.tool,
                    c.arguments,
                    effect=c.decision.effect,
                    require_approval=c.decision.require_approval,
                )
            case Decide(call=c, answer=answer):
                return lambda: approver.decide_approval(
                    c.run_id, c.call_id, **decision(answer)
                )
        raise AssertionError(op)  # pragma: no cover

    # -- sync ---------------------------------------------------------------

    def __call__(
        self, req: ToolCallRequest, execute: Callable[[ToolCallRequest], Output]
    ) -> Output:
        """The `wrap_tool_call` of a ToolNode (graphs run with `invoke`)."""
        if not isinstance(self.client, Client):
            self._sync_refused(req, execute)
        call, work = self._conduct(req)
        run: Run = self._run(call.run_id)

        def once(retry_unknown: bool) -> Output:
            return self._once(run, call, req, execute, retry_unknown)

        output: Output = self._drive(work, once)
        return output

    def _drive(self, work: Conduct | Asking, once: Callable[[bool], Any]) -> Any:
        answer, error, op = None, None, advance(work, None, None)
        while not isinstance(op, Done):
            try:
                if isinstance(op, Ask):
                    assert not isinstance(op.step.lock, asyncio.Lock)
                    with op.step.lock:
                        answer = self._drive(op.body, once)
                else:
                    answer = self._thunk(op, once)()
            except Exception as exc:
                answer, error = None, exc
            else:
                error = None
            op = advance(work, answer, error)
        return op.value

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
                call.tool,
                call.arguments,
                **call_options(call, retry_unknown, self.timeout),
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
        call, work = self._conduct(req)
        run: AsyncRun = self._run(call.run_id)

        def once(retry_unknown: bool) -> Awaitable[Output]:
            return self._aonce(run, call, req, execute, retry_unknown)

        output: Output = await self._adrive(work, once)
        return output

    async def _adrive(self, work: Conduct | Asking, once: Callable[[bool], Any]) -> Any:
        answer, error, op = None, None, advance(work, None, None)
        while not isinstance(op, Done):
            try:
                if isinstance(op, Ask):
                    assert isinstance(op.step.lock, asyncio.Lock)
                    async with op.step.lock:
                        answer = await self._adrive(op.body, once)
                else:
                    answer = await self._thunk(op, once)()
            except Exception as exc:
                answer, error = None, exc
            else:
                error = None
            op = advance(work, answer, error)
        return op.value

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
                call.tool,
                call.arguments,
                **call_options(call, retry_unknown, self.timeout),
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
