"""How the PostgreSQL store reads a database failure
(`sidecar.storage.postgres.store`): whether the transaction may run again
(a serialization failure, a deadlock, a connection lost before COMMIT), or
the request answers `StorageUnavailable` with ErrorInfo metadata
`mayHaveBeenApplied`, the key the clients read (as the session stream says
it): true only when a COMMIT was sent and its outcome could not be learnt.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import LiteralString, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool, PoolTimeout

from sidecar.errors import StorageUnavailable

log = logging.getLogger(__name__)
_Conn = psycopg.Connection[tuple[object, ...]]
# A pool's connection class (the store's pools make `views.StoreConnection`).
C = TypeVar("C", bound=_Conn)

MAY_HAVE_BEEN_APPLIED = "mayHaveBeenApplied"
# Aborted by the database for another transaction: run the function again.
# A unique violation is another transaction's insert of a key this one read
# absent (`views`: a new key is a plain INSERT), committed first.
CONFLICTS = (
    pg_errors.SerializationFailure,
    pg_errors.DeadlockDetected,
    pg_errors.UniqueViolation,
)
# While waiting for a pooled connection, asked for again this often.
ASK_SECONDS = 1.0
# What became of a transaction, and when the server answering started.
_STATUS_QUERY: LiteralString = (
    "SELECT pg_xact_status(%s::xid8), pg_postmaster_start_time()"
)


def unavailable(message: str, *, applied: bool) -> StorageUnavailable:
    """The failure of a request that was not acknowledged; `applied`: its
    commit's outcome is unknown."""
    return StorageUnavailable(
        message, {MAY_HAVE_BEEN_APPLIED: "true" if applied else "false"}
    )


class Again(Exception):
    """The transaction did not commit and its functions may run again."""


class Failed(Exception):
    """The batch failed as a whole; each request answers StorageUnavailable."""

    def __init__(self, message: str, *, applied: bool) -> None:
        super().__init__(message)
        self.message = message
        self.applied = applied


def rollback(conn: _Conn) -> None:
    # A broken connection cannot roll back: the pool drops it.
    with contextlib.suppress(psycopg.Error):
        conn.rollback()


def connection_lost(exc: psycopg.Error) -> bool:
    """The connection is gone (closed by the server, the network, a restart,
    or a pooler: PgBouncer ends a client's connection whose server connection
    broke with an error of its own, SQLSTATE 08P01 "server conn crashed?")."""
    if isinstance(exc, pg_errors.AdminShutdown | pg_errors.CrashShutdown):
        return True
    return isinstance(exc, psycopg.OperationalError) and (
        exc.sqlstate is None or exc.sqlstate.startswith("08")
    )


def before_commit(exc: psycopg.Error) -> Exception:
    """What a failure before COMMIT means: nothing was committed; a conflict
    or a lost connection is tried again, anything else answered."""
    if isinstance(exc, CONFLICTS) or connection_lost(exc):
        return Again(str(exc))
    if isinstance(exc, pg_errors.QueryCanceled):
        return Failed(f"a PostgreSQL statement timed out: {exc}", applied=False)
    log.error("PostgreSQL refused a write: %s", exc)
    return Failed(f"a PostgreSQL write failed: {exc}", applied=False)


def getconn(pool: ConnectionPool[C], timeout: float) -> C:
    """A connection of `pool` within `timeout` seconds, asked for again every
    ASK_SECONDS: a pool that stopped trying to reconnect (after
    `reconnect_seconds`) starts again only when asked, so a writer that began
    waiting while the database was away is served soon after its return,
    not when its wait ends.

    Raises:
        PoolTimeout: no connection within `timeout`.
    """
    deadline = time.monotonic() + timeout
    while True:
        wait = min(ASK_SECONDS, deadline - time.monotonic())
        try:
            return pool.getconn(timeout=max(wait, 0.0))
        except PoolTimeout:
            if wait < ASK_SECONDS:
                raise


@dataclass(frozen=True, slots=True)
class Xact:
    """A write transaction as the store asks about it once its COMMIT is
    lost: its id, and when the server it ran on started
    (`pg_postmaster_start_time`), both returned by its writes
    (`views._RETURNING`)."""

    xid: str
    server_started: datetime


@dataclass(frozen=True, slots=True)
class Backend:
    """The server process a connection talks to: its id, when it started,
    and when its server started (`views.StoreConnection.backend`,
    `call_saves.settle`)."""

    pid: int
    started: datetime
    server_started: datetime


# The `Backend` of the connection that asks.
BACKEND_QUERY: LiteralString = (
    "SELECT pid, backend_start, pg_postmaster_start_time() FROM pg_stat_activity "
    "WHERE pid = pg_backend_pid()"
)


def backend_of(row: tuple[object, ...] | None) -> Backend | None:
    """The `Backend` of a row of `BACKEND_QUERY` (None: none found)."""
    if row is None:
        return None
    pid, started, server_started = row
    assert isinstance(pid, int), type(pid)
    assert isinstance(started, datetime), type(started)
    assert isinstance(server_started, datetime), type(server_started)
    return Backend(pid, started, server_started)


def xact_of(row: tuple[object, ...] | None) -> Xact:
    """The `Xact` of a row of id and start time."""
    assert row is not None
    xid, started = row
    assert isinstance(started, datetime), type(started)
    return Xact(str(xid), started)


def xact_status(pool: ConnectionPool[C], xact: Xact) -> str | None:
    """'committed' or 'aborted': what became of the transaction `xact`,
    asked on a connection of `pool`; None when it cannot be learnt (a
    backend still committing is waited for, a bounded while). A pooled
    connection found broken (a restart breaks them with the COMMIT's) has
    the pool checked and the question asked once more.

    A server that crashed gives again, after its recovery, every transaction
    id whose records never reached its WAL: the id of a transaction that did
    not commit may name a newer one that did. So 'committed' is believed
    only from the server the transaction ran on, not restarted since; from
    a restarted one it is not known (None). An id the server has not given
    yet ("in the future") is one whose commit no recovery replayed:
    'aborted'."""
    checked = False
    for _ in range(20):
        try:
            with pool.connection() as conn:
                row = conn.execute(_STATUS_QUERY, (xact.xid,)).fetchone()
                rollback(conn)
        except PoolTimeout:
            return None
        except pg_errors.InvalidParameterValue:
            return "aborted"
        except psycopg.Error as exc:
            if checked or not connection_lost(exc):
                return None
            pool.check()
            checked = True
            continue
        status = _status(row, xact)
        if status != "in progress":
            return status
        time.sleep(0.05)
    return None


def _status(row: tuple[object, ...] | None, xact: Xact) -> str | None:
    """What a row of `_STATUS_QUERY` says of `xact` ('in progress': ask
    again)."""
    status, started = (None, None) if row is None else row
    if status == "committed" and started != xact.server_started:
        log.warning(
            "the database restarted since a transaction whose COMMIT was "
            "lost began: its id may now name another transaction"
        )
        return None
    if status in ("committed", "aborted", "in progress"):
        return str(status)
    return None
