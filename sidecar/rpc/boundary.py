"""The request boundary: what runs around every handler the gate lets through
(`sidecar.rpc.gate` has authenticated and authorized the call already,
before its request was parsed). In this order:

1. enter: the caller is resolved, once (`sidecar.rpc.caller.resolve`), and
   the call's state is made visible to its handler's task (`CallState`, the
   `Caller`, the trace context);
2. admit: a concurrency slot and a rate token (`sidecar.rpc.admission`);
3. deadline: a unary call that brought no deadline gets the default one
   (a stream lives as long as its client lets it);
4. handler: the servicer's method; a request that did not parse is refused
   here, INVALID_ARGUMENT, like any other bad request;
5. domain error to status: an `EffectdError` is answered its rich status
   (`sidecar.rpc.errors`), anything else is logged and answered INTERNAL
   without details;
6. record: however the call ended, its slot is given back and the call is
   recorded once (`sidecar.rpc.recording`).

Unary and server-streaming handlers pass the same steps (`Boundary._serve`);
only how the handler is run differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError

from sidecar import callstate
from sidecar import tracecontext as trace
from sidecar.auth.access import Principal
from sidecar.callstate import CallState
from sidecar.errors import EffectdError, FieldViolation, InvalidArgument
from sidecar.rpc import caller
from sidecar.rpc.admission import RateLimit, admit
from sidecar.rpc.concurrency import Slots
from sidecar.rpc.errors import internal_status, to_status
from sidecar.rpc.recording import Recorder, code_of

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
Handler = Callable[[Any, Context], Awaitable[Any]]
Metadata = tuple[tuple[str, str | bytes], ...]


@dataclass(frozen=True, slots=True)
class Unparsed:
    """Stands in for a request that did not parse (refused INVALID_ARGUMENT
    before any handler runs)."""

    subject: str
    error: str

    def __str__(self) -> str:
        return f"is not a valid {self.subject}: {self.error}"


def parsing(
    deserializer: Callable[[bytes], Any] | None, subject: str = "request"
) -> Callable[[bytes], Any] | None:
    """`deserializer`, answering `Unparsed` where it would fail the call
    (gRPC answers a deserializer's error UNKNOWN, or INTERNAL)."""
    if deserializer is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as exc:
            return Unparsed(subject, str(exc))

    return parse


@dataclass(frozen=True, slots=True)
class Call:
    """What the gate knows of a call before its request is parsed."""

    method: str
    principal: Principal | None
    metadata: Metadata


class Boundary:
    def __init__(
        self,
        recorder: Recorder,
        *,
        rate: RateLimit | None = None,
        slots: Slots | None = None,
        default_deadline: float | None = None,
    ) -> None:
        self._recorder = recorder
        self._rate = rate
        self._slots = slots
        self._default_deadline = default_deadline

    def unary(self, call: Call, handler: Handler) -> Handler:
        async def unary(request: Any, context: Context) -> Any:
            return await self._serve(
                call, request, context, lambda: handler(request, context), unary=True
            )

        return unary

    def stream(self, call: Call, handler: Callable[..., Any]) -> Handler:
        # A coroutine that writes, not an async generator: gRPC runs it in
        # the call's own task, so a stream cut by its deadline ends here
        # (CancelledError) in the context that set the call's variables. An
        # async generator cut off is finalized later in a task of its own,
        # whose context cannot reset them, and the call went unrecorded.
        async def stream(request: Any, context: Context) -> None:
            await self._serve(
                call,
                request,
                context,
                lambda: _serve_stream(handler, request, context),
                unary=False,
            )

        return stream

    async def _serve(
        self,
        call: Call,
        request: object,
        context: Context,
        run: Callable[[], Awaitable[Any]],
        *,
        unary: bool,
    ) -> Any:
        """Runs one call through the steps of this module, in their order;
        `run` runs its handler."""
        # 1. enter
        who = caller.resolve(call.principal, request)
        state = CallState(
            call.method,
            call.principal,
            namespace=who.namespace,
            trace=trace.from_metadata(call.metadata),
        )
        self._recorder.started(state)
        entered = (
            callstate.CURRENT.set(state),
            caller.CURRENT.set(who),
            trace.CURRENT.set(state.trace),
        )
        started = time.perf_counter()
        ended: BaseException | None = None
        release: Callable[[], None] | None = None
        try:
            # 2. admit
            try:
                release = admit(call.method, who.charged, self._slots, self._rate)
            except EffectdError as exc:
                await _refuse(state, context, to_status(exc), exc.reason)
            # 3. deadline
            if unary and context.time_remaining() is None and self._default_deadline:
                loop = asyncio.get_running_loop()
                state.deadline = loop.time() + self._default_deadline
            try:
                async with asyncio.timeout_at(state.deadline):
                    # 4. handler, 5. domain error to status
                    return await _answered(call.method, state, request, context, run)
            except TimeoutError:
                await context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    "the default deadline of a call without one passed",
                )
        except BaseException as exc:
            ended = exc
            raise
        finally:
            # 6. record
            if release is not None:
                release()
            callstate.CURRENT.reset(entered[0])
            caller.CURRENT.reset(entered[1])
            trace.CURRENT.reset(entered[2])
            seconds = time.perf_counter() - started
            self._recorder.record(state, code_of(context, ended), seconds)


async def _answered(
    method: str,
    state: CallState,
    request: object,
    context: Context,
    run: Callable[[], Awaitable[Any]],
) -> Any:
    """The handler's answer; a refusal or failure answered as its status."""
    try:
        if isinstance(request, Unparsed):
            raise InvalidArgument([FieldViolation("", str(request))])
        return await run()
    except grpc.aio.BaseError:
        # gRPC's own (an abort, a write to a client that has gone): the call
        # has its end already.
        raise
    except EffectdError as exc:
        status, reason = to_status(exc), exc.reason
    except Exception:
        log.exception("internal error in %s", method)
        status, reason = internal_status("internal error; see the daemon log"), ""
    return await _refuse(state, context, status, reason)


async def _refuse(
    state: CallState, context: Context, status: grpc.Status, reason: str
) -> NoReturn:
    """Ends the call with `status`, its ErrorInfo `reason` noted for the
    record."""
    state.reason = reason
    await context.abort(status.code, status.details, status.trailing_metadata)
    raise AssertionError("abort returns only by raising")  # pragma: no cover


async def _serve_stream(handler: Any, request: Any, context: Context) -> None:
    """Runs a server-streaming handler of either kind gRPC accepts: an async
    generator (its items are written, and it is closed here, in this task,
    however the call ends) or a coroutine that writes itself (health Watch)."""
    if not inspect.isasyncgenfunction(handler):
        await handler(request, context)
        return
    async with contextlib.aclosing(handler(request, context)) as items:
        async for item in items:
            await context.write(item)


def time_remaining(context: Context) -> float | None:
    """Seconds left for the call: its own deadline, or the default one the
    boundary gave it."""
    remaining: float | None = context.time_remaining()
    if remaining is not None:
        return remaining
    state = callstate.CURRENT.get()
    if state is None or state.deadline is None:
        return None
    return max(0.0, state.deadline - asyncio.get_running_loop().time())
