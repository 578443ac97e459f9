"""The acceptance cases of provider-retries §10.10, against a real HTTP server on
127.0.0.1 scripted by the test, with a manual clock, a fake sleep and a
seeded random source (nothing sleeps for real but the wall-clock test)."""

from __future__ import annotations

import asyncio
import email.utils
import ssl
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import httpx
import pytest

from sidecar.clock import ManualClock, SystemClock
from sidecar.errors import UpstreamDeadlineExceeded, UpstreamUnavailable
from sidecar.provider.budget import RetryBudget
from sidecar.provider.client import ProviderClient
from sidecar.provider.messages import (
    Answer,
    Events,
    StreamEnd,
    StreamHead,
    StreamItem,
)
from sidecar.provider.policy import Cause, Stop
from sidecar.provider.routes import RouteEffect
from tests.provider.support import FakeSleep, monitor, request, route, run
from tests.provider.upstream import Reply, serving


async def _call(client: ProviderClient, _: FakeSleep) -> Answer:
    return await client.call(request(body=b'{"model":"m"}'))


def _date(clock: ManualClock, ahead: float) -> str:
    when = datetime.fromtimestamp(clock.wall_ns() / 1e9 + ahead, tz=UTC)
    return email.utils.format_datetime(when, usegmt=True)


def test_case_1_two_500s_then_200_backs_off_with_jitter() -> None:
    """500, 500, 200 takes 3 attempts, waiting (0.25, 0.5] then (0.5, 1.0]."""
    # provider-retries §10.10 case 1, §10.3
    with serving(Reply(500), Reply(500), Reply(200, body=b'{"ok":true}')) as up:
        answer = run(_call, up.base_url)
    assert (answer.status, answer.body, answer.stop) == (
        200,
        b'{"ok":true}',
        Stop.SUCCEEDED,
    )
    assert [a.status for a in answer.attempts] == [500, 500, 200]
    first, second = answer.attempts[0].wait, answer.attempts[1].wait
    assert 0.25 < first <= 0.5
    assert 0.5 < second <= 1.0
    assert answer.retries == 2
    assert len(up.seen) == 3


def test_case_2_retry_after_seconds_is_never_undercut() -> None:
    """429 with `Retry-After: 3` waits within [3, 3.3], never less than 3 s."""
    # provider-retries §10.10 case 2
    for seed in range(20):
        with serving(Reply(429, [("Retry-After", "3")]), Reply(200)) as up:
            answer = run(_call, up.base_url, seed=seed)
        assert 3.0 <= answer.attempts[0].wait <= 3.3
        assert answer.status == 200


def test_case_3_retry_after_ms_wins_over_retry_after() -> None:
    """`retry-after-ms: 1500` with `Retry-After: 10` waits 1.5 s (+ at most 0.15)."""
    # provider-retries §10.10 case 3, §10.3 server_delay order
    headers = [("retry-after-ms", "1500"), ("Retry-After", "10")]
    with serving(Reply(429, headers), Reply(200)) as up:
        answer = run(_call, up.base_url)
    assert 1.5 <= answer.attempts[0].wait <= 1.65


def test_case_4_http_date_20_seconds_ahead_is_waited() -> None:
    """A Retry-After HTTP-date 20 s ahead of the (injected) wall clock waits ≈ 20 s."""
    # provider-retries §10.10 case 4
    clock = ManualClock()
    with serving(Reply(503, [("Retry-After", _date(clock, 20))]), Reply(200)) as up:
        answer = run(_call, up.base_url, clock=clock)
    assert 20.0 <= answer.attempts[0].wait <= 21.0
    assert answer.status == 200


def test_case_4_http_date_121_seconds_ahead_stops_and_hands_it_back() -> None:
    """A date 121 s ahead (over the 120 s maximum) is not retried: one request,
    the 503 is the answer and `retry_after` ≈ 121."""
    # provider-retries §10.10 case 4, §10.1 retry_after_max
    clock = ManualClock()
    with serving(Reply(503, [("Retry-After", _date(clock, 121))])) as up:
        answer = run(_call, up.base_url, clock=clock)
    assert answer.stop is Stop.RETRY_AFTER_EXCEEDS_MAX
    assert answer.retry_after == pytest.approx(121, abs=1)
    assert answer.status == 503
    assert len(up.seen) == 1


