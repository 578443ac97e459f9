"""The HTTP side of provider calls: one retry loop over one httpx client.

`ProviderClient.call` sends a request and reads its answer whole;
`ProviderClient.stream` forwards server-sent events and retries only until
the first real event (the commit point, provider-retries §10.5). Both apply the
pure rules of `sidecar.provider.policy` under the host-wide budget, with the
clock, the sleep and the random source injected, so tests never sleep.
Upstream answers are data (`Answer`, `StreamEnd`); a call without any HTTP
answer raises an `UpstreamFailed`. Credentials go into upstream requests
only, never into answers, logs or errors.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import httpx

from sidecar.clock import Clock
from sidecar.errors import (
    RetryBudgetExhausted,
    UpstreamDeadlineExceeded,
    UpstreamFailed,
    UpstreamUnavailable,
)
from sidecar.observability import trace
from sidecar.provider import policy
from sidecar.provider.budget import RetryBudget
from sidecar.provider.policy import Cause, Outcome, Random, Stop
from sidecar.provider.routes import Route, RouteEffect, resolve
from sidecar.provider.sse import Event, EventTooLarge, Parser

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
Headers = tuple[tuple[str, str], ...]

MAX_RESPONSE_BYTES = 4 << 20
# Upstream reads a committed stream may be ahead of the agent.
FORWARD_QUEUE = 256
CONNECT_TIMEOUT = 5.0
# Answer before the gRPC deadline passes, so the agent gets our status.
REPLY_MARGIN = 0.05
REQUEST_ID_HEADERS = ("x-request-id", "request-id")
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
FORBIDDEN_REQUEST_HEADERS = HOP_BY_HOP | {"host", "content-length"}
# An agent's own credentials: never sent upstream, whatever header the route
# puts its credential in (DESIGN §9: provider keys live in the sidecar).
CREDENTIAL_HEADERS = frozenset(
    {
        "authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "ocp-apim-subscription-key",
        "cookie",
    }
)


@dataclass(frozen=True, slots=True)
class Request:
    """One logical provider request, as validated by the gRPC boundary."""

    route: str
    path: str
    method: str = "POST"
    headers: Headers = ()
    body: bytes = b""
    max_retries: int | None = None
    client_retry_count: int = 0
    idempotency_key: str = ""


@dataclass(slots=True)
class Attempt:
    number: int
    cause: Cause
    status: int = 0
    error: str = ""
    wait: float = 0.0
    upstream_request_id: str = ""
    possibly_executed: bool = False
    transparent: bool = False
    diagnostic: str = ""


@dataclass(frozen=True, slots=True)
class Answer:
    """An upstream HTTP answer after the retries, whatever its status."""

    status: int
    headers: Headers
    body: bytes
    attempts: tuple[Attempt, ...]
    stop: Stop
    retry_after: float | None
    idempotency_key: str
    retries: int
    transparent_retries: int


@dataclass(frozen=True, slots=True)
class StreamHead:
    status: int
    headers: Headers


@dataclass(frozen=True, slots=True)
class StreamEnd:
    stop: Stop
    attempts: tuple[Attempt, ...]
    committed: bool
    events_delivered: int
    idempotency_key: str
    retries: int
    transparent_retries: int
    error: str = ""
    retryable: bool = False
    possibly_executed: bool = False
    retry_after: float | None = None
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Events:
    """The events of one upstream read, in order; never held for others."""

    events: tuple[Event, ...]


StreamItem = StreamHead | Events | StreamEnd


@dataclass(slots=True)
class Counters:
    """In-process counters (provider-retries §10.8); exported later."""

    attempts: int = 0
    retries: int = 0
    transparent_retries: int = 0
    wait_seconds: float = 0.0
    stops: collections.Counter[str] = field(default_factory=collections.Counter)
    budget_denied: int = 0
    stream_pre_commit_retries: int = 0
    possibly_executed: int = 0
    # (route name, "attempts" | "retries" | "transparent_retries" |
    # "budget_denied") -> count: the same events per route, for metrics.
    by_route: collections.Counter[tuple[str, str]] = field(
        default_factory=collections.Counter
    )


@dataclass(slots=True)
class _Prepared:
    route: Route
    url: str
    method: str
    headers: list[tuple[str, str]]
    body: bytes
    key: str
    max_retries: int
    replay_safe: bool
    deadline_ns: int


@dataclass(slots=True)
class _Run:
    attempts: list[Attempt] = field(default_factory=list)
    retries: int = 0
    transparent: int = 0
    # The next attempt is the transparent retry of a provably unsent one.
    next_transparent: bool = False


class _Committed(Exception):
    """Internal: a stream attempt reached its first real event."""


@dataclass(slots=True)
class _Open:
    """A stream attempt past the commit point, handed to the forwarder."""

    response: httpx.Response
    parser: Parser
    first: list[Event]
    chunks: AsyncIterator[bytes]


class ProviderClient:
    """Applies the retry policy to provider routes over a shared client."""

    def __init__(
        self,
        routes: Mapping[str, Route],
        http: httpx.AsyncClient,
        clock: Clock,
        *,
        budget: RetryBudget | None = None,
        rng: Random,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.routes = dict(routes)
        self._http = http
        self._clock = clock
        self.budget = budget or RetryBudget(clock)
        self._rng = rng
        self._sleep = sleep
        self.counters = Counters()

    # -- preparation ---------------------------------------------------

    def _prepare(self, request: Request, timeout: float | None) -> _Prepared:
        route, url = resolve(self.routes, request.route, request.path)
        lowered = {n.lower(): v for n, v in request.headers}
        key = request.idempotency_key or lowered.get("idempotency-key", "")
        key = key or str(uuid.uuid4())
        headers = [
            (n, v)
            for n, v in request.headers
            if n.lower() != "idempotency-key" and n.lower() not in CREDENTIAL_HEADERS
        ]
        headers += list(route.headers.items())
        if route.credential_header:
            headers.append((route.credential_header, route.credential))
        if route.honours_idempotency_key:
            headers.append(("Idempotency-Key", key))
        context = trace.current()
        if context is not None and trace.TRACEPARENT not in lowered:
            # W3C Trace Context: the upstream's spans join the agent's trace.
            # One child for the logical request, its retries included.
            headers += [
                (n, v) for n, v in context.child().headers() if n not in lowered
            ]
        method = request.method.upper() or "POST"
        inbound = policy.inbound_retry_count(request.client_retry_count, lowered)
        seconds = policy.DEFAULT_DEADLINE_SECONDS if timeout is None else timeout
        return _Prepared(
            route=route,
            url=url,
            method=method,
            headers=headers,
            body=request.body,
            key=key,
            max_retries=policy.effective_max_retries(
                request.max_retries, route.max_retries, inbound
            ),
            # ADR-010 D4: model inference is retried after an ambiguous
            # failure (with the route's Idempotency-Key where it honours one);
            # a side-effect route is not (provider-retries §12.3).
            replay_safe=route.effect is RouteEffect.INFERENCE,
            deadline_ns=self._clock.monotonic_ns() + int(max(0.0, seconds) * 1e9),
        )

    def _left(self, p: _Prepared) -> float:
        return (p.deadline_ns - self._clock.monotonic_ns()) / 1e9

    def _timeouts(self, p: _Prepared, left: float) -> httpx.Timeout:
        return httpx.Timeout(
            connect=min(CONNECT_TIMEOUT, left),
            read=min(p.route.read_timeout, left),
            write=min(p.route.read_timeout, left),
            pool=min(CONNECT_TIMEOUT, left),
        )

    # -- the retry loop ------------------------------------------------

    async def _loop(
        self,
        p: _Prepared,
        run: _Run,
        attempt: Callable[[float], Awaitable[tuple[Outcome, Attempt]]],
        *,
        stream: bool,
    ) -> tuple[Outcome, policy.Step]:
        """Attempts until a success, a commit (raised by `attempt`) or a stop;
        a cancellation stops at once, wherever it comes (§10.2 row 1)."""
        try:
            return await self._attempts(p, run, attempt, stream=stream)
        except asyncio.CancelledError:
            self.counters.stops["cancelled"] += 1
            raise

    async def _attempts(
        self,
        p: _Prepared,
        run: _Run,
        attempt: Callable[[float], Awaitable[tuple[Outcome, Attempt]]],
        *,
        stream: bool,
    ) -> tuple[Outcome, policy.Step]:
        self.budget.deposit(p.route.budget_key)
        transparent_used = False
        while True:
            left = self._left(p) - REPLY_MARGIN
            if left <= 0:
                outcome = Outcome(Cause.MAYBE_EXECUTED)
                return outcome, policy.Step(retry=False, stop=Stop.DEADLINE)
            self.counters.attempts += 1
            self.counters.by_route[p.route.name, "attempts"] += 1
            try:
                async with asyncio.timeout(left):
                    outcome, record = await attempt(left)
            except TimeoutError:
                outcome = Outcome(Cause.MAYBE_EXECUTED)
                record = Attempt(0, Cause.MAYBE_EXECUTED, error="deadline")
                record.possibly_executed = True
                self._record(run, record)
                return outcome, policy.Step(retry=False, stop=Stop.DEADLINE)
            self._record(run, record)
            step = policy.decide(
                outcome,
                retries_taken=run.retries,
                max_retries=p.max_retries,
                transparent_used=transparent_used,
                replay_safe=p.replay_safe,
                time_left=self._left(p) - REPLY_MARGIN,
                wall_now=self._clock.wall_ns() / 1e9,
                rng=self._rng,
            )
            record.diagnostic = step.diagnostic
            denied = (
                step.retry
                and not step.transparent
                and not self.budget.withdraw(p.route.budget_key)
            )
            if denied:
                self.counters.budget_denied += 1
                self.counters.by_route[p.route.name, "budget_denied"] += 1
                step = policy.Step(
                    retry=False, stop=Stop.RETRY_BUDGET_EXHAUSTED, hint=step.hint
                )
            if not step.retry:
                return outcome, step
            record.wait = step.delay
            if step.transparent:
                transparent_used = run.next_transparent = True
                run.transparent += 1
                self.counters.transparent_retries += 1
                self.counters.by_route[p.route.name, "transparent_retries"] += 1
            else:
                run.retries += 1
                self.counters.retries += 1
                self.counters.by_route[p.route.name, "retries"] += 1
                if stream:
                    self.counters.stream_pre_commit_retries += 1
            self.counters.wait_seconds += step.delay
            # Before the sleep (stamina semantics); never a header or a body.
            log.info(
                "provider retry scheduled: route=%s attempt=%d cause=%s status=%d "
                "error=%s wait=%.3fs",
                p.route.name,
                record.number + 1,
                record.cause.value,
                record.status,
                record.error or "-",
                step.delay,
                extra={
                    "event": "retry_scheduled",
                    "route": p.route.name,
                    "attempt": record.number + 1,
                    "cause": record.cause.value,
                    "status": record.status,
                    "error": record.error,
                    "upstream_request_id": record.upstream_request_id,
                    "hint": step.hint,
                    "wait_for": step.delay,
                    "waited_so_far": sum(a.wait for a in run.attempts),
                    "transparent": step.transparent,
                },
            )
            await self._sleep(step.delay)

    def _record(self, run: _Run, record: Attempt) -> None:
        record.number = len(run.attempts) + 1
        record.transparent, run.next_transparent = run.next_transparent, False
        if record.possibly_executed:
            self.counters.possibly_executed += 1
        run.attempts.append(record)

    def _finish(self, step: policy.Step) -> Stop:
        stop = step.stop or Stop.NON_RETRYABLE
        self.counters.stops[stop.value] += 1
        return stop

    def _failure(
        self, p: _Prepared, run: _Run, stop: Stop, step: policy.Step
    ) -> UpstreamFailed:
        last = run.attempts[-1] if run.attempts else None
        meta = {
            "route": p.route.name,
            "stopReason": stop.value,
            "attempts": str(len(run.attempts)),
            "lastError": last.error if last else "",
            "idempotencyKey": p.key,
        }
        if stop is Stop.DEADLINE:
            return UpstreamDeadlineExceeded(
                "no upstream answer within the deadline", meta, step.hint
            )
        if stop is Stop.RETRY_BUDGET_EXHAUSTED:
            # The reserve refills 1 credit per second (§10.4).
            return RetryBudgetExhausted(
                "the route's retry budget is exhausted", meta, step.hint or 1.0
            )
        return UpstreamUnavailable(
            f"no upstream answer: {meta['lastError'] or stop.value}", meta, step.hint
        )

    # -- unary ---------------------------------------------------------

    async def call(self, request: Request, timeout: float | None = None) -> Answer:
        """Sends `request` with retries; `timeout` is the seconds left of
        the caller's deadline (None: 600 s)."""
        p = self._prepare(request, timeout)
        run = _Run()
        kept: dict[str, tuple[int, Headers, bytes]] = {}

        async def attempt(left: float) -> tuple[Outcome, Attempt]:
            req = self._http.build_request(
                p.method,
                p.url,
                headers=p.headers,
                content=p.body,
                timeout=self._timeouts(p, left),
            )
            try:
                response = await self._http.send(req, stream=True)
                try:
                    body = await _read(response, MAX_RESPONSE_BYTES)
                finally:
                    await response.aclose()
            except (httpx.HTTPError, httpx.StreamError, ResponseTooLarge) as exc:
                return _transport(exc)
            headers = _answer_headers(response)
            kept["last"] = (response.status_code, headers, body)
            return _response(response, body)

        outcome, step = await self._loop(p, run, attempt, stream=False)
        stop = self._finish(step)
        if outcome.cause is not Cause.RESPONSE:
            raise self._failure(p, run, stop, step)
        status, headers, body = kept["last"]
        return Answer(
            status=status,
            headers=headers,
            body=body,
            attempts=tuple(run.attempts),
            stop=stop,
            retry_after=step.hint if stop is not Stop.SUCCEEDED else None,
            idempotency_key=p.key,
            retries=run.retries,
            transparent_retries=run.transparent,
        )

    # -- streaming -----------------------------------------------------

    async def stream(
        self, request: Request, timeout: float | None = None
    ) -> AsyncIterator[StreamItem]:
        """Forwards the events of `request`; retries only before the first
        real event. The last item is always a `StreamEnd`."""
        p = self._prepare(request, timeout)
        run = _Run()
        held: dict[str, object] = {}

        async def attempt(left: float) -> tuple[Outcome, Attempt]:
            return await self._stream_attempt(p, held, left)

        try:
            outcome, step = await self._loop(p, run, attempt, stream=True)
        except _Committed:
            response_open = held["open"]
            assert isinstance(response_open, _Open)
            self._record(
                run,
                Attempt(
                    0,
                    Cause.RESPONSE,
                    status=response_open.response.status_code,
                    upstream_request_id=_request_id(response_open.response),
                ),
            )
            async for item in self._forward(p, run, held, response_open):
                yield item
            return
        stop = self._finish(step)
        if outcome.cause is Cause.RESPONSE:
            head = held["head"]
            assert isinstance(head, StreamHead)
            yield head
            yield self._end(p, run, stop, step, body=_bytes(held.get("body")))
            return
        if outcome.cause is Cause.ERROR_EVENT:
            head, event = held["head"], held["error_event"]
            assert isinstance(head, StreamHead)
            assert isinstance(event, Event)
            yield head
            yield Events((event,))
            yield self._end(
                p,
                run,
                stop,
                step,
                delivered=1,
                error=outcome.error_type,
                retryable=policy.retryable_outcome(outcome, p.replay_safe),
                possibly_executed=True,
            )
            return
        raise self._failure(p, run, stop, step)

    async def _stream_attempt(
        self, p: _Prepared, held: dict[str, object], left: float
    ) -> tuple[Outcome, Attempt]:
        """One stream attempt up to its first real event (§10.5 S0-S2);
        raises `_Committed` at the commit point."""
        req = self._http.build_request(
            p.method,
            p.url,
            headers=p.headers,
            content=p.body,
            timeout=self._timeouts(p, left),
        )
        try:
            response = await self._http.send(req, stream=True)
        except httpx.HTTPError as exc:
            return _transport(exc)
        try:
            if not 200 <= response.status_code <= 299:
                body = await _read(response, policy.ERROR_BODY_LIMIT, clip=True)
                await response.aclose()
                held["head"] = StreamHead(
                    response.status_code, _answer_headers(response)
                )
                held["body"] = body
                return _response(response, body)
            opened = await _first_event(response)
        except (
            httpx.HTTPError,
            httpx.StreamError,
            EventTooLarge,
            ResponseTooLarge,
        ) as exc:
            await response.aclose()
            outcome, record = _transport(exc)
            record.status = response.status_code
            record.upstream_request_id = _request_id(response)
            return outcome, record
        except BaseException:
            await response.aclose()
            raise
        head = StreamHead(response.status_code, _answer_headers(response))
        held["head"] = head
        first = opened.first[0]
        if policy.is_error_event(first.event, first.data):
            await response.aclose()
            kind = policy.event_error_type(first.data)
            held["error_event"] = first
            record = Attempt(
                0,
                Cause.ERROR_EVENT,
                status=response.status_code,
                error=kind,
                upstream_request_id=_request_id(response),
                possibly_executed=True,
            )
            return Outcome(Cause.ERROR_EVENT, error_type=kind), record
        held["open"] = opened
        raise _Committed

    def _end(
        self,
        p: _Prepared,
        run: _Run,
        stop: Stop,
        step: policy.Step | None,
        *,
        delivered: int = 0,
        committed: bool = False,
        error: str = "",
        retryable: bool = False,
        possibly_executed: bool = False,
        body: bytes = b"",
    ) -> StreamEnd:
        hint = step.hint if step is not None and stop is not Stop.SUCCEEDED else None
        return StreamEnd(
            stop=stop,
            attempts=tuple(run.attempts),
            committed=committed,
            events_delivered=delivered,
            idempotency_key=p.key,
            retries=run.retries,
            transparent_retries=run.transparent,
            error=error,
            retryable=retryable,
            possibly_executed=possibly_executed,
            retry_after=hint,
            body=body,
        )

    async def _forward(
        self, p: _Prepared, run: _Run, held: dict[str, object], opened: _Open
    ) -> AsyncIterator[StreamItem]:
        """S3 COMMITTED: forward events; a failure ends the stream, never a
        retry or a replay (§10.5).

        A reader task fills a bounded queue, so whatever arrived while the
        agent's side was busy goes out in one message: an event waits for
        nobody, and a slow agent slows the upstream read (backpressure).
        """
        delivered = 0
        response = opened.response
        queue: asyncio.Queue[tuple[Event, ...] | BaseException | None] = asyncio.Queue(
            maxsize=FORWARD_QUEUE
        )
        reader = asyncio.create_task(self._pump(p, opened, queue))
        try:
            head = held["head"]
            assert isinstance(head, StreamHead)
            yield head
            first = tuple(e for e in opened.first if not e.keepalive)
            yield Events(first)
            delivered += len(first)
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
                self.counters.stops[Stop.SUCCEEDED.value] += 1
                yield self._end(
                    p, run, Stop.SUCCEEDED, None, delivered=delivered, committed=True
                )
                return
            if not isinstance(last, _STREAM_FAILURES):
                raise last
            deadline = isinstance(last, TimeoutError)
            cause = (
                Cause.MAYBE_EXECUTED if deadline else policy.classify_transport(last)
            )
            self.counters.stops[Stop.COMMITTED.value] += 1
            yield self._end(
                p,
                run,
                Stop.COMMITTED,
                None,
                delivered=delivered,
                committed=True,
                error="deadline" if deadline else type(last).__name__,
                retryable=cause is not Cause.PERMANENT,
                possibly_executed=True,
            )
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            await response.aclose()

    async def _pump(
        self,
        p: _Prepared,
        opened: _Open,
        queue: asyncio.Queue[tuple[Event, ...] | BaseException | None],
    ) -> None:
        """Reads the committed stream into `queue`; ends with None or the error."""
        try:
            async with asyncio.timeout(max(0.0, self._left(p) - REPLY_MARGIN)):
                async for chunk in opened.chunks:
                    batch = tuple(
                        e for e in opened.parser.feed(chunk) if not e.keepalive
                    )
                    if batch:
                        await queue.put(batch)
        except Exception as exc:  # handed to the forwarder, which decides
            await queue.put(exc)
            return
        await queue.put(None)


