"""Per-namespace limits as pure rules: what a write may add to a namespace's
usage, and the token bucket that bounds a caller's request rate.

A quota refuses only growth. A write that creates a record past `open_calls`,
or takes the namespace over `stored_bytes`, is refused before anything is
written; a write that finishes or records work already done (a commit, an
UNKNOWN report, a heartbeat, a start, an approval, a reconciliation, an
acknowledgement) is never refused by a quota, because the tool it describes
has already run, or may run, and its result must always be recordable. What
it records counts all the same, so a namespace can end up past its byte
quota (`Quotas.bytes_over`): every growth is refused then, until retention
shrinks it. The services decide which writes are checked; this module only
says whether a given growth is allowed.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.errors import QuotaExceeded, RateLimited

# What a refused namespace is told to wait: a quota frees up when one of its
# calls commits or a checkpoint shrinks, which a second is a fair guess for.
QUOTA_RETRY_SECONDS = 1.0
# Callers whose buckets are kept (see `RateLimiter`).
MAX_TRACKED_CALLERS = 10_000


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


@dataclass(frozen=True, slots=True)
class StoreFill:
    """How full a store is. A write that needs more than the map has left is
    refused (STORAGE_FULL): alert on `used_bytes / map_size_bytes`."""

    # Pages that hold data: every table's B-tree, and the meta pages.
    used_bytes: int
    # How far into the map the data file reaches; pages freed inside it are
    # reused before the file grows.
    high_water_bytes: int
    map_size_bytes: int


@dataclass(frozen=True, slots=True)
class DiskSpace:
    """The filesystem of the daemon's data directory, as it is now. On LMDB
    it holds the store: a write the disk has no room for is refused
    (STORAGE_FULL) however far `StoreFill.used_bytes` is from the map, so
    alert on `free_bytes / total_bytes` too. On a shared store (PostgreSQL)
    it holds only the socket and its lock."""

    path: str
    holds_store: bool
    # What the daemon's user may still write (not the blocks kept for root).
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True, slots=True)
class Quotas:
    """Per-namespace limits; 0 means unlimited."""

    # Calls not yet COMMITTED (PREPARED, AWAITING_APPROVAL, STARTED, UNKNOWN).
    open_calls: int = 10_000
    # Bytes of records (calls and checkpoints) the namespace keeps stored.
    stored_bytes: int = 1 << 30
    # Sustained requests per second, with `burst` requests of headroom.
    requests_per_second: float = 0.0
    burst: int = 0

    def bytes_over(self, usage: Usage) -> int:
        """How far `usage` is past the stored-bytes quota (0: within it).
        Commits are never refused, so a namespace can get there; its new
        calls are refused until it is back under (`refuse_growth`)."""
        if self.stored_bytes <= 0:
            return 0
        return max(0, usage.stored_bytes - self.stored_bytes)

    @property
    def limits_storage(self) -> bool:
        """Whether a write must read its namespace's usage to be decided: a
        store shared by many writers (PostgreSQL) then serializes the writes
        that grow one namespace, and with both limits 0 it need not."""
        return self.open_calls > 0 or self.stored_bytes > 0


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


@dataclass(frozen=True, slots=True)
class Caller:
    """Whom a request is charged to: a namespace, or a token by its name.

    Neither (the default): requests that name no valid namespace, which
    share one bucket so that made-up names cannot each get one.
    """

    namespace: str = ""
    token: str = ""

    def describe(self) -> dict[str, str]:
        """The ErrorInfo metadata that names the caller."""
        if self.token:
            return {"token": self.token}
        if self.namespace:
            return {"namespace": self.namespace}
        return {}

    def __str__(self) -> str:
        if self.token:
            return f"token {self.token}"
        if self.namespace:
            return f"namespace {self.namespace}"
        return "requests naming no valid namespace"


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float

    def refill(self, now: float, rate: float, capacity: float) -> None:
        # A clock that went back (it should not) adds nothing.
        if now > self.at:
            self.tokens = min(capacity, self.tokens + (now - self.at) * rate)
            self.at = now


class RateLimiter:
    """A token bucket per caller: `rate` requests per second sustained,
    `burst` at once.

    A caller seen for the first time gets a full bucket. `burst` 0 means one
    second's worth of requests (at least one), so a rate alone is a usable
    setting. `rate` 0 is unlimited. Memory is bounded without letting anyone
    escape the limit: at most `max_callers` buckets are kept, and a bucket is
    forgotten only once it has refilled (then it is the same as a new one).
    While every kept bucket still counts something, callers without a bucket
    share one overflow bucket. Safe to call from several threads.

    Args:
        rate: tokens added per second.
        burst: the bucket's size.
        clock: seconds of a clock that never goes back (`time.monotonic`).
        max_callers: how many buckets are kept.
    """

    def __init__(
        self,
        rate: float,
        burst: int,
        clock: Callable[[], float],
        *,
        max_callers: int = MAX_TRACKED_CALLERS,
    ) -> None:
        if rate < 0 or burst < 0:
            raise ValueError("rate and burst must not be negative")
        if max_callers < 1:
            raise ValueError("max_callers: must be at least 1")
        self.rate = rate
        self.capacity = float(burst if burst > 0 else max(1, math.ceil(rate)))
        self._clock = clock
        self._max = max_callers
        self._buckets: OrderedDict[Caller, _Bucket] = OrderedDict()
        self._overflow = _Bucket(self.capacity, clock())
        self._lock = threading.Lock()

    @classmethod
    def of(cls, quotas: Quotas, clock: Callable[[], float]) -> RateLimiter:
        """The limiter of the configured `requests_per_second` and `burst`."""
        return cls(quotas.requests_per_second, quotas.burst, clock)

    @property
    def tracked(self) -> int:
        """How many callers have a bucket of their own now."""
        return len(self._buckets)

    def admit(self, caller: Caller) -> None:
        """Takes one token of `caller`'s bucket.

        Raises:
            RateLimited: the bucket is empty; `retry_delay` is the time until
                it holds a token again. A refused request takes nothing.
        """
        if self.rate == 0:
            return
        with self._lock:
            now = self._clock()
            bucket = self._bucket(caller, now)
            bucket.refill(now, self.rate, self.capacity)
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return
            missing = 1.0 - bucket.tokens
        raise RateLimited(
            f"{caller} is over its rate of {self.rate:g} requests/s",
            {"limit": f"{self.rate:g}", **caller.describe()},
            retry_delay=missing / self.rate,
        )

    def _bucket(self, caller: Caller, now: float) -> _Bucket:
        bucket = self._buckets.get(caller)
        if bucket is not None:
            self._buckets.move_to_end(caller)
            return bucket
        if len(self._buckets) >= self._max:
            oldest_caller, oldest = next(iter(self._buckets.items()))
            oldest.refill(now, self.rate, self.capacity)
            if oldest.tokens < self.capacity:
                # Forgetting it would hand its caller a full bucket again.
                return self._overflow
            del self._buckets[oldest_caller]
        bucket = self._buckets[caller] = _Bucket(self.capacity, now)
        return bucket
