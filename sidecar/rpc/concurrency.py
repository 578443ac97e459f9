"""How many RPCs may be in flight, in total and per caller (contract §10.3).

Three pools, so that no caller can take what the others, the health probes,
or the recording of work already done need:

- ordinary calls: at most `total` in flight, at most `per_caller` of one
  caller (the same caller the rate limit charges, `sidecar.rpc.caller.charged`);
- calls that record work already done (`RECORDS_WORK_DONE`): room of their
  own, `total` more, again at most `per_caller` of one caller, so a tool that
  ran can record its result while ordinary calls fill theirs;
- health Watch streams (open to anyone): at most `per_caller`. Health Check is
  never counted;
- session streams: at most `total`, at most `per_caller` of one caller (each
  of their messages takes a slot of its own, like the unary call it stands
  for), so idle streams cannot fill the server's own limit.

Past a limit a call is refused at once (RESOURCE_EXHAUSTED /
CONCURRENCY_LIMITED), never queued. The gRPC server's own limit sits above
the sum (`backstop`), only for what the gate does not see (reflection).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable

from sidecar.errors import ConcurrencyLimited
from sidecar.ledger.quota import Caller

# Health checks, reflection and calls the gate has not counted yet.
HEADROOM = 64


class Pool(enum.Enum):
    ORDINARY = "ordinary"
    RECORDING = "recording"
    HEALTH_WATCH = "health watch"
    SESSION = "session stream"


class Slots:
    """The calls in flight, counted per pool and per caller; one event loop
    uses it, so it needs no lock."""

    def __init__(self, total: int, per_caller: int) -> None:
        if total < 1 or per_caller < 1:
            raise ValueError("total and per_caller must be at least 1")
        self.total = total
        self.per_caller = min(per_caller, total)
        self._in_pool: Counter[Pool] = Counter()
        self._of_caller: Counter[tuple[Pool, Caller]] = Counter()

    @property
    def backstop(self) -> int:
        """The gRPC server's limit: every pool full, plus headroom."""
        return 3 * self.total + self.per_caller + HEADROOM

    def in_flight(self, pool: Pool) -> int:
        return self._in_pool[pool]

    def take(self, pool: Pool, caller: Caller) -> Callable[[], None]:
        """Counts one call of `caller` in `pool`; returns what gives the slot
        back (call it exactly once, when the call has ended).

        Raises:
            ConcurrencyLimited: the pool, or the caller's share of it, is full.
        """
        limit = self.per_caller if pool is Pool.HEALTH_WATCH else self.total
        if self._in_pool[pool] >= limit:
            raise ConcurrencyLimited(
                f"{limit} {pool.value} calls are in flight; try again shortly",
                {"limit": str(limit)},
            )
        key = (pool, caller)
        if self._of_caller[key] >= self.per_caller:
            raise ConcurrencyLimited(
                f"{caller} has {self.per_caller} {pool.value} calls in flight; "
                "try again when one ends",
                {"limit": str(self.per_caller), **caller.describe()},
            )
        self._in_pool[pool] += 1
        self._of_caller[key] += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self._in_pool[pool] -= 1
            self._of_caller[key] -= 1
            if not self._of_caller[key]:
                del self._of_caller[key]

        return release
