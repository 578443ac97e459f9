"""The `effectd.v1.Provider` service: translation only.

Requests become `sidecar.provider.messages.Request` as they are (the
provider checks them, looks their route up and decides their headers);
answers and stream items become messages. Every answer carries the trailer
`grpc-retry-pushback-ms: -1` (the sidecar has retried already) and the
attempt count and total wait as `x-providercall-*` trailers.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from effectd.v1 import provider_pb2 as pb

from sidecar.provider.client import ProviderClient
from sidecar.provider.messages import (
    Answer,
    Attempt,
    Events,
    Request,
    StreamEnd,
    StreamHead,
)
from sidecar.provider.policy import Cause, Stop
from sidecar.rpc.boundary import time_remaining
from sidecar.rpc.errors import NO_PUSHBACK

Context = grpc.aio.ServicerContext[Any, Any]

STOPS: dict[Stop, int] = {s: pb.StopReason.Value(f"STOP_REASON_{s.name}") for s in Stop}
OUTCOMES: dict[Cause, int] = {
    Cause.RESPONSE: pb.ATTEMPT_OUTCOME_RESPONSE,
    Cause.NEVER_SENT: pb.ATTEMPT_OUTCOME_NEVER_SENT,
    Cause.MAYBE_EXECUTED: pb.ATTEMPT_OUTCOME_MAYBE_EXECUTED,
    Cause.PERMANENT: pb.ATTEMPT_OUTCOME_PERMANENT,
    Cause.ERROR_EVENT: pb.ATTEMPT_OUTCOME_ERROR_EVENT,
}


def request_of(req: pb.ProviderRequest) -> Request:
    """The request as sent; an unset `max_retries` is None."""
    return Request(
        route=req.route,
        path=req.path,
        method=req.method,
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

    def __init__(self, client: ProviderClient) -> None:
        self.client = client

    async def ProviderCall(
        self, req: pb.ProviderRequest, context: Context
    ) -> pb.ProviderResponse:
        answer = await self.client.call(request_of(req), time_remaining(context))
        context.set_trailing_metadata(_trailers(answer.attempts))
        return answer_message(answer)

    async def ProviderStream(
        self, req: pb.ProviderRequest, context: Context
    ) -> AsyncIterator[pb.ProviderStreamMessage]:
        head: StreamHead | None = None
        stream = self.client.stream(request_of(req), time_remaining(context))
        async with contextlib.aclosing(stream) as items:
            async for item in items:
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
