"""The safe tool call for asyncio: `AsyncRun`, the twin of `Run`.

The decisions, outcomes, options and call ids are those of
`effectd_client._safe` (shared code); the client calls are awaited, the
heartbeat is a task, and the deadline cancels the tool (`asyncio.timeout`):
the tool sees `CancelledError` at its next await, and the call raises
`ToolTimedOut` once the attempt is reported unknown.
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


class AsyncRun(RunBase):
    """`Run` for an `AsyncClient` and async tool functions."""

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

    async def resume(self) -> RecoveryPlan:
        """See `Run.resume`."""
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
        """See `Run.call`; here `timeout` cancels the block at the deadline."""
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
        self, tool_name: str, input: Any, call_id: str | None, o: CallOptions
    ) -> AsyncIterator[SafeCall]:
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
            await self._acknowledge(p.call)
            raise
        if step is Next.REPLAY:
            yield self._replay(p, call_id, o)
            # See `Run._step`: acknowledged once the block used it.
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
        interval = self._interval(p)
        beat = asyncio.create_task(self._beat(scope, interval)) if interval else None
        timer = asyncio.timeout(o.timeout)
        try:
            try:
                async with timer:
                    yield scope
            except TimeoutError as exc:
                if not timer.expired():
                    raise
                scope.cancelled.set()
                raise ToolTimedOut(
                    f"{tool_name} did not finish within {o.timeout} s"
                ) from exc
            finally:
                if beat is not None:
                    beat.cancel()
                    await asyncio.wait([beat])
                _CURRENT.reset(token)
        except (Exception, asyncio.CancelledError) as exc:
            await self._failed(p, scope, exc, o)
            raise
        await self._succeeded(p, scope, o)

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
            # See `Run._succeeded`: acknowledged with the commit.
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
        reason = unrecorded_reason(cause)
        with suppress(EffectdError):
            await self.client.report_unknown(
                self.run_id, scope.call_id, scope.attempt, reason, retry=ONCE
            )

    async def _acknowledge(self, call: ToolCall) -> None:
        if not self.acknowledge or call.acknowledged:
            return
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
        """See `Run.tool`; for async tool functions (cancelled at `timeout`)."""

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
    """An async tool function run through `AsyncRun.call`."""

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
            ) as step:
                if not step.execute:
                    return step.result  # type: ignore[no-any-return]
                if o.effect is Effect.IDEMPOTENT_WRITE:
                    kwargs[KEY_PARAMETER] = step.idempotency_key
                value = await self.fn(*args, **kwargs)
                step.set_result(value)
                return value

        return call
