"""The quota rules as a table, and the rate limiter on the manual clock: a
bucket per caller that refuses with the exact wait, keeps its memory bounded
without handing anyone a fresh bucket early, and does nothing when the rate
is 0."""

from __future__ import annotations

import pytest

from sidecar.clock import ManualClock
from sidecar.errors import QuotaExceeded, RateLimited
from sidecar.ledger.quota import (
    QUOTA_RETRY_SECONDS,
    Caller,
    Quotas,
    RateLimiter,
    Usage,
    refuse_growth,
)

# -- the growth rule ----------------------------------------------------------

LIMITS = Quotas(open_calls=3, stored_bytes=1000)
U = Usage

GROWTH_TABLE: list[tuple[str, Quotas, Usage, Usage, str | None]] = [
    ("under both", LIMITS, U(1, 100), U(2, 300), None),
    ("reaches the open-call limit", LIMITS, U(2, 100), U(3, 300), None),
    ("one past the open-call limit", LIMITS, U(3, 100), U(4, 300), "open_calls"),
    ("reaches the byte limit", LIMITS, U(0, 900), U(0, 1000), None),
    ("one byte over", LIMITS, U(0, 900), U(0, 1001), "stored_bytes"),
    # Only growth is refused: a namespace over a lowered quota can still
    # shrink, and a write that keeps a measure is never blocked by it.
    ("over, shrinking bytes", LIMITS, U(0, 5000), U(0, 4000), None),
    ("over, same bytes", LIMITS, U(0, 5000), U(0, 5000), None),
    ("over open calls, fewer", LIMITS, U(9, 0), U(8, 0), None),
    ("over open calls, bytes grow", LIMITS, U(9, 0), U(9, 10), None),
    ("both over, open calls first", LIMITS, U(3, 990), U(4, 2000), "open_calls"),
    # 0 is unlimited.
    ("unlimited", Quotas(0, 0), U(10**6, 10**12), U(10**6 + 1, 10**13), None),
    ("unlimited calls only", Quotas(0, 10), U(5, 0), U(6, 11), "stored_bytes"),
]


@pytest.mark.parametrize(
    ("quotas", "before", "after", "refused"),
    [row[1:] for row in GROWTH_TABLE],
    ids=[row[0] for row in GROWTH_TABLE],
)
def test_refuse_growth(
    quotas: Quotas, before: Usage, after: Usage, refused: str | None
) -> None:
    """A write is refused exactly when it grows a measure past its limit."""
    got = refuse_growth("ns", before, after, quotas)
    assert (None if got is None else got.metadata["quota"]) == refused


@pytest.mark.parametrize(
    ("quotas", "stored", "over"),
    [
        (LIMITS, 999, 0),
        (LIMITS, 1000, 0),
        # Results committed after their calls were admitted (never refused).
        (LIMITS, 72_000, 71_000),
        (Quotas(stored_bytes=0), 72_000, 0),  # unlimited
    ],
)
def test_bytes_over_the_quota(quotas: Quotas, stored: int, over: int) -> None:
    """How far a namespace is past its byte quota, for the stats."""
    assert quotas.bytes_over(U(0, stored)) == over


def test_a_quota_refusal_names_the_quota_and_asks_to_wait() -> None:
    """The refusal is QUOTA_EXCEEDED with the quota, its limit and the
    namespace in its metadata, and a retry delay."""
    got = refuse_growth("tenant-a", U(3, 0), U(4, 0), LIMITS)
    assert isinstance(got, QuotaExceeded)
    assert got.reason == "QUOTA_EXCEEDED"
    assert got.metadata == {
        "quota": "open_calls",
        "limit": "3",
        "namespace": "tenant-a",
    }
    assert got.retry_delay == QUOTA_RETRY_SECONDS


# -- the rate limiter -------------------------------------------------------------


def seconds(clock: ManualClock) -> float:
    return clock.monotonic_ns() / 1e9


def limiter(
    clock: ManualClock, rate: float = 4.0, burst: int = 2, **kw: int
) -> RateLimiter:
    return RateLimiter(rate, burst, lambda: seconds(clock), **kw)


def admitted(limit: RateLimiter, namespace: str, tries: int) -> int:
    """How many of `tries` requests of a namespace in a row (no time
    passing) are admitted."""
    count = 0
    for _ in range(tries):
        try:
            limit.admit(Caller(namespace=namespace))
        except RateLimited:
            continue
        count += 1
    return count


def refusal(limit: RateLimiter, namespace: str) -> RateLimited:
    with pytest.raises(RateLimited) as info:
        limit.admit(Caller(namespace=namespace))
    return info.value


def test_a_fresh_bucket_admits_the_burst_then_refuses(clock: ManualClock) -> None:
    """A namespace never seen gets `burst` requests at once, then RATE_LIMITED
    with the wait for the next token (1 / rate) and its limit."""
    limit = limiter(clock)
    assert admitted(limit, "a", 2) == 2
    got = refusal(limit, "a")
    assert got.reason == "RATE_LIMITED"
    assert got.retry_delay == 0.25
    assert got.metadata == {"limit": "4", "namespace": "a"}


def test_tokens_come_back_at_the_rate(clock: ManualClock) -> None:
    """After the bucket is empty, one request per 1/rate seconds is admitted,
    and the retry delay counts down to the next token."""
    limit = limiter(clock)
    admitted(limit, "a", 2)
    clock.advance(0.125)
    assert refusal(limit, "a").retry_delay == 0.125
    clock.advance(0.125)
    assert admitted(limit, "a", 5) == 1


