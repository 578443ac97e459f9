"""The safe tool call for asyncio: `AsyncRun`, the twin of `Run`.

The decisions, outcomes and call ids are those of `effectd_client._safe`
(shared code); only the client calls are awaited.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Generic

from effectd_client._aio import AsyncClient
from effectd_client._safe import (
    KEY_PARAMETER,
    UNKNOWN_OUTCOMES,
    CallOptions,
    Next,
    P,
    R,
    RunBase,
    SafeCall,
    admit,
    check_started,
    check_tool,
    decoded,
    error_of,
    input_of,
)
from effectd_client._types import Effect, RecoveryPlan


class AsyncRun(RunBase):
    """`Run` for an `AsyncClient` and async tool functions."""

    def __init__(self, client: AsyncClient, run_id: str, *, lease_ms: int = 0) -> None:
        super().__init__(run_id, lease_ms)
        self.client = client

    async def resume(self) -> RecoveryPlan:
        """See `Run.resume`."""
        return self._take_plan(await self.client.recover(self.run_id))

    @asynccontextmanager
    async def call(
        self,
        tool_name: str,
        input: Any,
        *,
        call_id: str | None = None,
        effect: Effect = Effect.SIDE_EFFECT,
        retry_unknown: bool = False,
        raw: bool = False,
        require_approval: bool = False,
    ) -> AsyncIterator[SafeCall]:
        """See `Run.call`."""
        call_id = call_id or self.next_call_id(tool_name)
        c = self.client
        p = await c.prepare_tool(
            self.run_id,
            call_id,
            tool_name,
            input,
            effect=effect,
            require_approval=require_approval,
            start=True,
            lease_ms=self.lease_ms,
        )
        step = admit(p, retry_unknown=retry_unknown)
        if step is Next.REPLAY:
            assert p.call.result is not None
            if call_id in self._replays:
                await c.acknowledge_recovery(self.run_id, [call_id])
                self._replays.discard(call_id)
            yield SafeCall(
                self.run_id,
                call_id,
                p.call.attempt,
                p.idempotency_key,
                False,
                decoded(p.call.result, raw),
            )
            return
        if step is not Next.EXECUTE:
            p = await c.start_tool(
                self.run_id,
                call_id,
                retry=step is Next.RETRY,
                lease_ms=self.lease_ms,
            )
            check_started(p)
        scope = self._scope(p, call_id, raw)
        try:
            yield scope
        except UNKNOWN_OUTCOMES as exc:
            await c.report_unknown(self.run_id, call_id, scope.attempt, repr(exc))
            raise
        except Exception as exc:
            code, message = error_of(exc)
            await c.commit_tool(
                self.run_id,
                call_id,
                scope.attempt,
                error_code=code,
                error_message=message,
            )
            raise
        await c.commit_tool(self.run_id, call_id, scope.attempt, scope.result)

    def tool(
        self,
        name: str | None = None,
        *,
        effect: Effect = Effect.SIDE_EFFECT,
        retry_unknown: bool = False,
        raw: bool = False,
        require_approval: bool = False,
    ) -> Callable[[Callable[P, Awaitable[R]]], AsyncSafeTool[P, R]]:
        """See `Run.tool`; for async tool functions."""

        def wrap(fn: Callable[P, Awaitable[R]]) -> AsyncSafeTool[P, R]:
            options = CallOptions(effect, retry_unknown, raw, require_approval)
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
        functools.update_wrapper(self, fn)

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Runs the next step of this tool (call id `{name}-{n}`)."""
        return await self.at(self.run.next_call_id(self.name))(*args, **kwargs)

    def at(self, call_id: str) -> Callable[P, Awaitable[R]]:
        """The tool bound to an explicit call id."""

        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            o = self.options
            async with self.run.call(
                self.name,
                input_of(self.fn, args, kwargs),
                call_id=call_id,
                effect=o.effect,
                retry_unknown=o.retry_unknown,
                raw=o.raw,
                require_approval=o.require_approval,
            ) as step:
                if not step.execute:
                    return step.result  # type: ignore[no-any-return]
                if o.effect is Effect.IDEMPOTENT_WRITE:
                    kwargs[KEY_PARAMETER] = step.idempotency_key
                value = await self.fn(*args, **kwargs)
                step.set_result(value)
                return value

        return call
