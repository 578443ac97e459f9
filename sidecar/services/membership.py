"""This daemon among the daemons that serve one store (`ledger.ownership`).

At start the daemon registers its incarnation under its daemon id, in the
transaction that ends the registrations its start supersedes (its own
earlier incarnations; on an exclusive store, every other one). While it
serves it renews the registration's wall-clock expiry (`sidecar.server`
every third of the registration's lifetime), and at a clean stop it ends
it: from then on, or once the registration lapses because the daemon died,
the calls it held are settled to UNKNOWN by whichever daemon touches them
first. A periodic pass runs under its `PassLock`, claimed in a write
transaction of its own, so that one daemon runs it per interval. `listing`
shows the operator every registration the store keeps, where it stands, and
the STARTED calls each incarnation holds.
"""

from __future__ import annotations

import logging
import socket
from collections import Counter
from dataclasses import dataclass

from sidecar.clock import Clock
from sidecar.config import ServeConfig
from sidecar.errors import UnsupportedKeyScheme
from sidecar.ledger import ownership
from sidecar.ledger.model import State
from sidecar.ledger.ownership import Registration, Standing
from sidecar.services._common import committed, moment
from sidecar.storage.api import LedgerReads, LedgerWrites, Store
from sidecar.storage.scans import Scans

log = logging.getLogger(__name__)

# The claim of the lease sweep keeps the name it is stored under, which
# daemons of earlier versions sharing the store claim too.
LEASE_SWEEP = "settlement"
RETENTION = "retention"
# How long a registration is kept after it ended or lapsed, for whoever
# reads the table; a deleted one judges its leases as a lapsed one does.
KEEP_GONE_NS = 24 * 3600 * 1_000_000_000
DEFAULT_TTL_SECONDS = 15.0


def daemon_id(cfg: ServeConfig) -> str:
    """The configured daemon id, else this host's name and the socket path:
    no two live daemons share both, since the socket's lock is held while a
    daemon serves, and a daemon restarted in place keeps them."""
    if cfg.daemon_id is not None:
        return cfg.daemon_id
    return f"{socket.gethostname()}:{cfg.socket_path.resolve()}"


@dataclass(frozen=True, slots=True)
class Registered:
    """What a start found: this daemon's registration, and those it ended."""

    registration: Registration
    ended: tuple[Registration, ...]


@dataclass(frozen=True, slots=True)
class Member:
    """One registration as an operator reads it."""

    registration: Registration
    standing: Standing
    # STARTED calls whose current lease it granted: the calls its lapse or
    # restart settles to UNKNOWN.
    started_calls: int


@dataclass(frozen=True, slots=True)
class Listing:
    """Every registration of the store, read on one snapshot at `wall_ns`."""

    members: tuple[Member, ...]
    wall_ns: int
    # The answering daemon's incarnation.
    incarnation: int
    # Whether other daemons may serve the store at once.
    shared: bool


def _started_by_incarnation(view: LedgerReads) -> Counter[int]:
    """The STARTED calls per incarnation of their lease: reads the records
    of STARTED calls only (bounded by the open-call quotas)."""
    held: Counter[int] = Counter()
    for key in view.calls_in_state(State.STARTED):
        try:
            call = view.load_call_at(key)
        except UnsupportedKeyScheme:
            continue  # a newer daemon's call: not counted
        if call is not None and call.lease is not None:
            held[call.lease.incarnation] += 1
    return held


