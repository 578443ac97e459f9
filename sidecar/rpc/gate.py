"""The one interceptor every RPC passes (contract §10.2; reliability-anchors §7).

Before any handler runs, and before the request is parsed: authenticate the
bearer token, then authorize the method for the token's roles (default deny:
a method without a rule is refused to everyone). A call refused here is
answered without its bytes ever being parsed, and recorded. Every other
unary and server-streaming call is handed to the request boundary
(`sidecar.rpc.boundary`), which admits it, gives it its deadline, runs its
handler, answers its errors and records it; so is the session stream
(`sidecar.rpc.session`), whose messages the boundary authorizes and serves
one by one, each as a call of its own unary RPC. Health is open: probes carry no
credentials, and it tells only whether the daemon serves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from sidecar import tracecontext as trace
from sidecar.auth.access import (
    OPEN_METHODS,
    Credentials,
    Principal,
    authorize,
    bearer_token,
)
from sidecar.errors import EffectdError
from sidecar.rpc.admission import RateLimit
from sidecar.rpc.boundary import Boundary, Call, parsing
from sidecar.rpc.concurrency import Slots
from sidecar.rpc.errors import to_status
from sidecar.rpc.recording import Recorder, RpcObserver, RpcTracer
from sidecar.rpc.session import SESSION

# RpcTracer: the composition root's seams name the tracer the gate takes.
__all__ = ["Gate", "RpcTracer"]

Context = grpc.aio.ServicerContext[Any, Any]


class Gate(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(
        self,
        credentials: Credentials | None,
        *,
        admission: RateLimit | None = None,
        observer: RpcObserver | None = None,
        tracer: RpcTracer | None = None,
        default_deadline: float | None = None,
        slots: Slots | None = None,
    ) -> None:
        self._credentials = credentials
        self._boundary = Boundary(
            Recorder(observer, tracer),
            rate=admission,
            slots=slots,
            default_deadline=default_deadline,
        )

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
                self._boundary.refused(
                    method, principal, exc, trace.from_metadata(metadata)
                )
                return _deny(handler, exc)
        if handler is None:
            return None
        call = Call(method, principal, metadata)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._boundary.unary(call, handler.unary_unary),
                request_deserializer=parsing(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._boundary.stream(call, handler.unary_stream),
                request_deserializer=parsing(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None and method == SESSION:
            return grpc.stream_stream_rpc_method_handler(
                self._boundary.session(call, handler.stream_stream),
                request_deserializer=parsing(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        # Other streaming requests (server reflection): authenticated above;
        # served as they are.
        return handler


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