def test_case_5_a_hint_longer_than_the_time_left_stops_at_once() -> None:
    """`Retry-After: 30` with 10 s left: no retry, stop DEADLINE, the hint is
    handed back and no time is spent waiting."""
    # provider-retries §10.10 case 5
    clock = ManualClock()

    async def body(client: ProviderClient, sleep: FakeSleep) -> Answer:
        return await client.call(request(), time_left=10.0)

    with serving(Reply(429, [("Retry-After", "30")])) as up:
        start = clock.monotonic_ns()
        answer = run(body, up.base_url, clock=clock)
    assert answer.stop is Stop.DEADLINE
    assert answer.retry_after == 30.0
    assert (clock.monotonic_ns() - start) / 1e9 < 10
    assert len(up.seen) == 1


@pytest.mark.parametrize(
    "hint",
    ["Fri, 29 Sep 100000 16:26:57 GMT", "inf", "nan", "-5", "0", "", "soon"],
)
def test_case_6_malformed_hints_fall_back_to_backoff(hint: str) -> None:
    """A malformed Retry-After is ignored without an exception: the wait is the
    plain backoff and the first attempt's 503 is kept in the record."""
    # provider-retries §10.10 case 6, §10.3 "never an exception"
    with serving(Reply(503, [("Retry-After", hint)]), Reply(200)) as up:
        answer = run(_call, up.base_url)
    assert 0.25 < answer.attempts[0].wait <= 0.5
    assert answer.attempts[0].status == 503
    assert answer.status == 200


def test_case_6_malformed_hint_on_the_last_attempt_keeps_the_error() -> None:
    """With no retries left, a malformed hint changes nothing: the upstream
    503 is the answer, with no retry_after."""

    # provider-retries §10.10 case 6
    async def body(client: ProviderClient, _: FakeSleep) -> Answer:
        return await client.call(request(max_retries=0))

    with serving(Reply(503, [("Retry-After", "nan")], body=b"busy")) as up:
        answer = run(body, up.base_url)
    assert (answer.status, answer.body, answer.stop) == (503, b"busy", Stop.MAX_RETRIES)
    assert answer.retry_after is None


def test_case_7_x_should_retry_false_vetoes() -> None:
    """503 with `x-should-retry: false` is one attempt, stopped as VETOED."""
    # provider-retries §10.10 case 7, §10.2 row 7
    with serving(Reply(503, [("x-should-retry", "false")])) as up:
        answer = run(_call, up.base_url)
    assert answer.stop is Stop.VETOED
    assert len(answer.attempts) == len(up.seen) == 1


def test_case_7_x_should_retry_true_never_authorizes() -> None:
    """400 with `x-should-retry: true` is one attempt; the hint is recorded as
    a diagnostic only."""
    # provider-retries §10.10 case 7, §10.2 row 8
    with serving(Reply(400, [("x-should-retry", "true")])) as up:
        answer = run(_call, up.base_url)
    assert answer.stop is Stop.NON_RETRYABLE
    assert len(up.seen) == 1
    assert "x-should-retry: true" in answer.attempts[0].diagnostic


@pytest.mark.parametrize(
    "body",
    [
        b'{"error":{"code":"insufficient_quota","type":"insufficient_quota"}}',
        b'{"type":"error","error":{"type":"rate_limit_error",'
        b'"details":{"error_code":"enforced_spend_limit_reached"}}}',
    ],
    ids=["openai", "anthropic"],
)
def test_case_8_quota_429s_are_permanent(body: bytes) -> None:
    """429 `insufficient_quota` / `enforced_spend_limit_reached` is not retried."""
    # provider-retries §10.10 case 8, §10.2 row 6
    with serving(Reply(429, body=body)) as up:
        answer = run(_call, up.base_url)
    assert answer.stop is Stop.NON_RETRYABLE
    assert len(up.seen) == 1


