"""The host-wide retry budget per upstream (provider-retries §10.4).

Finagle-style: every first attempt deposits `ratio` credit that expires
after `ttl` seconds (kept in 1 s buckets); a reserve refills `reserve_rate`
credit per second up to `reserve_cap` and starts full, so a fresh daemon can
retry its first failures; each retry withdraws 1 credit, deposits first. One
budget is shared by every call of a daemon, whatever the agents ask for:
sustained extra load stays below ratio + reserve_rate per upstream.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from sidecar.clock import Clock

RATIO = 0.2
TTL_SECONDS = 10
RESERVE_RATE = 1.0
RESERVE_CAP = 10.0


@dataclass(slots=True)
class _Account:
    reserve: float
    refilled_ns: int
    # (second, credit left) of the unexpired deposits, oldest first.
    buckets: deque[list[float]] = field(default_factory=deque)


class RetryBudget:
    """Credits per upstream key; thread-safe, bounded memory per key."""

    def __init__(
        self,
        clock: Clock,
        *,
        ratio: float = RATIO,
        ttl_seconds: int = TTL_SECONDS,
        reserve_rate: float = RESERVE_RATE,
        reserve_cap: float = RESERVE_CAP,
    ) -> None:
        self._clock = clock
        self._ratio = ratio
        self._ttl = ttl_seconds
        self._rate = reserve_rate
        self._cap = reserve_cap
        self._lock = threading.Lock()
        self._accounts: dict[str, _Account] = {}

    def _account(self, key: str, now_ns: int) -> _Account:
        account = self._accounts.get(key)
        if account is None:
            account = self._accounts[key] = _Account(self._cap, now_ns)
        elapsed = (now_ns - account.refilled_ns) / 1e9
        account.reserve = min(self._cap, account.reserve + elapsed * self._rate)
        account.refilled_ns = now_ns
        second = now_ns // 1_000_000_000
        while account.buckets and account.buckets[0][0] <= second - self._ttl:
            account.buckets.popleft()
        return account

    def deposit(self, key: str) -> None:
        """A first attempt to `key`."""
        now = self._clock.monotonic_ns()
        second = now // 1_000_000_000
        with self._lock:
            account = self._account(key, now)
            if account.buckets and account.buckets[-1][0] == second:
                account.buckets[-1][1] += self._ratio
            else:
                account.buckets.append([float(second), self._ratio])

    def withdraw(self, key: str) -> bool:
        """Takes 1 credit for a retry to `key`; False when there is none."""
        now = self._clock.monotonic_ns()
        with self._lock:
            account = self._account(key, now)
            if sum(b[1] for b in account.buckets) >= 1.0 - 1e-9:
                need = 1.0
                while need > 1e-9 and account.buckets:
                    take = min(need, account.buckets[0][1])
                    account.buckets[0][1] -= take
                    need -= take
                    if account.buckets[0][1] <= 1e-9:
                        account.buckets.popleft()
                return True
            if account.reserve >= 1.0:
                account.reserve -= 1.0
                return True
            return False

    def available(self, key: str) -> float:
        """Credit left for `key` (for the counters)."""
        now = self._clock.monotonic_ns()
        with self._lock:
            account = self._account(key, now)
            return account.reserve + sum(b[1] for b in account.buckets)
