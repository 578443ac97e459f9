"""The one interceptor every RPC passes (DESIGN §10; reliability-anchors §7).

In order, before any handler runs (and before the request is parsed):
authenticate the bearer token, authorize the method for the token's roles
(default deny: a method without a rule is refused to everyone). Then around
the handler: charge the caller (`charged`) to its rate limit and take one of
its concurrency slots (`sidecar.rpc.concurrency`), give a call that brought
no deadline the default one, and record the outcome however the call ended
(metrics, a span with OpenTelemetry on, one access log line). Health is open:
probes carry no credentials, and it tells only whether the daemon serves.

The caller's identity reaches the handlers through `CURRENT`, a ContextVar
set by the wrapper the interceptor puts around each handler (it runs in the
handler's own task), so the translation layer can take the namespace from
the credential and never from the request body (`namespace` below).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from google.protobuf.message import DecodeError

from sidecar import tracecontext as trace
from sidecar.auth.access import (
    OPEN_METHODS,
    Credentials,
    Principal,
    authorize,
    bearer_token,
)
from sidecar.callstate import CURRENT, CallState
from sidecar.errors import EffectdError, FieldViolation, InvalidArgument, NotFound
from sidecar.ledger.quota import Caller
from sidecar.ledger.validation import Violations
from sidecar.rpc.concurrency import Pool, Slots
from sidecar.rpc.errors import to_status

access_log = logging.getLogger("effectd.access")

Context = grpc.aio.ServicerContext[Any, Any]
# The RPCs that record work already done: the tool has run (or may have), and
# its result must always be recordable, so no rate limit refuses them and they
# have concurrency slots of their own.
RECORDS_WORK_DONE = frozenset(
    {
        "/effectd.v1.ToolLedger/CommitTool",
        "/effectd.v1.ToolLedger/ReportUnknown",
        "/effectd.v1.ToolLedger/Heartbeat",
        "/effectd.v1.Recovery/AcknowledgeRecovery",
    }
)


# The concurrency pool of each RPC that does not take an ordinary slot; None:
# never counted (health checks are answered whatever the load).
_POOLS: dict[str, Pool | None] = {
    **dict.fromkeys(RECORDS_WORK_DONE, Pool.RECORDING),
    "/grpc.health.v1.Health/Watch": Pool.HEALTH_WATCH,
    "/grpc.health.v1.Health/Check": None,
}


class Admission(Protocol):
    def admit(self, caller: Caller) -> None: ...


class RpcObserver(Protocol):
    def rpc_finished(
        self, method: str, code: grpc.StatusCode, seconds: float
    ) -> None: ...

    def refused(self, reason: str) -> None: ...


class RpcTracer(Protocol):
    """Records a span per RPC (sidecar.observability.otel)."""

    def rpc_started(self, state: CallState) -> trace.TraceParent | None:
        """Starts the call's span; the context its provider requests carry."""

    def rpc_finished(self, state: CallState, code: grpc.StatusCode) -> None: ...


def namespace(v: Violations, field_path: str, requested: str) -> str:
    """The namespace a request acts in. Without authentication: the one it
    names (validated), default `default`. With authentication: the
    credential decides (`Principal.namespace`); one outside its grants
    answers NOT_FOUND."""
    before = len(v.items)
    named = v.namespace(field_path, requested)
    state = CURRENT.get()
    if state is None or state.principal is None or len(v.items) > before:
        return named
    chosen = state.principal.namespace(requested)
    if chosen is None:
        v.add(field_path, "is required: this token may touch several namespaces")
        return named
    return chosen


def actor(v: Violations, field_path: str, named: str) -> str:
    """Who an operator action is recorded as: the name the request gives,
    or with authentication on the credential's name (a request may repeat
    it, never name someone else)."""
    state = CURRENT.get()
    if state is None or state.principal is None:
        return named
    if named and named != state.principal.name:
        v.add(field_path, "must be empty or the name of the caller's token")
    return state.principal.name


def caller(default: str) -> str:
    """Who a change is recorded as: the token's name with authentication on,
    else `default`."""
    state = CURRENT.get()
    if state is None or state.principal is None:
        return default
    return state.principal.name


def whole_daemon() -> bool:
    """Whether the caller may act on every namespace (no authentication, or a
    token granted them all)."""
    state = CURRENT.get()
    return state is None or state.principal is None or state.principal.every_namespace


def visible_namespaces() -> frozenset[str] | None:
    """The namespaces the caller may see: None (every one) without
    authentication or for a token granted them all, else its grants."""
    state = CURRENT.get()
    if state is None or state.principal is None or state.principal.every_namespace:
        return None
    return state.principal.namespaces


def note_refusal(reason: str) -> None:
    state = CURRENT.get()
    if state is not None:
        state.reason = reason


def time_remaining(context: Context) -> float | None:
    """Seconds left for the call: its own deadline, or the default one the
    gate gave it."""
    remaining: float | None = context.time_remaining()
    if remaining is not None:
        return remaining
    state = CURRENT.get()
    if state is None or state.deadline is None:
        return None
    return max(0.0, state.deadline - asyncio.get_running_loop().time())


