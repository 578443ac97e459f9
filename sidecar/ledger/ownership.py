"""Who holds a STARTED call, and whether its holder still runs: the rules of
several daemons sharing one store (contract §4.4 "started under an earlier
daemon incarnation", ADR-010 D3).

Every open of a store is an incarnation, unique among every daemon that ever
opened that store. A daemon registers its incarnation (`Registration`) and
renews the registration's wall-clock expiry while it serves. A call's
current attempt belongs to the incarnation that granted its lease (start,
retry or heartbeat: the lease records it), and `judge` says whether that
lease is still live for the daemon that looks at it:

- The holder itself judges on its own monotonic clock, as a lone daemon
  always did.
- On an exclusive store (LMDB: one daemon at a time, by the data directory's
  lock) every other incarnation is an earlier one, gone: its leases are dead
  (RESTARTED), whatever the registrations say.
- On a shared store another daemon judges on wall time: the lease is dead
  when the holder's registration ended by a restart of the same daemon
  (RESTARTED), lapsed, ended at a clean stop or is gone (LAPSED), and
  otherwise lives until its wall-clock end plus `CLOCK_SKEW_NS` (EXPIRED
  after). A live registration of the holder never lets another daemon settle
  a lease its holder still counts as running, up to the skew between clocks.

A periodic pass (retention, the lease sweep) runs once across daemons: the daemon
that claims its `PassLock` runs it, and the others skip it until the lock's
wall-clock end, or earlier once its holder is gone. The lock spares work and
does not guard correctness: each batch of a pass judges every record again
in its own write transaction.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from sidecar.ledger.model import Lease

# How far apart the wall clocks of daemons sharing a store may be: another
# daemon waits this long past a lease's wall-clock end before it calls the
# lease expired, so a holder whose clock runs behind is not cut short.
CLOCK_SKEW_NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Registration:
    """One incarnation of a daemon serving a store, as the store keeps it."""

    # Names the daemon across its restarts (host and socket by default).
    daemon_id: str
    incarnation: int
    registered_ns: int
    # Wall-clock end of the registration unless renewed before.
    expires_ns: int
    # Wall time the registration ended (a clean stop, or a restart of the
    # same daemon); 0 while it serves.
    ended_ns: int = 0
    # The incarnation of the same daemon that ended it at its start; 0 when
    # not superseded.
    superseded_by: int = 0
    # Wall time of its latest renewal; 0 while never renewed.
    renewed_ns: int = 0

    def live(self, wall_ns: int) -> bool:
        return self.ended_ns == 0 and wall_ns < self.expires_ns

    @property
    def vouched_ns(self) -> int:
        """When it last vouched for its leases: its latest renewal, else its
        registration."""
        return self.renewed_ns or self.registered_ns

    @property
    def gone_since_ns(self) -> int:
        """When it stopped vouching for its leases: its end, else its expiry."""
        if self.ended_ns:
            return min(self.ended_ns, self.expires_ns)
        return self.expires_ns


class Standing(enum.Enum):
    """Where a registration stands, for an operator reading the table."""

    # Renewed in time: its daemon serves and vouches for its leases.
    LIVE = "live"
    # Not renewed in time and never ended: its daemon died or lost the store.
    LAPSED = "lapsed"
    # Ended at a clean stop.
    ENDED = "ended"
    # Ended by a later start under the same daemon id (a restart).
    SUPERSEDED = "superseded"


def standing(reg: Registration, *, wall_ns: int) -> Standing:
    """Where `reg` stands at wall time `wall_ns`; its leases are judged live
    by other daemons only while it is LIVE (`judge`)."""
    if reg.superseded_by:
        return Standing.SUPERSEDED
    if reg.ended_ns:
        return Standing.ENDED
    return Standing.LIVE if reg.live(wall_ns) else Standing.LAPSED


class Peers(Protocol):
    """The registrations of the daemons sharing a store, as a rule reads them
    (in the same transaction as the record it judges)."""

    def registration(self, incarnation: int) -> Registration | None: ...


@dataclass(frozen=True, slots=True)
class KnownPeers:
    """`Peers` from a fixed set of registrations (a snapshot, a test)."""

    registrations: tuple[Registration, ...] = ()

    def registration(self, incarnation: int) -> Registration | None:
        for reg in self.registrations:
            if reg.incarnation == incarnation:
                return reg
        return None


class Verdict(enum.Enum):
    LIVE = "live"
    # The lease ran out.
    EXPIRED = "expired"
    # The daemon that granted it restarted.
    RESTARTED = "restarted"
    # The daemon that granted it stopped renewing its registration, ended it
    # at a clean stop, or is no longer registered.
    LAPSED = "lapsed"


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    # Not LIVE: the wall time from which the outcome is unknown (the lease's
    # end, or the holder's when it was gone earlier), never later than now.
    since_ns: int = 0


def judge(
    lease: Lease,
    *,
    incarnation: int,
    wall_ns: int,
    monotonic_ns: int,
    peers: Peers | None,
    granted_ns: int = 0,
) -> Judgement:
    """Whether `lease` is live for incarnation `incarnation` now; `peers`
    None: the store is exclusive (every other incarnation is gone).
    `granted_ns`: the wall time its holder last vouched for it (the start or
    heartbeat that granted it), before which it cannot have been gone."""
    ended = min(wall_ns, lease.expires_wall_ns)
    if lease.incarnation == incarnation:
        if monotonic_ns < lease.deadline_ns:
            return Judgement(Verdict.LIVE)
        return Judgement(Verdict.EXPIRED, ended)
    if peers is None:
        return Judgement(Verdict.RESTARTED, ended)
    reg = peers.registration(lease.incarnation)
    return _judge_foreign(lease, reg, wall_ns, granted_ns)


def _judge_foreign(
    lease: Lease, reg: Registration | None, wall_ns: int, granted_ns: int
) -> Judgement:
    """A lease of another incarnation on a shared store, whose holder's
    registration is `reg`, judged on wall time."""
    ended = min(wall_ns, lease.expires_wall_ns)
    if reg is None:
        return Judgement(Verdict.LAPSED, ended)
    if reg.superseded_by or not reg.live(wall_ns):
        verdict = Verdict.RESTARTED if reg.superseded_by else Verdict.LAPSED
        # A holder that granted the lease after its registration lapsed (a
        # renewal late, the wall clock stepped ahead) still ran when it did:
        # the outcome is unknown from then at the earliest, so the operator's
        # quarantine counts from no earlier than the attempt itself.
        gone_ns = max(reg.gone_since_ns, granted_ns)
        return Judgement(verdict, min(ended, gone_ns))
    if wall_ns < lease.expires_wall_ns + CLOCK_SKEW_NS:
        return Judgement(Verdict.LIVE)
    return Judgement(Verdict.EXPIRED, ended)


def register(
    existing: Iterable[Registration],
    *,
    daemon_id: str,
    incarnation: int,
    wall_ns: int,
    ttl_ns: int,
    exclusive: bool,
) -> tuple[Registration, list[Registration]]:
    """The registration of a starting daemon, and the earlier ones its start
    ends: those of the same `daemon_id` (its own restart), and on an
    exclusive store every other one (no other daemon can be serving it)."""
    mine = Registration(daemon_id, incarnation, wall_ns, wall_ns + ttl_ns)
    ended = [
        replace(reg, ended_ns=reg.ended_ns or wall_ns, superseded_by=incarnation)
        for reg in existing
        if reg.incarnation != incarnation
        and not reg.superseded_by
        and (exclusive or reg.daemon_id == daemon_id)
    ]
    return mine, ended


def renew(reg: Registration, *, wall_ns: int, ttl_ns: int) -> Registration:
    """`reg` vouching for its leases `ttl_ns` from now. A registration that
    had lapsed serves again; what other daemons settled meanwhile stays
    settled (the caller says so in its log). One superseded by a start under
    the same daemon id stays superseded: that id now names another daemon."""
    if reg.superseded_by:
        return reg
    return replace(reg, expires_ns=wall_ns + ttl_ns, ended_ns=0, renewed_ns=wall_ns)


def end(reg: Registration, *, wall_ns: int) -> Registration:
    """`reg` ended at a clean stop: its leases are dead from now."""
    return replace(reg, ended_ns=reg.ended_ns or wall_ns)


def forgettable(reg: Registration, *, wall_ns: int, keep_ns: int) -> bool:
    """Whether `reg` has been gone for `keep_ns` and may be deleted: a
    missing registration judges its leases as a lapsed one does."""
    return not reg.live(wall_ns) and reg.gone_since_ns + keep_ns <= wall_ns


@dataclass(frozen=True, slots=True)
class PassLock:
    """Which incarnation runs a periodic pass, until when (wall time)."""

    holder: int
    daemon_id: str
    until_ns: int


def may_run(
    lock: PassLock | None, *, incarnation: int, wall_ns: int, peers: Peers | None
) -> bool:
    """Whether incarnation `incarnation` may claim the pass `lock` guards:
    nobody holds it, it holds it itself, the lock ran out, or its holder is
    gone (on an exclusive store, every other holder is)."""
    if lock is None or lock.holder == incarnation or wall_ns >= lock.until_ns:
        return True
    if peers is None:
        return True
    reg = peers.registration(lock.holder)
    return reg is None or not reg.live(wall_ns)


def claim(
    *, incarnation: int, daemon_id: str, wall_ns: int, interval_ns: int
) -> PassLock:
    """The lock of a pass claimed now for one interval: the other daemons skip
    the pass until the claimant's next one."""
    return PassLock(incarnation, daemon_id, wall_ns + interval_ns)
