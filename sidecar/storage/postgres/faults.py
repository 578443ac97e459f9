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

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool, PoolTimeout

from sidecar.errors import StorageUnavailable

log = logging.getLogger(__name__)
_Conn = psycopg.Connection[tuple[object, ...]]

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


def getconn(pool: ConnectionPool[_Conn], timeout: float) -> _Conn:
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


def xact_status(pool: ConnectionPool[_Conn], xid: str) -> str | None:
    """'committed' or 'aborted': what became of the transaction `xid`, asked
    on a connection of `pool`; None when it cannot be learnt (a backend
    still committing is waited for, a bounded while). A pooled connection
    found broken (a restart breaks them with the COMMIT's) has the pool
    checked and the question asked once more."""
    checked = False
    for _ in range(20):
        try:
            with pool.connection() as conn:
                row = conn.execute("SELECT pg_xact_status(%s::xid8)", (xid,)).fetchone()
                rollback(conn)
        except PoolTimeout:
            return None
        except psycopg.Error as exc:
            if checked or not connection_lost(exc):
                return None
            pool.check()
            checked = True
            continue
        status = None if row is None else row[0]
        if status in ("committed", "aborted"):
            return str(status)
        if status != "in progress":
            return None
        time.sleep(0.05)
    return None
