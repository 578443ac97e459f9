"""BROKEN on purpose: a daemon of the shared store whose READ COMMITTED
write transactions lock nothing they read (no `FOR UPDATE`, no namespace
lock row, every write an upsert over whatever is stored), so two daemons
both read a call (or a namespace's usage) before either commits, and both
decide on what they read: both start the call, both admit a call past the
quota, both operators' reconciliations are applied.

Each read of a call record or of usage counters in a write pauses a little
(the window the race needs, as `tests.support.race.RacyLedger` has), so the
race tests catch it in a few rounds on any machine. Run as
`python -m tests.support.loose_store serve --store URL ...`: only tests
select it, nothing in effectd does.
"""

from __future__ import annotations

import time

from sidecar import cli, server
from sidecar.rpc import summaries
from sidecar.storage.api import Store, Table
from sidecar.storage.postgres.options import PostgresOptions
from sidecar.storage.postgres.store import PostgresStore
from sidecar.storage.postgres.views import PgWriteView

PAUSE_SECONDS = 0.005


class PausingWriteView(PgWriteView):
    def get(self, table: Table, key: bytes) -> bytes | None:
        found = super().get(table, key)
        if table is Table.CALLS or table is Table.USAGE:
            time.sleep(PAUSE_SECONDS)
        return found


class LoosePostgresStore(PostgresStore):
    locking = False
    write_view = PausingWriteView


class LooseStoreDaemon(server.Daemon):
    def open_store(self) -> Store:
        assert self.config.store is not None
        return LoosePostgresStore(
            self.config.store, PostgresOptions(summarize=summaries.summarize)
        )


if __name__ == "__main__":
    raise SystemExit(cli.main(daemon_class=LooseStoreDaemon))
