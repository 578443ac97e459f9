"""A provider call read whole: one attempt sends the request and reads its
answer (at most 4 MiB); the loop retries; the last answer, whatever its
status, is the `Answer`, and a call without one raises an `UpstreamFailed`.
"""

from __future__ import annotations

import httpx

from sidecar.provider.attempts import (
    Answered,
    Replied,
    ResponseTooLarge,
    Retrying,
    Unanswered,
    attempt_until_done,
    read,
    replied,
    unanswered,
)
from sidecar.provider.messages import Answer
from sidecar.provider.policy import Stop
from sidecar.provider.prepare import Prepared

MAX_RESPONSE_BYTES = 4 << 20


async def call(
    upstream: httpx.AsyncBaseTransport, p: Prepared, seams: Retrying
) -> Answer:
    """Sends `p` with retries; the answer, or the error of none."""

    async def send(left: float) -> Replied | Unanswered:
        try:
            response = await upstream.handle_async_request(p.build(left))
            try:
                body = await read(response, MAX_RESPONSE_BYTES)
            finally:
                await response.aclose()
        except (httpx.HTTPError, httpx.StreamError, ResponseTooLarge) as exc:
            return unanswered(exc)
        return replied(response, body)

    ended = await attempt_until_done(p, seams, send, stream=False)
    seams.observer.call_ended(p.route.name, ended.stop)
    if not isinstance(ended, Answered):
        raise ended.error(p)
    last, tally = ended.last, ended.tally
    return Answer(
        status=last.status,
        headers=last.headers,
        body=last.body,
        attempts=tally.attempts,
        stop=ended.stop,
        retry_after=ended.hint if ended.stop is not Stop.SUCCEEDED else None,
        idempotency_key=p.key,
        retries=tally.retries,
        transparent_retries=tally.transparent,
    )


__all__ = ["MAX_RESPONSE_BYTES", "call"]
