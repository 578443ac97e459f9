"""How the PostgreSQL store (`sidecar.storage.postgres.store`) is tuned, and
what its writers count."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sidecar.failpoints import Failpoints
from sidecar.storage.plan_rows import Summarize


@dataclass(frozen=True, slots=True)
class PostgresOptions:
    """Pools, timeouts and retries; see docs/operations.md for sizing."""

    # Writer threads, each with a connection of the write pool; each commits
    # what is queued, up to `max_batch` requests, in one transaction. One
    # writer (LMDB's model) has no conflicts within the daemon.
    writers: int = 1
    max_batch: int = 64
    # Connections for reads (listings, scans, the prepare fast path).
    readers: int = 4
    # Seconds a request waits for a pool connection before UNAVAILABLE.
    pool_timeout: float = 5.0
    # Seconds a pool keeps trying, backing off (1, 2, 4 s...), to replace a
    # connection it lost; then it stops until a request needs a connection,
    # which starts a new try at once. Short, so that the daemon serves again
    # within a few seconds of the database's return, however long it was away
    # (psycopg_pool's default, 5 minutes, lets the backoff grow as long as
    # the outage).
    reconnect_seconds: float = 5.0
    # Seconds a statement may run (the server cancels it): a stuck database
    # answers UNAVAILABLE instead of holding requests forever. None: the
    # server's (or the URL's) setting.
    statement_timeout: float | None = 10.0
    # Attempts of one write function (serialization failures, connections
    # lost before COMMIT), and the seconds they may take together.
    max_attempts: int = 50
    retry_seconds: float = 10.0
    # Executions of one statement after which the driver prepares it on the
    # server (psycopg's `prepare_threshold`); None: never, for a pooler that
    # hands each transaction another server connection (PgBouncer in
    # transaction mode), where a statement prepared on one is unknown on the
    # next.
    prepare_threshold: int | None = 5
    # Shown in pg_stat_activity (the read pool's with "/reads" after it).
    application_name: str = "effectd"
    # Called by a writer after each commit with 1 and the seconds COMMIT took.
    on_commit: Callable[[int, float], None] | None = None
    # A test build's crash points in the write path (`sidecar.failpoints`).
    failpoints: Failpoints | None = None
    # Makes the plan rows (`storage.plan_rows`); None: no rows are written.
    summarize: Summarize | None = None


@dataclass(slots=True)
class PgStats:
    """What the writers have done; read by tests and metrics."""

    transactions: int = 0
    writes: int = 0
    largest_batch: int = 0
    # Batches run again after a conflict (a unique violation of a key read
    # absent, a deadlock) or a connection lost before COMMIT.
    retries: int = 0
    # Functions put off to run alone (`views.Alone`).
    alone: int = 0
    # COMMITs lost with their connection, and what `pg_xact_status` said.
    commits_resolved: int = 0
    commits_unknown: int = 0
