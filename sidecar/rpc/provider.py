"""The `effectd.v1.Provider` service: translation only.

Requests are validated and turned into `sidecar.provider.client.Request`;
answers and stream items into messages. Every answer carries the trailer
`grpc-retry-pushback-ms: -1` (the sidecar has retried already) and the
attempt count and total wait as `x-providercall-*` trailers.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from effectd.v1 import provider_pb2 as pb

from sidecar.ledger.validation import Limits, Violations
from sidecar.provider.client import (
    FORBIDDEN_REQUEST_HEADERS,
    Answer,
    Attempt,
    Counters,
    Events,
    ProviderClient,
    Request,
    StreamEnd,
    StreamHead,
)
from sidecar.provider.policy import Cause, Stop
from sidecar.rpc import gate
from sidecar.rpc.errors import NO_PUSHBACK

Context = grpc.aio.ServicerContext[Any, Any]

METHODS = frozenset({"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"})
MAX_HEADERS = 100
MAX_PATH_BYTES = 8192
MAX_CLIENT_RETRIES = 100
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")

STOPS: dict[Stop, int] = {s: pb.StopReason.Value(f"STOP_REASON_{s.name}") for s in Stop}
OUTCOMES: dict[Cause, int] = {
    Cause.RESPONSE: pb.ATTEMPT_OUTCOME_RESPONSE,
    Cause.NEVER_SENT: pb.ATTEMPT_OUTCOME_NEVER_SENT,
    Cause.MAYBE_EXECUTED: pb.ATTEMPT_OUTCOME_MAYBE_EXECUTED,
    Cause.PERMANENT: pb.ATTEMPT_OUTCOME_PERMANENT,
    Cause.ERROR_EVENT: pb.ATTEMPT_OUTCOME_ERROR_EVENT,
}


def request_of(
    req: pb.ProviderRequest, limits: Limits, own_headers: frozenset[str]
) -> Request:
    """The validated request; INVALID_REQUEST lists every bad field."""
    v = Violations()
    v.text_id("route", req.route, limits.max_id_bytes)
    method = req.method.upper() or "POST"
    if method not in METHODS:
        v.add("method", f"must be one of {', '.join(sorted(METHODS))}")
    if not req.path:
        v.add("path", "is required")
    elif len(req.path.encode()) > MAX_PATH_BYTES:
        v.add("path", f"must be at most {MAX_PATH_BYTES} bytes")
    if len(req.headers) > MAX_HEADERS:
        v.add("headers", f"must be at most {MAX_HEADERS} headers")
    for i, h in enumerate(req.headers[:MAX_HEADERS]):
        name = h.name.lower()
        if not _TOKEN.match(h.name):
            v.add(f"headers[{i}].name", "must be an HTTP header name")
        elif name in FORBIDDEN_REQUEST_HEADERS or name.startswith("proxy-"):
            v.add(f"headers[{i}].name", "is set by the sidecar, not by requests")
        elif name in own_headers:
            v.add(f"headers[{i}].name", "is set by the route, not by requests")
        if any(c in h.value for c in "\r\n\0") or len(h.value) > limits.max_text_bytes:
            v.add(f"headers[{i}].value", "must be one line of at most 4096 bytes")
    if req.HasField("max_retries") and req.max_retries > MAX_CLIENT_RETRIES:
        v.add("max_retries", f"must be at most {MAX_CLIENT_RETRIES}")
    if req.client_retry_count > MAX_CLIENT_RETRIES:
        v.add("client_retry_count", f"must be at most {MAX_CLIENT_RETRIES}")
    v.text("idempotency_key", req.idempotency_key, limits.max_key_bytes)
    if any(c in req.idempotency_key for c in "\r\n\0"):
        v.add("idempotency_key", "must be one line")
    v.require()
    return Request(
        route=req.route,
        path=req.path,
        method=method,
        headers=tuple((h.name, h.value) for h in req.headers),
        body=req.body,
        max_retries=req.max_retries if req.HasField("max_retries") else None,
        client_retry_count=req.client_retry_count,
        idempotency_key=req.idempotency_key,
    )


def _headers(headers: Sequence[tuple[str, str]]) -> list[pb.Header]:
    return [pb.Header(name=n, value=v) for n, v in headers]


def _attempts(attempts: Sequence[Attempt]) -> list[pb.Attempt]:
    return [
        pb.Attempt(
            number=a.number,
            outcome=OUTCOMES[a.cause],  # type: ignore[arg-type]
            status=a.status,
            error=a.error,
            wait_seconds=a.wait,
            upstream_request_id=a.upstream_request_id,
            possibly_executed=a.possibly_executed,
            transparent=a.transparent,
            diagnostic=a.diagnostic,
        )
        for a in attempts
    ]


def _trailers(attempts: Sequence[Attempt]) -> tuple[tuple[str, str], ...]:
    waited = round(sum(a.wait for a in attempts) * 1000)
    return (
        NO_PUSHBACK,
        ("x-providercall-attempts", str(len(attempts))),
        ("x-providercall-retry-delay-ms", str(waited)),
    )


def answer_message(answer: Answer) -> pb.ProviderResponse:
    msg = pb.ProviderResponse(
        status=answer.status,
        headers=_headers(answer.headers),
        body=answer.body,
        attempts=_attempts(answer.attempts),
        stop_reason=STOPS[answer.stop],  # type: ignore[arg-type]
        idempotency_key=answer.idempotency_key,
        retries=answer.retries,
        transparent_retries=answer.transparent_retries,
    )
    if answer.retry_after is not None:
        msg.retry_after_seconds = answer.retry_after
    return msg


def end_message(end: StreamEnd) -> pb.StreamEnd:
    msg = pb.StreamEnd(
        stop_reason=STOPS[end.stop],  # type: ignore[arg-type]
        attempts=_attempts(end.attempts),
        committed=end.committed,
        events_delivered=end.events_delivered,
        error=end.error,
        retryable=end.retryable,
        possibly_executed=end.possibly_executed,
        body=end.body,
        idempotency_key=end.idempotency_key,
        retries=end.retries,
        transparent_retries=end.transparent_retries,
    )
    if end.retry_after is not None:
        msg.retry_after_seconds = end.retry_after
    return msg


class Provider:
    """Servicer of `effectd.v1.Provider`."""

    def __init__(self, client: ProviderClient, limits: Limits) -> None:
        self.client = client
        self._limits = limits

    @property
    def counters(self) -> Counters:
        """Attempts, retries, waits, stop reasons and budget denials."""
        return self.client.counters

    def _request(self, req: pb.ProviderRequest) -> Request:
        route = self.client.routes.get(req.route)
        own = route.own_headers if route is not None else frozenset()
        return request_of(req, self._limits, own)

    async def ProviderCall(
        self, req: pb.ProviderRequest, context: Context
    ) -> pb.ProviderResponse:
        answer = await self.client.call(
            self._request(req), gate.time_remaining(context)
        )
        context.set_trailing_metadata(_trailers(answer.attempts))
        return answer_message(answer)

    async def ProviderStream(
        self, req: pb.ProviderRequest, context: Context
    ) -> AsyncIterator[pb.ProviderStreamMessage]:
        request = self._request(req)
        head: StreamHead | None = None
        stream = self.client.stream(request, gate.time_remaining(context))
        async for item in stream:
            if isinstance(item, StreamHead):
                # Sent with the first message only (§10.5: nothing before it).
                head = item
                continue
            msg = pb.ProviderStreamMessage()
            if head is not None:
                msg.head.status = head.status
                msg.head.headers.extend(_headers(head.headers))
                head = None
            if isinstance(item, Events):
                msg.events.extend(
                    pb.SseEvent(event=e.event, data=e.data, id=e.id)
                    for e in item.events
                )
            elif isinstance(item, StreamEnd):
                msg.end.CopyFrom(end_message(item))
                context.set_trailing_metadata(_trailers(item.attempts))
            yield msg