class ResponseTooLarge(Exception):
    """An upstream answer larger than the sidecar forwards."""


_STREAM_FAILURES = (httpx.HTTPError, httpx.StreamError, EventTooLarge, TimeoutError)


async def _read(response: httpx.Response, limit: int, *, clip: bool = False) -> bytes:
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) > limit:
            if clip:
                return bytes(data[:limit])
            raise ResponseTooLarge(f"the answer is larger than {limit} bytes")
    return bytes(data)


async def _first_event(response: httpx.Response) -> _Open:
    """S2: reads until the first real event; keep-alives do not commit. EOF
    before it is an ambiguous failure."""
    parser = Parser()
    chunks = response.aiter_bytes().__aiter__()
    async for chunk in chunks:
        events = [e for e in parser.feed(chunk) if not e.keepalive]
        if events:
            return _Open(response, parser, events, chunks)
    raise httpx.RemoteProtocolError("the stream ended before its first event")


def _request_id(response: httpx.Response) -> str:
    for name in REQUEST_ID_HEADERS:
        if name in response.headers:
            return response.headers[name]
    return ""


def _answer_headers(response: httpx.Response) -> Headers:
    # The body is answered decoded: its wire length and encoding do not apply.
    return tuple(
        (name, value)
        for name, value in response.headers.multi_items()
        if name.lower() not in HOP_BY_HOP | {"content-length", "content-encoding"}
    )


def _response(response: httpx.Response, body: bytes) -> tuple[Outcome, Attempt]:
    outcome = Outcome(Cause.RESPONSE, response.status_code, response.headers, body)
    record = Attempt(
        0,
        Cause.RESPONSE,
        status=response.status_code,
        upstream_request_id=_request_id(response),
    )
    return outcome, record


def _transport(exc: Exception) -> tuple[Outcome, Attempt]:
    cause = (
        Cause.PERMANENT
        if isinstance(exc, ResponseTooLarge)
        else policy.classify_transport(exc)
    )
    record = Attempt(
        0,
        cause,
        error=type(exc).__name__,
        possibly_executed=cause is Cause.MAYBE_EXECUTED,
    )
    return Outcome(cause), record


def _bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else b""


__all__ = [
    "Answer",
    "Attempt",
    "Counters",
    "Events",
    "ProviderClient",
    "Request",
    "StreamEnd",
    "StreamHead",
    "StreamItem",
]