class _Faulty(httpx.AsyncBaseTransport):
    """Raises the scripted errors first, then sends for real."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.real = httpx.AsyncHTTPTransport()
        self.calls = 0

    async def handle_async_request(self, req: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return await self.real.handle_async_request(req)

    async def aclose(self) -> None:
        await self.real.aclose()


def test_case_9_connect_error_is_retried_transparently() -> None:
    """ConnectError then 200: two requests, no counted retry, one transparent
    retry, and no wait."""
    # provider-retries §10.10 case 9, §10.2 row 3
    transport = _Faulty(httpx.ConnectError("refused"))
    with serving(Reply(200)) as up:
        answer = run(_call, up.base_url, transport=transport)
    assert transport.calls == 2
    assert (answer.retries, answer.transparent_retries) == (0, 1)
    assert [a.cause for a in answer.attempts] == [Cause.NEVER_SENT, Cause.RESPONSE]
    assert answer.attempts[1].transparent
    assert answer.attempts[0].wait == 0.0


def test_case_9_certificate_failure_is_one_attempt() -> None:
    """A connect failure caused by certificate verification is permanent: one
    attempt, and a sidecar error (there is no HTTP answer)."""
    # provider-retries §10.10 case 9, §10.2 row 4
    error = httpx.ConnectError("certificate verify failed")
    error.__cause__ = ssl.SSLCertVerificationError("bad cert")
    transport = _Faulty(error)
    with serving(Reply(200)) as up, pytest.raises(UpstreamUnavailable) as caught:
        run(_call, up.base_url, transport=transport)
    assert transport.calls == 1
    assert caught.value.metadata["stopReason"] == "non_retryable"
    assert caught.value.metadata["attempts"] == "1"


def test_case_9_a_refused_port_gets_one_transparent_then_counted_retries() -> None:
    """Against a real closed port: one transparent retry, then the failures
    count as retries until max_retries; the call fails UPSTREAM_UNAVAILABLE."""
    # provider-retries §10.2 row 3 ("afterwards treated as retryable")
    with serving(Reply(200)) as up:
        closed = up.base_url
    with pytest.raises(UpstreamUnavailable) as caught:
        run(_call, closed)
    assert caught.value.metadata["attempts"] == "4"
    assert caught.value.metadata["stopReason"] == "max_retries"
    assert caught.value.metadata["lastError"] == "ConnectError"


def test_case_10_cancel_during_backoff_stops_at_once() -> None:
    """Cancelling during the backoff ends the call within a scheduler tick and
    sends no further request."""
    # provider-retries §10.10 case 10
    sleeping = asyncio.Event()

    async def forever(seconds: float) -> None:
        sleeping.set()
        await asyncio.Event().wait()

    async def body(client: ProviderClient, _: FakeSleep) -> float:
        task = asyncio.create_task(client.call(request()))
        await asyncio.wait_for(sleeping.wait(), 5)
        start = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - start

    watching = monitor()
    with serving(Reply(503)) as up:
        took = run(body, up.base_url, sleep=forever, observer=watching)
        assert len(up.seen) == 1
    assert took < 0.1
    assert watching.counters.stops == {"cancelled": 1}


def test_case_10_cancel_mid_attempt_closes_the_upstream_request() -> None:
    """Cancelling while the upstream has not answered closes the upstream
    connection and sends no retry."""
    # provider-retries §10.10 case 10
    with serving(Reply(hang=True)) as up:

        async def body(client: ProviderClient, _: FakeSleep) -> None:
            task = asyncio.create_task(client.call(request()))
            assert await asyncio.to_thread(up.wait_until, lambda: bool(up.seen))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        run(body, up.base_url)
        assert up.wait_until(lambda: up.disconnects == 1)
        assert len(up.seen) == 1


async def _collect(client: ProviderClient, _: FakeSleep) -> list[StreamItem]:
    return [item async for item in client.stream(request())]


def _events(items: list[StreamItem]) -> list[str]:
    return [e.data for i in items if isinstance(i, Events) for e in i.events]


def _end(items: list[StreamItem]) -> StreamEnd:
    end = items[-1]
    assert isinstance(end, StreamEnd)
    return end


GOOD = Reply(events=[b"data: one\n\n", b"data: two\n\n"])


def test_case_11_disconnect_before_the_first_event_is_retried() -> None:
    """200 then a disconnect before any event is retried on a default route;
    the agent sees only the second attempt's events (issue 10 item 21: fails
    before the fix: only a route honouring Idempotency-Key retried it)."""
    # provider-retries §10.10 case 11, §10.5 S2
    with serving(Reply(events=[], break_off=True), GOOD) as up:
        items = run(_collect, up.base_url)
    assert _events(items) == ["one", "two"]
    end = _end(items)
    assert (end.stop, end.committed, end.events_delivered) == (Stop.SUCCEEDED, True, 2)
    assert [a.cause for a in end.attempts] == [Cause.MAYBE_EXECUTED, Cause.RESPONSE]
    assert isinstance(items[0], StreamHead)


def test_case_11_keepalives_do_not_commit() -> None:
    """Comments, empty lines and `event: ping` before a disconnect do not commit
    the stream: it is retried and no keep-alive is forwarded."""
    # provider-retries §10.5 "keep-alive traffic does not commit"
    keepalive = Reply(
        events=[b": keep-alive\n\n", b"\n\n", b"event: ping\ndata: {}\n\n"],
        break_off=True,
    )
    with serving(keepalive, GOOD) as up:
        items = run(_collect, up.base_url)
    assert _events(items) == ["one", "two"]
    assert len(_end(items).attempts) == 2


def test_case_11_overloaded_first_event_is_retried() -> None:
    """200 whose first event is `overloaded_error` is retried, not forwarded."""
    # provider-retries §10.10 case 11, §10.5 S2
    overloaded = Reply(
        events=[
            b"event: error\n"
            b'data: {"type":"error","error":{"type":"overloaded_error"}}\n\n'
        ]
    )
    with serving(overloaded, GOOD) as up:
        items = run(_collect, up.base_url)
    assert _events(items) == ["one", "two"]
    first = _end(items).attempts[0]
    assert (first.cause, first.error) == (Cause.ERROR_EVENT, "overloaded_error")


def test_case_11_a_permanent_first_error_event_is_forwarded_not_retried() -> None:
    """A first error event that is not transient is forwarded as the terminal
    answer, uncommitted, without a retry."""
    # provider-retries §10.5 S2 "otherwise → forward as terminal error"
    invalid = Reply(
        events=[b'data: {"type":"error","error":{"type":"invalid_request_error"}}\n\n']
    )
    with serving(invalid) as up:
        items = run(_collect, up.base_url)
        assert len(up.seen) == 1
    end = _end(items)
    assert (end.stop, end.committed, end.error) == (
        Stop.NON_RETRYABLE,
        False,
        "invalid_request_error",
    )
    assert len(_events(items)) == 1


def test_case_11_failure_after_the_first_event_is_never_retried() -> None:
    """200, one event delivered, then a disconnect: no retry, no replay, a
    terminal StreamEnd with committed=true and events_delivered=1."""
    # provider-retries §10.10 case 11, §10.5 S3
    with serving(Reply(events=[b"data: one\n\n"], break_off=True), GOOD) as up:
        items = run(_collect, up.base_url)
        assert len(up.seen) == 1
    assert _events(items) == ["one"]
    end = _end(items)
    assert (end.stop, end.committed, end.events_delivered) == (Stop.COMMITTED, True, 1)
    assert end.possibly_executed
    assert end.error == "RemoteProtocolError"


def test_case_12_a_storm_of_503s_stays_within_the_budget() -> None:
    """50 concurrent calls all answered 503: total retries ≤ 0.2·50 + the
    reserve of 10; the others stop with retry_budget_exhausted."""
    # provider-retries §10.10 case 12, §10.4
    clock = ManualClock()

    async def body(client: ProviderClient, _: FakeSleep) -> list[Answer]:
        return list(await asyncio.gather(*(client.call(request()) for _ in range(50))))

    with serving(Reply(503)) as up:
        # The clock stands still: the reserve does not refill during the storm.
        answers = run(body, up.base_url, clock=clock, advance=False)
        requests = len(up.seen)
    retries = sum(a.retries for a in answers)
    assert retries <= 0.2 * 50 + 10
    assert requests == 50 + retries
    stops = {a.stop for a in answers}
    assert Stop.RETRY_BUDGET_EXHAUSTED in stops
    assert stops <= {Stop.RETRY_BUDGET_EXHAUSTED, Stop.MAX_RETRIES}


def test_case_12_negative_control_without_the_budget_retries_double() -> None:
    """Negative control: with an unlimited budget the same storm takes every
    retry (100), so the bound above is the budget's doing."""
    # provider-retries §10.4
    clock = ManualClock()
    unlimited = RetryBudget(clock, reserve_cap=1e9)

    async def body(client: ProviderClient, _: FakeSleep) -> list[Answer]:
        return list(await asyncio.gather(*(client.call(request()) for _ in range(50))))

    with serving(Reply(503)) as up:
        answers = run(body, up.base_url, clock=clock, advance=False, budget=unlimited)
    assert sum(a.retries for a in answers) == 100