def _requested_namespace(request: object) -> str:
    """The namespace a request names, for the rate limit (the handler
    validates and resolves it again)."""
    descriptor = getattr(request, "DESCRIPTOR", None)
    if descriptor is None:
        return ""
    fields = descriptor.fields_by_name
    if "namespace" in fields:
        return str(request.namespace)  # type: ignore[attr-defined]
    for name in ("ref", "call"):
        if name in fields and fields[name].message_type is not None:
            return str(getattr(request, name).namespace)
    if "calls" in fields and request.calls:  # type: ignore[attr-defined]
        return str(request.calls[0].ref.namespace)  # type: ignore[attr-defined]
    return ""


def charged(principal: Principal | None, requested: str) -> Caller:
    """Whom a call is charged to. With authentication, its caller: the
    namespace of a token bound to one, else the token itself; never a
    namespace the request names, which may be one the token is refused
    (several namespaces or made-up ones must not widen a token's limit).
    Without it, the namespace the request names once it is valid (empty:
    the default one); requests naming an invalid one share one bucket."""
    if principal is not None:
        if len(principal.namespaces) == 1 and not principal.every_namespace:
            return Caller(namespace=next(iter(principal.namespaces)))
        return Caller(token=principal.name)
    return Caller(namespace=_acting_in(None, requested))


def _acting_in(principal: Principal | None, requested: str) -> str:
    """The valid namespace the call acts in, for the record; "" when none
    (the handler refuses it)."""
    v = Violations()
    named = v.namespace("namespace", requested)
    if v.items:
        return ""
    if principal is None:
        return named
    try:
        return principal.namespace(requested) or ""
    except NotFound:
        return ""


