"""Per-namespace limits as pure rules: what a write may add to a namespace's
usage, and the token bucket that bounds its request rate.

A quota refuses only growth. A write that creates a record past `open_calls`,
or takes the namespace over `stored_bytes`, is refused before anything is
written; a write that finishes or records work already done (a commit, an
UNKNOWN report, a heartbeat, a start, an approval, a reconciliation, an
acknowledgement) is never refused by a quota, because the tool it describes
has already run, or may run, and its result must always be recordable. The
services decide which writes are checked; this module only says whether a
given growth is allowed.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.config import Quotas
from sidecar.errors import QuotaExceeded, RateLimited

# What a refused namespace is told to wait: a quota frees up when one of its
# calls commits or a checkpoint shrinks, which a second is a fair guess for.
QUOTA_RETRY_SECONDS = 1.0
# Namespaces whose buckets are kept; the least recently seen beyond it is
# forgotten, and comes back with a full bucket.
MAX_TRACKED_NAMESPACES = 10_000


@dataclass(frozen=True, slots=True)
class Usage:
    """What a namespace holds: its calls not yet COMMITTED, the bytes (keys
    and values) of its call records and checkpoints, and apart from those,
    the bytes of its tombstones. Tombstones are the daemon's memory of
    compacted calls: the namespace cannot delete them, so they count against
    no quota; their lifetime bounds them (`ledger.retention`)."""

    open_calls: int = 0
    stored_bytes: int = 0
    tombstone_bytes: int = 0

    def plus(
        self, open_calls: int = 0, stored_bytes: int = 0, tombstone_bytes: int = 0
    ) -> Usage:
        return Usage(
            self.open_calls + open_calls,
            self.stored_bytes + stored_bytes,
            self.tombstone_bytes + tombstone_bytes,
        )


def refuse_growth(
    namespace: str, before: Usage, after: Usage, quotas: Quotas
) -> QuotaExceeded | None:
    """The refusal of a write that takes `namespace` from `before` to `after`,
    or None when it is allowed.

    Only a write that grows a measure past its limit is refused: one that
    shrinks or keeps a measure is allowed even over the limit (a quota lowered
    below the current usage must not block deletes). 0 is unlimited.
    """
    if _grows_over(before.open_calls, after.open_calls, quotas.open_calls):
        return _exceeded(namespace, "open_calls", quotas.open_calls)
    if _grows_over(before.stored_bytes, after.stored_bytes, quotas.stored_bytes):
        return _exceeded(namespace, "stored_bytes", quotas.stored_bytes)
    return None


def _grows_over(before: int, after: int, limit: int) -> bool:
    return limit > 0 and after > before and after > limit


def _exceeded(namespace: str, quota: str, limit: int) -> QuotaExceeded:
    return QuotaExceeded(
        f"namespace {namespace} is at its {quota} quota of {limit}",
        {"quota": quota, "limit": str(limit), "namespace": namespace},
        retry_delay=QUOTA_RETRY_SECONDS,
    )


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    """A token bucket per namespace: `rate` requests per second sustained,
    `burst` at once.

    A namespace seen for the first time (or again after being forgotten) gets
    a full bucket. `burst` 0 means one second's worth of requests (at least
    one), so a rate alone is a usable setting. `rate` 0 is unlimited. Memory
    is bounded: at most `max_namespaces` buckets are kept, the least recently
    used one is forgotten first. Safe to call from several threads.

    Args:
        rate: tokens added per second.
        burst: the bucket's size.
        clock: seconds of a clock that never goes back (`time.monotonic`).
        max_namespaces: how many buckets are kept.
    """

    def __init__(
        self,
        rate: float,
        burst: int,
        clock: Callable[[], float],
        *,
        max_namespaces: int = MAX_TRACKED_NAMESPACES,
    ) -> None:
        if rate < 0 or burst < 0:
            raise ValueError("rate and burst must not be negative")
        if max_namespaces < 1:
            raise ValueError("max_namespaces: must be at least 1")
        self.rate = rate
        self.capacity = float(burst if burst > 0 else max(1, math.ceil(rate)))
        self._clock = clock
        self._max = max_namespaces
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def of(cls, quotas: Quotas, clock: Callable[[], float]) -> RateLimiter:
        """The limiter of the configured `requests_per_second` and `burst`."""
        return cls(quotas.requests_per_second, quotas.burst, clock)

    @property
    def tracked(self) -> int:
        """How many namespaces have a bucket now."""
        return len(self._buckets)

    def admit(self, namespace: str) -> None:
        """Takes one token of `namespace`'s bucket.

        Raises:
            RateLimited: the bucket is empty; `retry_delay` is the time until
                it holds a token again. A refused request takes nothing.
        """
        if self.rate == 0:
            return
        with self._lock:
            now = self._clock()
            bucket = self._buckets.pop(namespace, None)
            if bucket is None:
                bucket = _Bucket(self.capacity, now)
                if len(self._buckets) >= self._max:
                    self._buckets.popitem(last=False)
            elif now > bucket.at:
                # A clock that went back (it should not) adds nothing.
                refill = (now - bucket.at) * self.rate
                bucket.tokens = min(self.capacity, bucket.tokens + refill)
                bucket.at = now
            self._buckets[namespace] = bucket
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return
            missing = 1.0 - bucket.tokens
        raise RateLimited(
            f"namespace {namespace} is over its rate of {self.rate:g} requests/s",
            {"limit": f"{self.rate:g}", "namespace": namespace},
            retry_delay=missing / self.rate,
        )