class MembershipService:
    """The registration of this daemon in `store`, and its pass locks.

    Args:
        daemon_id: names this daemon across its restarts; no two daemons
            serving the same store at once may share it.
        ttl_seconds: how long a registration vouches for its leases without
            being renewed (the longest another daemon waits after this one
            died before it settles its calls).
    """

    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        daemon_id: str,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        scans: Scans | None = None,
    ) -> None:
        if not ttl_seconds > 0:
            raise ValueError("ttl_seconds: must be positive")
        self._store = store
        self._scans = scans or Scans(store)
        self._clock = clock
        self.daemon_id = daemon_id
        self.ttl_seconds = ttl_seconds
        self._ttl_ns = int(ttl_seconds * 1e9)

    @property
    def renew_interval_seconds(self) -> float:
        """How often `renew` runs: three renewals fit in one lifetime."""
        return self.ttl_seconds / 3

    async def register(self) -> Registered:
        """Registers this incarnation; ends the registrations it supersedes.

        Raises:
            UnfinishedRestore: a marking of the store as restored began and
                has not finished (`effectd ctl restore`); nothing is written.
        """

        def apply(view: LedgerWrites) -> Registered:
            view.refuse_unfinished_restore()
            mine, ended = ownership.register(
                view.registrations(),
                daemon_id=self.daemon_id,
                incarnation=self._store.incarnation,
                wall_ns=self._clock.wall_ns(),
                ttl_ns=self._ttl_ns,
                exclusive=self._store.exclusive,
            )
            for reg in ended:
                view.save_registration(reg)
            view.save_registration(mine)
            return Registered(mine, tuple(ended))

        return await committed(self._store, apply)

    async def renew(self) -> Registration:
        """Moves this registration's expiry a lifetime ahead. One that had
        lapsed or ended serves again (logged: other daemons may have settled
        calls of this one meanwhile); one superseded by a start under the same
        daemon id stays superseded (logged: two daemons share an id)."""

        def apply(view: LedgerWrites) -> tuple[Registration | None, Registration, int]:
            now_ns = self._clock.wall_ns()
            old = view.registration(self._store.incarnation)
            if old is None:
                new = Registration(
                    self.daemon_id,
                    self._store.incarnation,
                    now_ns,
                    now_ns + self._ttl_ns,
                )
            else:
                new = ownership.renew(old, wall_ns=now_ns, ttl_ns=self._ttl_ns)
            if new != old:
                view.save_registration(new)
            return old, new, now_ns

        old, new, now_ns = await committed(self._store, apply)
        if new.superseded_by:
            log.error(
                "daemon %s (incarnation %d) was superseded by incarnation %d "
                "under the same daemon id, so the other daemons settle its calls "
                "to UNKNOWN: give every daemon its own daemon-id",
                self.daemon_id,
                new.incarnation,
                new.superseded_by,
            )
        elif old is None or not old.live(now_ns):
            log.error(
                "the registration of daemon %s (incarnation %d) had lapsed: other "
                "daemons may have settled its STARTED calls to UNKNOWN; renewed",
                self.daemon_id,
                new.incarnation,
            )
        return new

    async def deregister(self) -> None:
        """Ends this registration at a clean stop."""

        def apply(view: LedgerWrites) -> None:
            old = view.registration(self._store.incarnation)
            if old is not None and not old.ended_ns:
                view.save_registration(
                    ownership.end(old, wall_ns=self._clock.wall_ns())
                )

        await committed(self._store, apply)

    async def claim(self, name: str, interval_seconds: float) -> bool:
        """Whether this daemon runs the pass `name` now; if so, the pass is
        its own for `interval_seconds` (the other daemons skip it)."""

        def apply(view: LedgerWrites) -> bool:
            now = moment(self._clock, self._store, view)
            lock = view.pass_lock(name)
            if not ownership.may_run(
                lock, incarnation=now.incarnation, wall_ns=now.wall_ns, peers=now.peers
            ):
                return False
            view.save_pass_lock(
                name,
                ownership.claim(
                    incarnation=now.incarnation,
                    daemon_id=self.daemon_id,
                    wall_ns=now.wall_ns,
                    interval_ns=int(interval_seconds * 1e9),
                ),
            )
            return True

        return await committed(self._store, apply)

    async def forget_gone(self) -> int:
        """Deletes the registrations gone for longer than `KEEP_GONE_NS`."""

        def apply(view: LedgerWrites) -> int:
            now_ns = self._clock.wall_ns()
            gone = [
                reg.incarnation
                for reg in view.registrations()
                if ownership.forgettable(reg, wall_ns=now_ns, keep_ns=KEEP_GONE_NS)
            ]
            for incarnation in gone:
                view.forget_registration(incarnation)
            return len(gone)

        return await committed(self._store, apply)

    async def registrations(self) -> list[Registration]:
        """Every registration the store keeps, oldest incarnation first."""
        return await self._scans.point_read(lambda view: list(view.registrations()))

    async def listing(self) -> Listing:
        """Every registration the store keeps, oldest incarnation first, where
        it stands now and the STARTED calls it holds, from one snapshot read
        on a worker thread."""

        def read(view: LedgerReads) -> Listing:
            now_ns = self._clock.wall_ns()
            held = _started_by_incarnation(view)
            members = tuple(
                Member(
                    reg,
                    ownership.standing(reg, wall_ns=now_ns),
                    held.get(reg.incarnation, 0),
                )
                for reg in view.registrations()
            )
            return Listing(
                members,
                now_ns,
                self._store.incarnation,
                shared=not self._store.exclusive,
            )

        return await self._scans.read(read)