class Gate(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(
        self,
        credentials: Credentials | None,
        *,
        admission: Admission | None = None,
        observer: RpcObserver | None = None,
        tracer: RpcTracer | None = None,
        default_deadline: float | None = None,
        slots: Slots | None = None,
    ) -> None:
        self._credentials = credentials
        self._admission = admission
        self._slots = slots
        self._observer = observer
        self._tracer = tracer
        self._default_deadline = default_deadline

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        method = details.method
        metadata = tuple(details.invocation_metadata or ())
        handler = await continuation(details)
        principal: Principal | None = None
        if self._credentials is not None and method not in OPEN_METHODS:
            try:
                principal = self._credentials.authenticate(bearer_token(metadata))
                authorize(principal, method)
            except EffectdError as exc:
                self._finished(method, principal, exc, 0.0, metadata)
                return _deny(handler, exc)
        if handler is None:
            return None
        return self._wrap(handler, method, principal, metadata)

    def _wrap(
        self,
        handler: Any,
        method: str,
        principal: Principal | None,
        metadata: tuple[tuple[str, str | bytes], ...],
    ) -> Any:
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request: Any, context: Context) -> Any:
                async with self._served(
                    method, principal, metadata, request, context
                ) as state:
                    if context.time_remaining() is None and self._default_deadline:
                        state.deadline = (
                            asyncio.get_running_loop().time() + self._default_deadline
                        )
                    try:
                        async with asyncio.timeout_at(state.deadline):
                            return await inner(request, context)
                    except TimeoutError:
                        await context.abort(
                            grpc.StatusCode.DEADLINE_EXCEEDED,
                            "the default deadline of a call without one passed",
                        )

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=_parsing(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            # A coroutine that writes, not an async generator: gRPC runs it
            # in the call's own task, so a stream cut by its deadline ends
            # here (CancelledError) in the context that set `CURRENT`. An
            # async generator cut off is finalized later in a task of its
            # own, whose context cannot reset the variables, and the call
            # went unrecorded.
            async def stream(request: Any, context: Context) -> None:
                async with self._served(method, principal, metadata, request, context):
                    await _serve_stream(inner_stream, request, context)

            return grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=_parsing(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        # Streaming requests (server reflection): authenticated above; served
        # as they are.
        return handler

    @contextlib.asynccontextmanager
    async def _served(
        self,
        method: str,
        principal: Principal | None,
        metadata: tuple[tuple[str, str | bytes], ...],
        request: object,
        context: Context,
    ) -> AsyncIterator[CallState]:
        """Admits the call (`_admit`) and gives its state, visible to its
        handler through `CURRENT`; at the end, however the call ended, its
        slot is given back and its outcome recorded."""
        state = CallState(method, principal, trace=trace.from_metadata(metadata))
        if self._tracer is not None:
            state.trace = self._tracer.rpc_started(state)
        tokens = CURRENT.set(state), trace.CURRENT.set(state.trace)
        started = time.perf_counter()
        ended: BaseException | None = None
        release: Callable[[], None] | None = None
        try:
            release = await self._admit(state, request, context)
            yield state
        except BaseException as exc:
            ended = exc
            raise
        finally:
            if release is not None:
                release()
            CURRENT.reset(tokens[0])
            trace.CURRENT.reset(tokens[1])
            code = _code_of(context, ended)
            self._record(state, code, time.perf_counter() - started, metadata)

    async def _admit(
        self, state: CallState, request: object, context: Context
    ) -> Callable[[], None] | None:
        """Charges the call to its caller's rate limit and takes its slot
        (`sidecar.rpc.concurrency`); over either, the call is refused before
        its handler runs. Returns what gives the slot back. Health is never
        rate-limited, nor is a call that records work already done
        (`RECORDS_WORK_DONE`)."""
        requested = _requested_namespace(request)
        state.namespace = _acting_in(state.principal, requested)
        caller = charged(state.principal, requested)
        release: Callable[[], None] | None = None
        try:
            if isinstance(request, Unparsed):
                raise InvalidArgument([FieldViolation("", str(request))])
            pool = _POOLS.get(state.method, Pool.ORDINARY)
            if self._slots is not None and pool is not None:
                release = self._slots.take(pool, caller)
            exempt = state.method in RECORDS_WORK_DONE or state.method in OPEN_METHODS
            if self._admission is not None and not exempt:
                # After the slot: a call refused for concurrency takes no token.
                self._admission.admit(caller)
        except EffectdError as exc:
            if release is not None:
                release()
            state.reason = exc.reason
            status = to_status(exc)
            await context.abort(status.code, status.details, status.trailing_metadata)
            raise AssertionError("abort returns only by raising") from exc
        return release

    def _finished(
        self,
        method: str,
        principal: Principal | None,
        exc: EffectdError,
        seconds: float,
        metadata: tuple[tuple[str, str | bytes], ...],
    ) -> None:
        state = CallState(
            method, principal, reason=exc.reason, trace=trace.from_metadata(metadata)
        )
        self._record(state, to_status(exc).code, seconds, metadata)

    def _record(
        self,
        state: CallState,
        code: grpc.StatusCode,
        seconds: float,
        metadata: tuple[tuple[str, str | bytes], ...],
    ) -> None:
        if self._tracer is not None:
            self._tracer.rpc_finished(state, code)
        if self._observer is not None:
            self._observer.rpc_finished(state.method, code, seconds)
            if state.reason:
                self._observer.refused(state.reason)
        # Refusals and failures at INFO (security-relevant: a wrong token, a
        # denied role), answered calls at DEBUG: a line per call costs as
        # much as the call's own work (bench/lifecycle.py), and the metrics
        # count every call anyway.
        level = logging.DEBUG if code is grpc.StatusCode.OK else logging.INFO
        if not access_log.isEnabledFor(level):
            return
        # Never the request, its payloads or the token: names and outcomes.
        access_log.log(
            level,
            "rpc",
            extra={
                "method": state.method,
                "code": code.name,
                "reason": state.reason or None,
                "namespace": state.namespace or None,
                "principal": state.principal.name if state.principal else None,
                "duration_ms": round(seconds * 1000, 3),
                "trace_id": state.trace.trace_id if state.trace else None,
            },
        )


@dataclass(frozen=True, slots=True)
class Unparsed:
    """Stands in for a request that did not parse (the gate refuses it
    INVALID_ARGUMENT before any handler runs)."""

    error: str

    def __str__(self) -> str:
        return f"is not a valid request: {self.error}"


def _parsing(
    deserializer: Callable[[bytes], Any] | None,
) -> Callable[[bytes], Any] | None:
    """The handler's deserializer, answering `Unparsed` where gRPC's own
    would fail the call (UNKNOWN): a servicer not registered through
    `sidecar.rpc.handlers` (health) gets bad bytes refused like the rest."""
    if deserializer is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as exc:
            return Unparsed(str(exc))

    return parse


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


def _code_of(context: Context, ended: BaseException | None) -> grpc.StatusCode:
    """The status the call ended with: the one it was aborted with or set;
    else what ended it, as gRPC answers it (cut off after its deadline:
    DEADLINE_EXCEEDED, before it: CANCELLED, any other exception: UNKNOWN);
    else OK."""
    code: object = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if isinstance(code, int):
        for candidate in grpc.StatusCode:
            if candidate.value[0] == code:
                return candidate
    if ended is None or isinstance(ended, grpc.aio.AbortError):
        return grpc.StatusCode.OK
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        return grpc.StatusCode.DEADLINE_EXCEEDED
    # A failed write (grpc.aio.InternalError): the client had gone.
    if isinstance(ended, asyncio.CancelledError | grpc.aio.InternalError):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN


def _deny(handler: Any, exc: EffectdError) -> Any:
    """A handler of the same kind as the refused one that answers the
    refusal without parsing the request (the bytes stay bytes)."""
    status = to_status(exc)

    async def refuse(_: Any, context: Context) -> Any:
        await context.abort(status.code, status.details, status.trailing_metadata)

    async def refuse_stream(_: Any, context: Context) -> AsyncIterator[Any]:
        # The empty loop makes this a generator that yields nothing.
        nothing: tuple[Any, ...] = ()
        for item in nothing:
            yield item
        await context.abort(status.code, status.details, status.trailing_metadata)

    if handler is not None and handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse_stream)
    if handler is not None and handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(refuse_stream)
    return grpc.unary_unary_rpc_method_handler(refuse)
