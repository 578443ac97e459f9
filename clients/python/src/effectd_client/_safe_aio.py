"""The safe tool call: the whole ADR-010 protocol around one tool function.

`Run(client, run_id)` names an agent run; `run.call(...)` is a context manager
and `run.tool(...)` a decorator that prepare and start the call, replay a
committed result without calling the tool, refuse (raise) when the ledger says
not to execute, pass the stable idempotency key to IDEMPOTENT_WRITE tools,
renew the attempt's lease while the tool runs, and commit the result, an error
result, or report the outcome unknown. `AsyncRun` does the same with an
`AsyncClient` and async tools.

Call ids are never random: either explicit (`tool.at("step-3")`) or
`"{tool_name}-{n}"`, the n-th call of that tool in this `Run` object, so a
restarted agent that replays the same steps asks for the same calls.

Outcomes of the tool, as the ledger records them:
  returns any value                         -> committed OK: `serialize(value)`,
                                               else JSON, else the fallback
                                               of `_safe_outcomes.jsonable`
  raises an unknown outcome (see            -> ReportUnknown, re-raised
    `_safe_outcomes.is_unknown`: timeouts,
    connection and transport errors, a
    cancelled task, `unknown_on=`)
  runs past `timeout`                       -> ReportUnknown, ToolTimedOut
  raises any other Exception                -> committed ERROR (code = class
                                               name, or `error_code` attribute;
                                               payload: its `error_result`)
  KeyboardInterrupt, SystemExit             -> left STARTED: a crash; its
                                               lease runs out (Recover)

A recording request that fails transiently is sent again with the same
attempt (`Client.recording_retry`); an outcome that still cannot be recorded
raises `ResultNotRecorded` (an `OutcomeUnknown`), never a tool failure. A
result handed back to the agent (fresh or replayed, value or error) is then
acknowledged (AcknowledgeRecovery; a fresh one by its commit, in the same
transaction), which starts its retention window.

Written once, as `AsyncRun` (`effectd_client._safe_aio`); `Run`
(`effectd_client._safe`) is written from it by `clients/python/unasync.py`
at build time. Where
a thread does what the event loop does, the two differ: asyncio renews the
lease in a task and cancels the tool at the deadline (`asyncio.timeout`: the
tool sees `CancelledError` at its next await, and the call raises
`ToolTimedOut` once the attempt is reported unknown); the synchronous run
renews it from a watcher thread and runs a tool with a timeout in a worker
thread (`effectd_client._safe_threads`). Longer than the client's other
modules on purpose: the single source of both runs, each public method with
its docstring.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import Any, Generic

from effectd_client._aio import AsyncClient
from effectd_client._exceptions import (
    CallRejected,
    EffectdError,
    InvalidTransition,
    RetryRequired,
    ToolFailed,
    ToolTimedOut,
)
from effectd_client._recording import ONCE, RecordingRetry
from effectd_client._safe_base import (
    _CURRENT,
    KEY_PARAMETER,
    RETRY_REQUIRED,
    CallOptions,
    Next,
    P,
    R,
    RunBase,
    SafeCall,
    admit,
    asks_for_retry,
    check_started,
    check_tool,
    error_of,
    error_result_of,
    failure_not_recorded,
    input_of,
    renews_after,
    result_not_recorded,
    unknown_not_recorded,
    unrecorded_reason,
)
from effectd_client._safe_outcomes import (
    Matcher,
    bounded_text,
    encode_result,
    is_unknown,
)
from effectd_client._types import Channel, Effect, Prepared, RecoveryPlan, ToolCall

# unasync: sync-only
# from effectd_client._safe_threads import Watch, Watcher, within_deadline
# unasync: end


class AsyncRun(RunBase):
    """An agent run whose tool calls go through the ledger.

    Args:
        client: The connection to effectd.
        run_id: The run's id, part of every call's identity.
        lease_ms: The lease of each attempt (0: the daemon's default, 30 s).
        heartbeat_interval: Seconds between lease renewals while a tool
            runs; None: a third of the lease granted; 0: never.
        acknowledge: Acknowledge each result once it is handed back to the
            agent (AcknowledgeRecovery), which starts its retention window.
    """

    def __init__(
        self,
        client: AsyncClient,
        run_id: str,
        *,
        lease_ms: int = 0,
        heartbeat_interval: float | None = None,
        acknowledge: bool = True,
    ) -> None:
        super().__init__(run_id, lease_ms, heartbeat_interval, acknowledge)
        self.client = client
        # unasync: sync-only
        # self._watcher = Watcher()
        # unasync: end

    async def resume(self) -> RecoveryPlan:
        """Reads the run's recovery plan; raises if the run is interrupted.

        Committed calls are then replayed by the next call with their id (and
        acknowledged when its block ends without error). A result acknowledged
        before is ALREADY_DELIVERED in the plan, and its replay says
        `SafeCall.delivered`: a transcript that survived has it. EXECUTE and
        RETRY_NEEDS_POLICY items run as usual.
        """
        return self._take_plan(await self.client.recover(self.run_id))

    def call(
        self,
        tool_name: str,
        input: Any,
        *,
        call_id: str | None = None,
        effect: Effect = Effect.SIDE_EFFECT,
        retry_unknown: bool = False,
        raw: bool = False,
        require_approval: bool = False,
        timeout: float | None = None,
        unknown_on: Iterable[Matcher] = (),
        definite_on: Iterable[Matcher] = (),
        serialize: Callable[[Any], Any] | None = None,
        channel: Channel = Channel.TOOL,
    ) -> AbstractAsyncContextManager[SafeCall]:
        """Prepares and starts the call; commits or reports it at the end.

        Args:
            tool_name: The tool, part of the call's identity check.
            input: The tool's input (JSON value, or bytes), fingerprinted.
            call_id: The step's id; `{tool_name}-{n}` when None.
            effect: What the tool does to the world (ADR-010 D2).
            retry_unknown: Start a READ or IDEMPOTENT_WRITE whose last
                attempt ended unknown again (StartTool with retry).
            raw: The result is bytes, committed and replayed as sent.
            require_approval: The call waits for an approver first.
            timeout: Seconds the tool may run. The block sees `deadline` and
                `cancelled`; the decorator raises `ToolTimedOut` at the
                deadline (the asyncio block is cancelled at it). The outcome
                is then reported unknown.
            unknown_on: Exception classes or predicates that mean the tool
                cannot know whether it acted (reported unknown).
            definite_on: Exception classes or predicates that are definite
                failures (committed as errors) although the default
                classification would say unknown; `unknown_on` wins.
            serialize: Turns the result into the JSON value (or bytes) to
                commit; without it, what JSON cannot say is encoded by the
                fallback of `effectd_client._safe_outcomes.jsonable`.
            channel: How the agent reaches the tool (part of the call's
                identity); the daemon applies its retry rules (an MCP call
                of unknown outcome is never started again, ADR-010 D5).

        Yields:
            The call: run the tool only when `execute` is True, and hand its
            result to `set_result`; otherwise `result` is the stored one.

        Raises:
            ToolCallStopped: The ledger says not to run it (a subclass per
                decision), or the stored result is an error (`ToolFailed`).
            ResultNotRecorded: The tool ran; the ledger could not record it.
            EffectdError: The daemon refused a request.
        """
        options = CallOptions(
            effect,
            retry_unknown,
            raw,
            require_approval,
            timeout,
            tuple(unknown_on),
            tuple(definite_on),
            serialize,
            channel,
        )
        return self._step(tool_name, input, call_id, options)

    @asynccontextmanager
    async def _step(
        self,
        tool_name: str,
        input: Any,
        call_id: str | None,
        o: CallOptions,
        *,
        enforced: bool = False,
    ) -> AsyncIterator[SafeCall]:
        """The protocol around one block; `enforced`: the caller itself ends
        the tool at the deadline (else `cancelled` is set when it passes; the
        asyncio block is cancelled at it either way)."""
        call_id = call_id or self.next_call_id(tool_name)
        c = self.client
        try:
            p = await c.prepare_tool(
                self.run_id,
                call_id,
                tool_name,
                input,
                effect=o.effect,
                require_approval=o.require_approval,
                start=True,
                lease_ms=self.lease_ms,
                retry=o.retry_unknown,
                channel=o.channel,
            )
        except InvalidTransition as exc:
            if not asks_for_retry(exc):
                raise
            call = await c.get_tool_call(self.run_id, call_id)
            raise RetryRequired(RETRY_REQUIRED, call) from None
        try:
            step = admit(p, retry_unknown=o.retry_unknown)
        except (ToolFailed, CallRejected):
            await self._acknowledge(p.call)  # the error result reaches the agent
            raise
        if step is Next.REPLAY:
            yield self._replay(p, call_id, o)
            # Once the block used it: an agent that dies inside gets
            # REPLAY_RESULT again, not ALREADY_DELIVERED.
            await self._acknowledge(p.call)
            return
        if step is not Next.EXECUTE:
            p = await c.start_tool(
                self.run_id,
                call_id,
                retry=step is Next.RETRY,
                lease_ms=self.lease_ms,
            )
            check_started(p)
        scope = self._scope(p, call_id, o)
        token = _CURRENT.set(scope)
        # unasync: async-only
        interval = self._interval(p)
        beat = asyncio.create_task(self._beat(scope, interval)) if interval else None
        timer = asyncio.timeout(o.timeout)
        # unasync: sync-only
        # watch = Watch(
        #     self._watcher,
        #     c,
        #     scope,
        #     self._interval(p),
        #     self.lease_ms,
        #     signal_deadline=not enforced,
        # )
        # unasync: end
        try:
            try:
                # unasync: async-only
                async with timer:
                    yield scope
                # unasync: sync-only
                # yield scope
                # unasync: end
            # unasync: async-only
            except TimeoutError as exc:
                if not timer.expired():
                    raise
                scope.cancelled.set()
                raise ToolTimedOut(
                    f"{tool_name} did not finish within {o.timeout} s"
                ) from exc
            # unasync: end
            finally:
                # unasync: async-only
                if beat is not None:
                    beat.cancel()
                    await asyncio.wait([beat])
                # unasync: sync-only
                # watch.stop()
                # unasync: end
                _CURRENT.reset(token)
        except (Exception, asyncio.CancelledError) as exc:
            await self._failed(p, scope, exc, o)
            raise
        await self._succeeded(p, scope, o)

    # unasync: async-only
    async def _beat(self, scope: SafeCall, interval: float) -> None:
        """Renews the lease until cancelled or refused (see `_safe_threads.Watch`)."""
        retry = RecordingRetry(deadline=max(1.0, interval))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.client.heartbeat(
                    scope.run_id,
                    scope.call_id,
                    scope.attempt,
                    self.lease_ms,
                    retry=retry,
                )
            except EffectdError as refusal:
                if not renews_after(refusal):
                    return
            except Exception:  # a closed client ends the renewals
                return

    # unasync: end
    async def _failed(
        self, p: Prepared, scope: SafeCall, exc: BaseException, o: CallOptions
    ) -> None:
        c = self.client
        if is_unknown(exc, o.unknown_on, o.definite_on):
            try:
                await c.report_unknown(
                    self.run_id, scope.call_id, scope.attempt, bounded_text(repr(exc))
                )
            except EffectdError as refusal:
                exc.add_note(unknown_not_recorded(refusal))
            return
        code, message = error_of(exc)
        try:
            done = await c.commit_tool(
                self.run_id,
                scope.call_id,
                scope.attempt,
                error_result_of(exc),
                error_code=code,
                error_message=message,
                acknowledge=self.acknowledge,
            )
        except EffectdError as refusal:
            await self._unrecorded(scope, refusal)
            raise failure_not_recorded(p, code, exc) from refusal
        await self._acknowledge(done)

    async def _succeeded(self, p: Prepared, scope: SafeCall, o: CallOptions) -> None:
        try:
            value = encode_result(scope.result, o.serialize, o.raw)
            # The result is handed back right after: acknowledged with the
            # commit, one durable write instead of two.
            done = await self.client.commit_tool(
                self.run_id,
                scope.call_id,
                scope.attempt,
                value,
                acknowledge=self.acknowledge,
            )
        except Exception as exc:
            await self._unrecorded(scope, exc)
            raise result_not_recorded(p, scope.result) from exc
        await self._acknowledge(done)

    async def _unrecorded(self, scope: SafeCall, cause: Exception) -> None:
        """One last try to leave the reason in the ledger, as UNKNOWN."""
        reason = unrecorded_reason(cause)
        with suppress(EffectdError):
            await self.client.report_unknown(
                self.run_id, scope.call_id, scope.attempt, reason, retry=ONCE
            )

    async def _acknowledge(self, call: ToolCall) -> None:
        if not self.acknowledge or call.acknowledged:
            return
        # A lost acknowledgement only delays the retention window.
        with suppress(EffectdError):
            await self.client.acknowledge_recovery(self.run_id, [call.call_id])

    def tool(
        self,
        name: str | None = None,
        *,
        effect: Effect = Effect.SIDE_EFFECT,
        retry_unknown: bool = False,
        raw: bool = False,
        require_approval: bool = False,
        timeout: float | None = None,
        unknown_on: Iterable[Matcher] = (),
        definite_on: Iterable[Matcher] = (),
        serialize: Callable[[Any], Any] | None = None,
    ) -> Callable[[Callable[P, Awaitable[R]]], AsyncSafeTool[P, R]]:
        """Decorates a tool function; IDEMPOTENT_WRITE tools get `idempotency_key`.

        The input recorded is the function's bound arguments (JSON); a
        replayed result is the stored, JSON-decoded value (bytes with `raw`).
        The options are those of `call`; with `timeout` an async function is
        cancelled at the deadline; a synchronous one runs in a worker thread,
        and at the deadline the call raises `ToolTimedOut` while the thread is
        left to finish (`current_call().cancelled` is set: a tool should
        return when it sees it).
        """

        def wrap(fn: Callable[P, Awaitable[R]]) -> AsyncSafeTool[P, R]:
            options = CallOptions(
                effect,
                retry_unknown,
                raw,
                require_approval,
                timeout,
                tuple(unknown_on),
                tuple(definite_on),
                serialize,
            )
            check_tool(fn, options)
            return AsyncSafeTool(self, fn, name or fn.__name__, options)

        return wrap


class AsyncSafeTool(Generic[P, R]):
    """A tool function run through its run's `call`; see its `tool`."""

    def __init__(
        self,
        run: AsyncRun,
        fn: Callable[P, Awaitable[R]],
        name: str,
        options: CallOptions,
    ) -> None:
        self.run, self.fn, self.name, self.options = run, fn, name, options
        self._signature = inspect.signature(fn)
        functools.update_wrapper(self, fn)

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Runs the next step of this tool (call id `{name}-{n}`)."""
        return await self.at(self.run.next_call_id(self.name))(*args, **kwargs)

    def at(self, call_id: str) -> Callable[P, Awaitable[R]]:
        """The tool bound to an explicit call id."""

        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            o = self.options
            async with self.run._step(
                self.name,
                input_of(self.fn, args, kwargs, o, self._signature),
                call_id,
                o,
                enforced=True,
            ) as step:
                if not step.execute:
                    return step.result  # type: ignore[no-any-return]
                if o.effect is Effect.IDEMPOTENT_WRITE:
                    kwargs[KEY_PARAMETER] = step.idempotency_key
                # unasync: async-only
                value = await self.fn(*args, **kwargs)
                # unasync: sync-only
                # value = within_deadline(self.fn, step, self.name, *args, **kwargs)
                # unasync: end
                step.set_result(value)
                return value

        return call