def test_case_13_a_silent_upstream_ends_within_the_deadline() -> None:
    """A 2 s deadline with an upstream that never answers ends within the
    deadline plus a small margin (wall clock, real sleeps)."""
    # provider-retries §10.10 case 13
    # A real deadline on a real socket: the wall clock is what is tested.
    with serving(Reply(hang=True)) as up:

        async def main() -> float:
            async with httpx.AsyncHTTPTransport(trust_env=False) as http:
                client = ProviderClient(
                    {"up": route(up.base_url)}, http, SystemClock(), rng=lambda: 0.5
                )
                start = time.monotonic()
                with pytest.raises(UpstreamDeadlineExceeded):
                    await client.call(request(), time_left=2.0)
                return time.monotonic() - start

        took = asyncio.run(asyncio.wait_for(main(), 30))
        assert up.wait_until(lambda: up.disconnects >= 1)
    assert took <= 2.0 + 0.3


def test_case_15_inbound_retry_count_reduces_our_retries() -> None:
    """An inbound `x-stainless-retry-count: 2` leaves no retry of ours: one
    attempt (the amplification guard)."""

    # provider-retries §10.10 case 15, §11 item 3
    async def body(client: ProviderClient, _: FakeSleep) -> Answer:
        return await client.call(request(headers=(("x-stainless-retry-count", "2"),)))

    with serving(Reply(500)) as up:
        answer = run(body, up.base_url)
    assert len(up.seen) == 1
    assert answer.stop is Stop.MAX_RETRIES


