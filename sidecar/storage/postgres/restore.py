"""Marking a PostgreSQL store restored by the database's own tools
(`effectd ctl restore NAME --store URL`).

`pg_restore`, or a point-in-time recovery, brings back an earlier state of
the ledger, and nothing in it says so: a call PREPARED then, and started and
run since, would answer EXECUTE again. This marks the restored database as
`effectd ctl restore` marks an LMDB copy (`storage.marking.mark`): every call
not COMMITTED turned UNKNOWN, the checkpoint revision sequence moved ahead,
the marker and its audit entry. No daemon may serve the database meanwhile:
the marking is refused while any registration it holds is live (a daemon
serving it, or one restored from the backup whose registration has not
lapsed yet), and a daemon refuses to start from the marking's first
transaction to its last (the check and the start's registration both scan
the registrations, so each runs alone holding their lock: a start racing
the marking cannot slip between them; `sidecar.storage.postgres.store`).
The database itself keeps the marking consistent: each batch is one
transaction, the calls it marks locked as it reads them, and a marking that
stopped half way (daemons still refuse to start) is finished by running it
again (calls already UNKNOWN stay as they are).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from sidecar.clock import Clock
from sidecar.errors import StorageUnavailable
from sidecar.ledger import ownership
from sidecar.ledger.ownership import Registration, Standing
from sidecar.ledger.restore import Marker
from sidecar.storage import daemons
from sidecar.storage.api import ReadView
from sidecar.storage.marking import RestoreRefused, mark
from sidecar.storage.postgres.schema import SchemaError


def _utc(wall_ns: int) -> str:
    moment = datetime.fromtimestamp(wall_ns / 1e9, UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _seconds(ns: int) -> str:
    return f"{max(0, math.ceil(ns / 1e9))} s"


def _lapses(reg: Registration, wall_ns: int) -> str:
    """A live registration, and when it lapses unless its daemon renews it."""
    return (
        f"{reg.daemon_id} (incarnation {reg.incarnation}, lapses at "
        f"{_utc(reg.expires_ns)} unless renewed, in "
        f"{_seconds(reg.expires_ns - wall_ns)})"
    )


def _live(regs: list[Registration], wall_ns: int) -> list[Registration]:
    return [r for r in regs if ownership.standing(r, wall_ns=wall_ns) is Standing.LIVE]


def mark_database(
    url: str, backup: str, *, actor: str, reason: str, clock: Clock
) -> Marker:
    """Marks the store at `url`, restored from `backup` (a name kept in the
    marker and the audit entry), restored.

    Raises:
        RestoreRefused: the database is unreachable, holds no schema of this
            effectd's version, or a daemon's registration in it is live;
            nothing was changed then.
    """
    # Imported here: the command line of an LMDB store loads no driver.
    import psycopg  # noqa: PLC0415

    from sidecar.storage.postgres.store import PostgresStore  # noqa: PLC0415

    try:
        store = PostgresStore(url)
    except (SchemaError, StorageUnavailable, psycopg.Error) as exc:
        raise RestoreRefused(f"the store does not open: {exc}") from None

    def refuse(view: ReadView) -> None:
        # In the marking's first transaction, which records it as begun: a
        # daemon registering meanwhile waits for it (both hold the
        # registrations' lock), and then refuses to start until it ends.
        now = clock.wall_ns()
        live = _live(list(daemons.every(view)), now)
        if live:
            names = "; ".join(_lapses(r, now) for r in live)
            last = max(r.expires_ns for r in live)
            raise RestoreRefused(
                f"daemons are registered live on this database: {names}. Stop "
                "every daemon first (a clean stop ends its registration at "
                "once); a registration restored from the backup is never "
                f"renewed and lapses by itself: run the restore again after "
                f"{_utc(last)} (in {_seconds(last - now)})"
            )

    try:
        return mark(
            store, backup, actor=actor, reason=reason, clock=clock, refuse=refuse
        )
    finally:
        store.close()
