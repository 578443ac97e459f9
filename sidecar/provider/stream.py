"""A provider stream of server-sent events, and its commit point (§10.5).

An attempt reads up to the first real event (S0-S2; keep-alives do not
commit). Before it, an attempt ends like any other: a non-2xx answer
(`Replied`), a first event that reports an error (`ErrorEvent`), or a
failure (`Unanswered`), and the loop may retry. The first real event is the
commit point (`Opened`): from there a reader task pumps the upstream into a
bounded queue and the forwarder hands out what arrived, in order, until the
stream ends; a failure after it ends the stream, never a retry or a replay
(S3). The last item is always a `StreamEnd`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

import httpx

from sidecar.clock import Clock
from sidecar.provider import policy
from sidecar.provider.attempts import (
    Answered,
    NoAnswer,
    Replied,
    ResponseTooLarge,
    Retrying,
    Tally,
    Unanswered,
    answer_headers,
    attempt_until_done,
    read,
    replied,
    request_id,
    unanswered,
)
from sidecar.provider.messages import Attempt, Events, StreamEnd, StreamHead, StreamItem
from sidecar.provider.policy import Cause, Outcome, Stop
from sidecar.provider.prepare import Prepared
from sidecar.provider.sse import Event, EventTooLarge, Parser

# Upstream reads a committed stream may be ahead of the agent.
FORWARD_QUEUE = 256
_FAILURES = (httpx.HTTPError, httpx.StreamError, EventTooLarge, TimeoutError)
_Queue = asyncio.Queue[tuple[Event, ...] | BaseException | None]


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """A 2xx stream whose first event reports an error; the upstream may
    have executed the request."""

    head: StreamHead
    event: Event
    kind: str
    request_id: str

    def outcome(self) -> Outcome:
        return Outcome(Cause.ERROR_EVENT, error_type=self.kind)

    def record(self) -> Attempt:
        return Attempt(
            0,
            Cause.ERROR_EVENT,
            status=self.head.status,
            error=self.kind,
            upstream_request_id=self.request_id,
            possibly_executed=True,
        )


@dataclass(frozen=True, slots=True)
class Opened:
    """A 2xx stream past its first real event: the commit point."""

    head: StreamHead
    response: httpx.Response
    # Holds what the first event's read brought after it.
    parser: Parser
    first: Event
    chunks: AsyncIterator[bytes]

    def outcome(self) -> Outcome:
        return Outcome(Cause.RESPONSE, self.head.status)

    def record(self) -> Attempt:
        return Attempt(
            0,
            Cause.RESPONSE,
            status=self.head.status,
            upstream_request_id=request_id(self.response),
        )


Tried = Replied | ErrorEvent | Opened


async def forward(
    upstream: httpx.AsyncBaseTransport, p: Prepared, seams: Retrying
) -> AsyncGenerator[StreamItem, None]:
    """The items of the stream `p`; retried only before the commit point."""

    async def send(left: float) -> Tried | Unanswered:
        return await _attempt(upstream, p, left)

    ended: Answered[Tried] | NoAnswer
    ended = await attempt_until_done(p, seams, send, stream=True)
    if not isinstance(ended, Answered):
        seams.observer.call_ended(p.route.name, ended.stop)
        raise ended.error(p)
    last, tally = ended.last, ended.tally
    if isinstance(last, Opened):
        async with contextlib.aclosing(_forward(p, seams, tally, last)) as items:
            async for item in items:
                yield item
        return
    seams.observer.call_ended(p.route.name, ended.stop)
    hint = ended.hint if ended.stop is not Stop.SUCCEEDED else None
    if isinstance(last, Replied):
        yield StreamHead(last.status, last.headers)
        yield _end(p, tally, ended.stop, retry_after=hint, body=last.body)
        return
    yield last.head
    yield Events((last.event,))
    yield _end(
        p,
        tally,
        ended.stop,
        retry_after=hint,
        delivered=1,
        error=last.kind,
        retryable=policy.retryable_outcome(last.outcome(), p.replay_safe),
        possibly_executed=True,
    )


async def _attempt(
    upstream: httpx.AsyncBaseTransport, p: Prepared, left: float
) -> Tried | Unanswered:
    """One attempt up to its first real event (§10.5 S0-S2); EOF before it
    is an ambiguous failure."""
    try:
        response = await upstream.handle_async_request(p.build(left))
    except httpx.HTTPError as exc:
        return unanswered(exc)
    try:
        if not 200 <= response.status_code <= 299:
            body = await read(response, policy.ERROR_BODY_LIMIT, clip=True)
            await response.aclose()
            return replied(response, body)
        parser = Parser()
        chunks = response.aiter_bytes().__aiter__()
        first = await _first_event(parser, chunks)
    except (httpx.HTTPError, httpx.StreamError, EventTooLarge, ResponseTooLarge) as exc:
        await response.aclose()
        return unanswered(exc, response)
    except BaseException:
        await response.aclose()
        raise
    head = StreamHead(response.status_code, answer_headers(response))
    if policy.is_error_event(first.event, first.data):
        await response.aclose()
        kind = policy.event_error_type(first.data)
        return ErrorEvent(head, first, kind, request_id(response))
    return Opened(head, response, parser, first, chunks)


async def _first_event(parser: Parser, chunks: AsyncIterator[bytes]) -> Event:
    """The first real event, parsed as soon as its bytes are in: the rest of
    its read stays in `parser` for the forwarder (a read may bring hundreds
    of events, and the agent waits for the first)."""
    async for chunk in chunks:
        parser.feed(chunk)
        while (event := parser.next()) is not None:
            if not event.keepalive:
                return event
    raise httpx.RemoteProtocolError("the stream ended before its first event")


def _end(
    p: Prepared,
    tally: Tally,
    stop: Stop,
    *,
    retry_after: float | None = None,
    delivered: int = 0,
    committed: bool = False,
    error: str = "",
    retryable: bool = False,
    possibly_executed: bool = False,
    body: bytes = b"",
) -> StreamEnd:
    return StreamEnd(
        stop=stop,
        attempts=tally.attempts,
        committed=committed,
        events_delivered=delivered,
        idempotency_key=p.key,
        retries=tally.retries,
        transparent_retries=tally.transparent,
        error=error,
        retryable=retryable,
        possibly_executed=possibly_executed,
        retry_after=retry_after,
        body=body,
    )


async def _forward(
    p: Prepared, seams: Retrying, tally: Tally, opened: Opened
) -> AsyncGenerator[StreamItem, None]:
    """S3 COMMITTED: forward events; a failure ends the stream, never a
    retry or a replay (§10.5).

    A reader task fills a bounded queue, so whatever arrived while the
    agent's side was busy goes out in one message: an event waits for
    nobody, and a slow agent slows the upstream read (backpressure).
    """
    queue: _Queue = asyncio.Queue(maxsize=FORWARD_QUEUE)
    reader: asyncio.Task[None] | None = None
    try:
        yield opened.head
        # Alone and at once; the reader starts when the agent's side has
        # taken it, so parsing the rest of a large read never delays it.
        yield Events((opened.first,))
        delivered = 1
        reader = asyncio.create_task(_pump(opened, queue, p, seams.clock))
        while True:
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            batch = tuple(e for i in items if isinstance(i, tuple) for e in i)
            if batch:
                yield Events(batch)
                delivered += len(batch)
            last = items[-1]
            if not isinstance(last, tuple):
                break
        if last is None:
            seams.observer.call_ended(p.route.name, Stop.SUCCEEDED)
            yield _end(p, tally, Stop.SUCCEEDED, delivered=delivered, committed=True)
            return
        if not isinstance(last, _FAILURES):
            raise last
        deadline = isinstance(last, TimeoutError)
        cause = Cause.MAYBE_EXECUTED if deadline else policy.classify_transport(last)
        seams.observer.call_ended(p.route.name, Stop.COMMITTED)
        yield _end(
            p,
            tally,
            Stop.COMMITTED,
            delivered=delivered,
            committed=True,
            error="deadline" if deadline else type(last).__name__,
            retryable=cause is not Cause.PERMANENT,
            possibly_executed=True,
        )
    finally:
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        await opened.response.aclose()


async def _pump(opened: Opened, queue: _Queue, p: Prepared, clock: Clock) -> None:
    """Reads the committed stream into `queue` until the deadline; ends with
    None or the error."""
    parser = opened.parser
    try:
        async with asyncio.timeout(max(0.0, p.left(clock))):
            # First the rest of the first event's read, then each read.
            batch = tuple(e for e in parser.events() if not e.keepalive)
            if batch:
                await queue.put(batch)
            async for chunk in opened.chunks:
                parser.feed(chunk)
                batch = tuple(e for e in parser.events() if not e.keepalive)
                if batch:
                    await queue.put(batch)
    except Exception as exc:  # handed to the forwarder, which decides
        await queue.put(exc)
        return
    await queue.put(None)


__all__ = ["FORWARD_QUEUE", "ErrorEvent", "Opened", "forward"]