def test_case_15_the_request_field_counts_too() -> None:
    """`client_retry_count = 1` leaves one retry of the default two."""

    # provider-retries §11 item 3
    async def body(client: ProviderClient, _: FakeSleep) -> Answer:
        return await client.call(request(client_retry_count=1))

    with serving(Reply(500)) as up:
        run(body, up.base_url)
        assert len(up.seen) == 2


@pytest.mark.parametrize(
    ("cap", "asked", "attempts"),
    [
        (4, 10, 5),  # provider-retries §10.10 case 16: clamped to the ceiling
        (2, 10, 3),  # never above the route's cap
        (2, 0, 1),  # ADR-010 R1: lowered to 0
    ],
)
def test_case_16_max_retries_is_clamped(cap: int, asked: int, attempts: int) -> None:
    """max_retries above the cap is clamped (never more than 5 attempts);
    a request may lower it to 0."""

    # provider-retries §10.10 case 16
    async def body(client: ProviderClient, _: FakeSleep) -> Answer:
        return await client.call(request(max_retries=asked))

    with serving(Reply(500)) as up:
        answer = run(body, up.base_url, max_retries=cap)
        assert len(up.seen) == attempts
    assert len(answer.attempts) == attempts


def test_one_idempotency_key_across_attempts() -> None:
    """Every attempt of one logical request carries the same Idempotency-Key,
    which the answer reports."""
    # provider-retries §10.6, AIP-155
    with serving(Reply(500), Reply(502), Reply(200)) as up:
        answer = run(_call, up.base_url, honours_idempotency_key=True)
        keys = {s.headers["idempotency-key"] for s in up.seen}
    assert keys == {answer.idempotency_key}
    assert len(up.seen) == 3


def test_an_agent_key_is_passed_through_and_not_sent_to_other_routes() -> None:
    """The agent's key is sent unchanged to a route that honours it; a route
    that does not gets no Idempotency-Key at all."""

    # provider-retries §10.6
    async def body(client: ProviderClient, _: FakeSleep) -> Answer:
        return await client.call(request(idempotency_key="run-1:call-7"))

    with serving(Reply(200)) as up:
        answer = run(body, up.base_url, honours_idempotency_key=True)
        assert up.seen[0].headers["idempotency-key"] == "run-1:call-7"
    assert answer.idempotency_key == "run-1:call-7"
    with serving(Reply(200)) as up:
        run(body, up.base_url, honours_idempotency_key=False)
        assert "idempotency-key" not in up.seen[0].headers


