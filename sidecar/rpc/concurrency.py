"""How many RPCs may be in flight, in total and per caller (contract §10.3).

Three pools, so that no caller can take what the others, the health probes,
or the recording of work already done need:

- ordinary calls: at most `total` in flight, at most `per_caller` of one
  caller (the same caller the rate limit charges, `sidecar.rpc.caller.charged`);
- calls that record work already done (`RECORDS_WORK_DONE`): room of their
  own, `total` more, again at most `per_caller` of one caller, so a tool that
  ran can record its result while ordinary calls fill theirs;
- health Watch streams (open to anyone, so charged to the peer they come
  from, not to a caller): at most `per_caller`, at most `WATCHES_PER_PEER` of
  one peer address (every client of the Unix socket is one peer), so that
  one host cannot hold them all. Health Check is never counted;
- session streams: at most `total`, at most `per_caller` of one caller (each
  of their messages takes a slot of its own, like the unary call it stands
  for), so idle streams cannot fill the server's own limit.

Past a limit a call is refused at once (RESOURCE_EXHAUSTED /
CONCURRENCY_LIMITED), never queued. The gRPC server's own limit sits above
the sum (`backstop`), only for what the gate does not see (reflection).
"""

from __future__ import annotations

import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.errors import ConcurrencyLimited
from sidecar.ledger.model import IdentityEnum
from sidecar.ledger.quota import Caller

# Health checks, reflection and calls the gate has not counted yet.
HEADROOM = 64
# Health Watch streams of one peer address (a gRPC client health-checks with
# one per channel).
WATCHES_PER_PEER = 8


class Pool(IdentityEnum):
    ORDINARY = "ordinary"
    RECORDING = "recording"
    HEALTH_WATCH = "health watch"
    SESSION = "session stream"


@dataclass(frozen=True, slots=True)
class Peer:
    """Whom an open call (health Watch) is charged to: the address it came
    from, without its port; "unix" for a client of the Unix socket."""

    address: str

    @classmethod
    def of(cls, peer: str) -> Peer:
        """From gRPC's peer string: `ipv4:127.0.0.1:5555`,
        `ipv6:%5B::1%5D:5555`, `unix:` (or `unix:PATH`)."""
        kind, _, rest = peer.partition(":")
        if kind in ("ipv4", "ipv6"):
            host, _, _ = urllib.parse.unquote(rest).rpartition(":")
            return cls(host.strip("[]") or rest)
        return cls(kind or peer)

    def describe(self) -> dict[str, str]:
        return {"peer": self.address}

    def __str__(self) -> str:
        return f"peer {self.address}"


class Slots:
    """The calls in flight, counted per pool and per caller; one event loop
    uses it, so it needs no lock."""

    def __init__(self, total: int, per_caller: int) -> None:
        if total < 1 or per_caller < 1:
            raise ValueError("total and per_caller must be at least 1")
        self.total = total
        self.per_caller = min(per_caller, total)
        self._in_pool: Counter[Pool] = Counter()
        self._of_caller: Counter[tuple[Pool, Caller | Peer]] = Counter()

    @property
    def backstop(self) -> int:
        """The gRPC server's limit: every pool full, plus headroom."""
        return 3 * self.total + self.per_caller + HEADROOM

    def in_flight(self, pool: Pool) -> int:
        return self._in_pool[pool]

    def take(self, pool: Pool, caller: Caller | Peer) -> Callable[[], None]:
        """Counts one call of `caller` in `pool`; returns what gives the slot
        back (call it exactly once, when the call has ended).

        Raises:
            ConcurrencyLimited: the pool, or the caller's share of it, is full.
        """
        watch = pool is Pool.HEALTH_WATCH
        limit = self.per_caller if watch else self.total
        if self._in_pool[pool] >= limit:
            raise ConcurrencyLimited(
                f"{limit} {pool.value} calls are in flight; try again shortly",
                {"limit": str(limit)},
            )
        key = (pool, caller)
        share = min(WATCHES_PER_PEER, self.per_caller) if watch else self.per_caller
        if self._of_caller[key] >= share:
            raise ConcurrencyLimited(
                f"{caller} has {share} {pool.value} calls in flight; "
                "try again when one ends",
                {"limit": str(share), **caller.describe()},
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