def test_a_refused_request_takes_nothing(clock: ManualClock) -> None:
    """Refusals do not push the next token further away: waiting exactly the
    delay of the first refusal is enough, however many were refused."""
    limit = limiter(clock)
    admitted(limit, "a", 2)
    delay = refusal(limit, "a").retry_delay
    assert admitted(limit, "a", 50) == 0
    assert delay is not None
    clock.advance(delay)
    assert admitted(limit, "a", 1) == 1


def test_an_idle_bucket_holds_no_more_than_the_burst(clock: ManualClock) -> None:
    """An hour of silence refills the bucket to `burst`, not to an hour's worth."""
    limit = limiter(clock)
    admitted(limit, "a", 2)
    clock.advance(3600)
    assert admitted(limit, "a", 100) == 2


def test_namespaces_have_their_own_buckets(clock: ManualClock) -> None:
    """One namespace drained to refusal leaves another's requests admitted."""
    limit = limiter(clock)
    assert admitted(limit, "noisy", 100) == 2
    assert admitted(limit, "quiet", 2) == 2


def test_rate_zero_is_unlimited(clock: ManualClock) -> None:
    """Rate 0 admits everything and keeps no bucket."""
    limit = limiter(clock, rate=0, burst=0)
    assert admitted(limit, "a", 1000) == 1000
    assert limit.tracked == 0


@pytest.mark.parametrize(
    ("rate", "capacity"), [(0.5, 1), (1.0, 1), (2.5, 3), (100.0, 100)]
)
def test_burst_zero_is_one_second_of_requests(
    clock: ManualClock, rate: float, capacity: int
) -> None:
    """With burst 0 the bucket holds one second's worth, at least one."""
    limit = limiter(clock, rate=rate, burst=0)
    assert admitted(limit, "a", 1000) == capacity


def test_memory_is_bounded_and_only_refilled_buckets_are_forgotten(
    clock: ManualClock,
) -> None:
    """At most `max_callers` buckets are kept. A new caller past the bound
    takes the place of the least recently seen bucket only once that one
    has refilled (forgetting it then changes nothing); until then new
    callers share one overflow bucket."""
    limit = limiter(clock, max_callers=3)
    for name in ("a", "b", "c"):
        admitted(limit, name, 2)
    assert admitted(limit, "d", 3) == 2  # the overflow bucket
    assert admitted(limit, "e", 1) == 0  # shares it
    assert limit.tracked == 3
    clock.advance(0.5)  # a, b and c refill; the overflow too
    assert admitted(limit, "e", 3) == 2  # takes a's place
    assert limit.tracked == 3
    assert admitted(limit, "b", 3) == 2  # b kept its bucket, refilled
    assert admitted(limit, "c", 3) == 2


def test_a_flood_of_new_callers_neither_grows_the_table_nor_refills_a_bucket(
    clock: ManualClock,
) -> None:
    """A namespace that drained its bucket stays refused however many other
    names are used meanwhile, and the table keeps its bound of 10 000 (issue
    10 item 23: fails before the fix: the least recently seen bucket was
    forgotten whatever it held, so 10 000 made-up names gave the drained
    namespace a full bucket again)."""
    limit = limiter(clock)
    admitted(limit, "drained", 2)
    for i in range(10_050):
        admitted(limit, f"ns-{i}", 1)
    assert limit.tracked == 10_000
    assert admitted(limit, "drained", 2) == 0


def test_callers_are_namespaces_tokens_or_neither(clock: ManualClock) -> None:
    """A token and a namespace of the same name are different callers; the
    refusal names the caller it charged."""
    limit = limiter(clock)
    token, namespace, nobody = Caller(token="x"), Caller(namespace="x"), Caller()
    for caller in (token, namespace, nobody):
        limit.admit(caller)
        limit.admit(caller)
    for caller, named in (
        (token, {"token": "x"}),
        (namespace, {"namespace": "x"}),
        (nobody, {}),
    ):
        with pytest.raises(RateLimited) as info:
            limit.admit(caller)
        assert info.value.metadata == {"limit": "4", **named}


def test_a_clock_going_back_adds_no_tokens() -> None:
    """Time that runs backwards is ignored, and is not counted twice later."""
    now = [100.0]
    limit = RateLimiter(4.0, 2, lambda: now[0])
    admitted(limit, "a", 2)
    now[0] = 50.0
    assert admitted(limit, "a", 5) == 0
    now[0] = 100.25
    assert admitted(limit, "a", 5) == 1


def test_of_reads_the_configured_quotas(clock: ManualClock) -> None:
    """`RateLimiter.of` takes `requests_per_second` and `burst`."""
    limit = RateLimiter.of(
        Quotas(requests_per_second=10, burst=3), lambda: seconds(clock)
    )
    assert (limit.rate, limit.capacity) == (10, 3)
    assert admitted(limit, "a", 10) == 3


@pytest.mark.parametrize(
    ("rate", "burst", "max_callers"), [(-1, 0, 1), (1, -1, 1), (1, 1, 0)]
)
def test_nonsense_settings_are_refused(
    rate: float, burst: int, max_callers: int
) -> None:
    """Negative rates or bursts and an empty bound are programming errors."""
    with pytest.raises(ValueError, match="must"):
        RateLimiter(rate, burst, lambda: 0.0, max_callers=max_callers)