@pytest.mark.parametrize(
    "failure",
    [Reply(reset=True), Reply(hang=True)],
    ids=["reset", "read-timeout"],
)
def test_an_ambiguous_failure_of_a_default_post_is_retried(failure: Reply) -> None:
    """A reset or a read timeout after the request was sent may have executed;
    on a default (inference) route a POST is still retried, bounded, and the
    attempt is marked possibly executed (issue 10 item 21: fails before the
    fix: only GET-like methods or an Idempotency-Key route were retried)."""
    # ADR-010 D4 "or on a retryable transport error"; provider-retries §10.2 row 5
    with serving(failure, Reply(200)) as up:
        answer = run(_call, up.base_url, read_timeout=0.2)
        assert len(up.seen) == 2
    assert answer.status == 200
    assert answer.attempts[0].cause is Cause.MAYBE_EXECUTED
    assert answer.attempts[0].possibly_executed
    assert answer.retries == 1


OVERLOADED = Reply(
    events=[
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n\n'
    ]
)
# (first reply, stream?, requests the upstream sees on a side-effect route)
SIDE_EFFECT_CASES = {
    "reset": (Reply(reset=True), False, 1),
    "read-timeout": (Reply(hang=True), False, 1),
    "500": (Reply(500), False, 1),
    "502": (Reply(502), False, 1),
    "503": (Reply(503), False, 1),
    "eof-before-first-event": (Reply(events=[], break_off=True), True, 1),
    "overloaded-first-event": (OVERLOADED, True, 1),
    "429": (Reply(429), False, 2),
    "409": (Reply(409), False, 2),
}


def _send(stream: bool) -> Callable[[ProviderClient, FakeSleep], Awaitable[object]]:
    async def body(client: ProviderClient, _: FakeSleep) -> object:
        try:
            if stream:
                return [i async for i in client.stream(request(body=b"{}"))]
            return await client.call(request(body=b"{}"))
        except UpstreamUnavailable as exc:
            return exc

    return body


@pytest.mark.parametrize("case", SIDE_EFFECT_CASES)
def test_a_side_effect_route_never_replays_what_may_have_executed(case: str) -> None:
    """On a route marked `effect = "side-effect"` an attempt the upstream may
    have executed (reset, read timeout, 5xx, a stream that failed after its 2xx
    head) is never sent again; one it provably did not process (429, 409) is
    (issue 10 item 21: fails before the fix: routes had no effect)."""
    # ADR-010 D1 (no automatic replay of a side effect), D4
    first, stream, expected = SIDE_EFFECT_CASES[case]
    with serving(first, Reply(200), GOOD if stream else Reply(200)) as up:
        run(
            _send(stream), up.base_url, read_timeout=0.2, effect=RouteEffect.SIDE_EFFECT
        )
        assert len(up.seen) == expected


@pytest.mark.parametrize(
    "case", [c for c, (_, _, n) in SIDE_EFFECT_CASES.items() if n == 1]
)
def test_negative_control_an_inference_route_replays_the_same_failures(
    case: str,
) -> None:
    """Negative control: the same failures on a default route are retried, so
    the single request above is the side-effect setting's doing."""
    first, stream, _ = SIDE_EFFECT_CASES[case]
    with serving(first, Reply(200), GOOD if stream else Reply(200)) as up:
        run(_send(stream), up.base_url, read_timeout=0.2)
        assert len(up.seen) > 1


def test_a_side_effect_route_still_retries_a_request_never_sent() -> None:
    """A connect failure proves the request was not sent: its transparent
    retry stays on a side-effect route."""
    # provider-retries §10.2 row 3
    transport = _Faulty(httpx.ConnectError("refused"))
    with serving(Reply(200)) as up:
        answer = run(
            _call, up.base_url, transport=transport, effect=RouteEffect.SIDE_EFFECT
        )
    assert transport.calls == 2
    assert answer.transparent_retries == 1


