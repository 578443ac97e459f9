"""The session stream's messages at the request boundary: each message is
a call of its own unary RPC by the stream's principal, authorized for that
RPC here (the gate authorized only the stream), then run through the
boundary's one core, `Boundary.answer` (`sidecar.rpc.boundary`), with its
own deadline and trace context."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from sidecar import tracecontext
from sidecar.auth.access import Principal, authorize
from sidecar.errors import EffectdError

if TYPE_CHECKING:
    from sidecar.rpc.boundary import Boundary, Refused


class Messages:
    """Serves the messages of one session stream, each as a call of its
    unary RPC by the stream's principal: authorized for that RPC (the gate
    authorized only the stream), then through `Boundary.answer`."""

    __slots__ = ("_boundary", "_denials", "_principal", "_trace")

    def __init__(
        self,
        boundary: Boundary,
        principal: Principal | None,
        stream_trace: tracecontext.TraceParent | None,
    ) -> None:
        self._boundary = boundary
        self._principal = principal
        self._trace = stream_trace
        # The stream's principal does not change: each RPC is authorized
        # once per stream (None: allowed).
        self._denials: dict[str, EffectdError | None] = {}

    async def answer(
        self,
        method: str,
        request: object,
        run: Callable[[], Awaitable[Any]],
        *,
        timeout_ms: int,
        traceparent: str,
    ) -> Any:
        """The answer to one message asking `method`, or `Refused`: its
        deadline `timeout_ms` from now (0: the default one), its trace
        context `traceparent` (empty or invalid: the stream's)."""
        message_trace = self._trace_of(traceparent)
        principal = self._principal
        if principal is not None:
            if method not in self._denials:
                self._denials[method] = _denial(principal, method)
            denied = self._denials[method]
            if denied is not None:
                return self._boundary.refused(method, principal, denied, message_trace)
        deadline = timeout_ms / 1000 if timeout_ms else self._boundary.default_deadline
        return await self._boundary.answer(
            method, principal, request, run, deadline=deadline, trace=message_trace
        )

    def refuse(self, method: str, exc: EffectdError, traceparent: str) -> Refused:
        """Records a message of `method` refused before it was served (its
        id in flight already, the daemon stopping): its refusal."""
        return self._boundary.refused(
            method, self._principal, exc, self._trace_of(traceparent)
        )

    def _trace_of(self, traceparent: str) -> tracecontext.TraceParent | None:
        if not traceparent:
            return self._trace
        return tracecontext.parse_traceparent(traceparent) or self._trace


def _denial(principal: Principal, method: str) -> EffectdError | None:
    try:
        authorize(principal, method)
    except EffectdError as exc:
        return exc
    return None
