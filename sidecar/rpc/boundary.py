"""The request boundary: what runs around every handler the gate lets through
(`sidecar.rpc.gate` has authenticated the call already, and authorized it
before its request was parsed; a message of the session stream is authorized
here, for its own RPC). In this order:

1. enter: the caller is resolved, once (`sidecar.rpc.caller.resolve`), and
   the call's state is made visible to its handler's task (`CallState`, the
   `Caller`, the trace context);
2. admit: a concurrency slot and a rate token (`sidecar.rpc.admission`);
3. deadline: a unary call that brought no deadline gets the default one, a
   session message its own `timeout_ms` or the default one (a stream lives
   as long as its client lets it);
4. handler: the servicer's method; a request that did not parse is refused
   here, INVALID_ARGUMENT, like any other bad request;
5. domain error to status: an `EffectdError` is answered its rich status
   (`sidecar.rpc.errors`), a method the daemon does not provide
   (`NotImplementedError`) UNIMPLEMENTED, anything else is logged and
   answered INTERNAL without details;
6. record: however the call ended, its slot is given back and the call is
   recorded once (`sidecar.rpc.recording`).

One core runs these steps (`Boundary.answer`) and returns the handler's
answer or a `Refused` status; the unary and server-streaming wrappers abort
the call with it, the session stream (`sidecar.rpc.session`) answers it as
the message's `error`. Only how the handler is run, and where its answer
goes, differ.
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

from sidecar import callstate, tracecontext
from sidecar.auth.access import Principal
from sidecar.callstate import CallState
from sidecar.errors import (
    EffectdError,
    FieldViolation,
    InvalidArgument,
    NotImplementedYet,
)
from sidecar.rpc import caller
from sidecar.rpc.admission import RateLimit, admit
from sidecar.rpc.concurrency import Slots
from sidecar.rpc.errors import internal_status, plain_status, to_status
from sidecar.rpc.messages import Messages
from sidecar.rpc.recording import Recorder, code_of, name_the_call

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


@dataclass(frozen=True, slots=True)
class Refused:
    """How a call was refused or failed: its status (with the details the
    unary trailer carries) and the ErrorInfo reason, "" for none."""

    status: grpc.Status
    reason: str


DEADLINE_PASSED = "the call's deadline passed"


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
        self.default_deadline = default_deadline

    def unary(self, call: Call, handler: Handler) -> Handler:
        async def unary(request: Any, context: Context) -> Any:
            # A call that brought its own deadline is cut by gRPC.
            deadline = (
                self.default_deadline if context.time_remaining() is None else None
            )
            answer = await self.answer(
                call.method,
                call.principal,
                request,
                lambda: handler(request, context),
                deadline=deadline,
                trace=tracecontext.from_metadata(call.metadata),
                context=context,
            )
            if isinstance(answer, Refused):
                await _abort(context, answer.status)
            return answer

        return unary

    def stream(self, call: Call, handler: Callable[..., Any]) -> Handler:
        # A coroutine that writes, not an async generator: gRPC runs it in
        # the call's own task, so a stream cut by its deadline ends here
        # (CancelledError) in the context that set the call's variables. An
        # async generator cut off is finalized later in a task of its own,
        # whose context cannot reset them, and the call went unrecorded.
        async def stream(request: Any, context: Context) -> None:
            answer = await self.answer(
                call.method,
                call.principal,
                request,
                lambda: _serve_stream(handler, request, context),
                deadline=None,
                trace=tracecontext.from_metadata(call.metadata),
                context=context,
            )
            if isinstance(answer, Refused):
                await _abort(context, answer.status)

        return stream

    async def answer(
        self,
        method: str,
        principal: Principal | None,
        request: object,
        run: Callable[[], Awaitable[Any]],
        *,
        deadline: float | None,
        trace: tracecontext.TraceParent | None,
        context: Context | None = None,
        who: caller.Caller | None = None,
    ) -> Any:
        """Runs one call of `method` through the steps of this module, in
        their order; `run` runs its handler, whose `deadline` is that many
        seconds from now unless None; `who`, its caller when resolved already
        (`caller.resolve` of `principal` and `request`). Returns the
        handler's answer, or `Refused`.
        Raises what ended the call otherwise (it was cancelled, or gRPC
        ended it: the `context` of a call, None for a session message, tells
        its code for the record).
        """
        # 1. enter
        if who is None:
            who = caller.resolve(principal, request)
        state = CallState(method, principal, namespace=who.namespace, trace=trace)
        self._recorder.started(state)
        entered = (
            callstate.CURRENT.set(state),
            caller.CURRENT.set(who),
            tracecontext.CURRENT.set(state.trace),
        )
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        release: Callable[[], None] | None = None
        try:
            # 2. admit
            try:
                peer = context.peer() if context is not None else ""
                release = admit(method, who.charged, self._slots, self._rate, peer)
            except EffectdError as exc:
                refused = Refused(to_status(exc), exc.reason)
            else:
                # 3. deadline
                if deadline:
                    loop = asyncio.get_running_loop()
                    state.deadline = loop.time() + deadline
                # 4. handler, 5. domain error to status
                refused = await _answered(method, state, request, run)
                answered = not isinstance(refused, Refused)
                # Fourteen field lookups a message, for the access log alone:
                # only when it writes the line (at DEBUG for an answer).
                if self._recorder.names_wanted(ok=answered):
                    name_the_call(state, request, refused)
                if answered:
                    return refused
            state.reason = refused.reason
            code = refused.status.code
            return refused
        except BaseException as exc:
            code = code_of(exc, context)
            raise
        finally:
            # 6. record
            if release is not None:
                release()
            callstate.CURRENT.reset(entered[0])
            caller.CURRENT.reset(entered[1])
            tracecontext.CURRENT.reset(entered[2])
            self._recorder.record(state, code, time.perf_counter() - started)

    def refused(
        self,
        method: str,
        principal: Principal | None,
        exc: EffectdError,
        trace: tracecontext.TraceParent | None,
    ) -> Refused:
        """Records a call refused before it was served (authentication,
        authorization; a session message refused at once): its refusal."""
        refused = Refused(to_status(exc), exc.reason)
        state = CallState(method, principal, reason=exc.reason, trace=trace)
        self._recorder.record(state, refused.status.code, 0.0)
        return refused

    def session(
        self, call: Call, handler: Callable[..., Awaitable[Refused | None]]
    ) -> Handler:
        """The handler of a session stream: `handler(requests, context,
        messages)` serves each message through `messages`, and returns the
        refusal the stream ends with, if any. The stream itself is recorded
        once, under its own method, when it ends."""

        async def session(requests: Any, context: Context) -> None:
            stream_trace = tracecontext.from_metadata(call.metadata)
            state = CallState(call.method, call.principal, trace=stream_trace)
            self._recorder.started(state)
            started = time.perf_counter()
            ended: BaseException | None = None
            release: Callable[[], None] | None = None
            messages = Messages(self, call.principal, stream_trace)
            try:
                try:
                    # A slot of the session pool, no rate token: each
                    # message is charged as its unary call.
                    charged = caller.charged(call.principal, "")
                    release = admit(call.method, charged, self._slots, None)
                except EffectdError as exc:
                    refused: Refused | None = Refused(to_status(exc), exc.reason)
                else:
                    refused = await _stream_ended(
                        call.method, handler, requests, context, messages
                    )
                if refused is not None:
                    state.reason = refused.reason
                    await _abort(context, refused.status)
            except BaseException as exc:
                ended = exc
                raise
            finally:
                if release is not None:
                    release()
                seconds = time.perf_counter() - started
                code = code_of(ended, context)
                # A client closing its stream cancels it: between calls,
                # that is how a session ends, no failure to log at info.
                closed = code is grpc.StatusCode.CANCELLED and not messages.cut
                self._recorder.record(state, code, seconds, quiet=closed)

        return session


async def _stream_ended(
    method: str,
    handler: Callable[..., Awaitable[Refused | None]],
    requests: Any,
    context: Context,
    messages: Messages,
) -> Refused | None:
    """The refusal a session stream's handler ended it with, if any; a
    failure answered INTERNAL without details, as a unary call's."""
    try:
        return await handler(requests, context, messages)
    except grpc.aio.BaseError:
        raise
    except Exception:
        log.exception("internal error in %s", method)
        return Refused(internal_status("internal error; see the daemon log"), "")


async def _answered(
    method: str,
    state: CallState,
    request: object,
    run: Callable[[], Awaitable[Any]],
) -> Any:
    """The handler's answer, cut at the call's deadline; a refusal or failure
    answered as `Refused`."""
    try:
        async with asyncio.timeout_at(state.deadline):
            if isinstance(request, Unparsed):
                raise InvalidArgument([FieldViolation("", str(request))])
            return await run()
    except grpc.aio.BaseError:
        # gRPC's own (an abort, a write to a client that has gone): the call
        # has its end already.
        raise
    except TimeoutError:
        return Refused(
            plain_status(grpc.StatusCode.DEADLINE_EXCEEDED, DEADLINE_PASSED), ""
        )
    except EffectdError as exc:
        return Refused(to_status(exc), exc.reason)
    except NotImplementedError:
        # A generated servicer's method this daemon does not provide (gRPC
        # health's List): what gRPC answers an unknown method, not a failure.
        missing = NotImplementedYet(f"{method} is not implemented by this daemon")
        return Refused(to_status(missing), missing.reason)
    except Exception:
        log.exception("internal error in %s", method)
        return Refused(internal_status("internal error; see the daemon log"), "")


async def _abort(context: Context, status: grpc.Status) -> NoReturn:
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
