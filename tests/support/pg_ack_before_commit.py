"""BROKEN on purpose: a daemon of the shared store that answers before its
PostgreSQL COMMIT returns, and keeps the answer when the COMMIT then fails.

Run as `python -m tests.support.pg_ack_before_commit serve --store URL ...`.
The database-restart test must catch it: a call acknowledged as committed
is missing once the database came back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg

from sidecar import cli, server
from sidecar.rpc import summaries
from sidecar.storage.api import ReadView, Store
from sidecar.storage.postgres.faults import before_commit, rollback
from sidecar.storage.postgres.options import PostgresOptions
from sidecar.storage.postgres.store import (
    PostgresStore,
    _Conn,
    _Item,
    _Outcome,
)
from sidecar.storage.postgres.views import (
    USAGE_SHARDS,
    Batch,
    DatabaseFailed,
    PgWriteView,
)

T = TypeVar("T")
log = logging.getLogger(__name__)
# A real window between the answers and COMMIT, for a restart to land in:
# long beside the rest of a transaction even on a loaded machine, so that
# nearly every fault lands in one (at 0.3 s, a loaded run once had all six
# faults miss and the control caught nothing).
WINDOW_SECONDS = 0.6


class AckBeforeCommitPgStore(PostgresStore):
    def __init__(self, url: str, options: PostgresOptions) -> None:
        # Held from a batch's answers until its COMMIT returned.
        self._answered = threading.Lock()
        super().__init__(url, options)

    def read(self, fn: Callable[[ReadView], T]) -> T:
        # A read waits for the COMMIT in flight, so that a request after an
        # answered write finds it (as it would once committed): the answer
        # it got is what a restart in the window then loses.
        with self._answered:
            pass
        return super().read(fn)

    def read_point(self, fn: Callable[[ReadView], T]) -> T:
        with self._answered:
            pass
        return super().read_point(fn)

    def _transaction(
        self, conn: _Conn, batch: list[_Item], *, alone: bool = False
    ) -> list[_Outcome]:
        # Nothing is put off to run alone: the batch locks nothing.
        with self._answered:
            return self._answer_then_commit(conn, batch)

    def _answer_then_commit(self, conn: _Conn, batch: list[_Item]) -> list[_Outcome]:
        # One daemon: nothing to lock against.
        written = Batch(locking=False)
        outcomes: list[_Outcome] = []
        try:
            for fn, future in batch:
                view = PgWriteView(conn, written)
                try:
                    value = fn(view)
                except Exception as exc:
                    outcomes.append((future, None, exc))
                    continue
                view.done()
                outcomes.append((future, value, None))
            written.flush(conn, conn.info.backend_pid % USAGE_SHARDS)
        except DatabaseFailed as failed:
            rollback(conn)
            raise before_commit(failed.error) from None
        except psycopg.Error as exc:
            rollback(conn)
            raise before_commit(exc) from None
        for future, value, error in outcomes:  # the answers leave before COMMIT
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)
        time.sleep(WINDOW_SECONDS)
        try:
            conn.commit()
        except psycopg.Error as exc:
            log.warning("COMMIT failed after the answers left: %s", exc)
        return []


class AckBeforeCommitPgDaemon(server.Daemon):
    def open_store(self) -> Store:
        assert self.config.store is not None
        return AckBeforeCommitPgStore(
            self.config.store, PostgresOptions(summarize=summaries.summarize)
        )


if __name__ == "__main__":
    raise SystemExit(cli.main(daemon_class=AckBeforeCommitPgDaemon))