def test_a_retry_is_logged_before_its_sleep_without_credentials(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One `retry_scheduled` event is logged per retry, before the sleep, and
    no log record carries the credential."""
    # provider-retries §10.8
    order: list[str] = []

    async def recording(seconds: float) -> None:
        order.append(f"sleep {len(caplog.records)}")

    caplog.set_level("INFO", logger="sidecar.provider")
    with serving(Reply(500), Reply(200)) as up:
        run(_call, up.base_url, sleep=recording, observer=monitor())
    scheduled = [
        r for r in caplog.records if getattr(r, "event", "") == "retry_scheduled"
    ]
    assert len(scheduled) == 1
    assert order == ["sleep 1"]
    text = " ".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert "sk-secret-test-key" not in text


def test_counters_count_attempts_waits_stops_and_denials() -> None:
    """The in-process counters see attempts, retries, waits, stop reasons."""
    # provider-retries §10.8
    watching = monitor()
    with serving(Reply(500), Reply(200)) as up:
        run(_call, up.base_url, observer=watching)
    counters = watching.counters
    assert (counters.attempts, counters.retries) == (2, 1)
    assert counters.wait_seconds > 0
    assert counters.stops == {"succeeded": 1}
    assert counters.budget_denied == 0


def test_the_deadline_covers_the_waits() -> None:
    """With 2 s left and 500s, the call retries only while a wait plus a
    minimal attempt still fits, then stops DEADLINE within the 2 s."""
    # provider-retries §10.3 "never sleep past the deadline", §10.1 min_attempt_budget
    clock = ManualClock()

    async def body(client: ProviderClient, _: FakeSleep) -> Answer:
        return await client.call(request(), time_left=2.0)

    with serving(Reply(500)) as up:
        answer = run(body, up.base_url, clock=clock)
        assert len(up.seen) == len(answer.attempts) == 2
    assert answer.stop is Stop.DEADLINE
    assert clock.monotonic_ns() / 1e9 < 2.0


def test_an_oversized_answer_is_refused_not_truncated() -> None:
    """An answer over 4 MiB is a sidecar failure, never a silently cut body."""
    with serving(Reply(200, body=b"x" * ((4 << 20) + 1))) as up:
        with pytest.raises(UpstreamUnavailable) as caught:
            run(_call, up.base_url)
        assert len(up.seen) == 1
    assert caught.value.metadata["lastError"] == "ResponseTooLarge"


def test_a_committed_stream_that_stalls_ends_at_the_deadline() -> None:
    """A stream that stalls after its first event ends at the deadline with a
    committed StreamEnd (real clock): the deadline covers the stream too."""
    # provider-retries §10.1 overall deadline, §10.5 S3
    # A real deadline on a real socket: the wall clock is what is tested.
    with serving(Reply(events=[b"data: one\n\n"], stall=True)) as up:

        async def main() -> tuple[float, list[StreamItem]]:
            async with httpx.AsyncHTTPTransport(trust_env=False) as http:
                client = ProviderClient(
                    {"up": route(up.base_url)}, http, SystemClock(), rng=lambda: 0.5
                )
                start = time.monotonic()
                items = [i async for i in client.stream(request(), time_left=1.5)]
                return time.monotonic() - start, items

        took, items = asyncio.run(asyncio.wait_for(main(), 30))
        assert up.wait_until(lambda: up.disconnects == 1)
    end = _end(items)
    assert (end.stop, end.committed, end.events_delivered, end.error) == (
        Stop.COMMITTED,
        True,
        1,
        "deadline",
    )
    assert took <= 1.5 + 0.3


def test_events_that_arrive_together_go_out_together() -> None:
    """Events of one upstream read are forwarded as one item, in order, and
    keep-alives after the commit point are dropped too."""
    # provider-retries §10.5; provider.proto ProviderStreamMessage.events
    burst = Reply(events=[b"data: a\n\n", b"data: b\n\n: ka\n\ndata: c\n\ndata: d\n\n"])
    with serving(burst) as up:
        items = run(_collect, up.base_url)
    batches = [[e.data for e in i.events] for i in items if isinstance(i, Events)]
    assert batches == [["a"], ["b", "c", "d"]]
