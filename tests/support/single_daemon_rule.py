"""BROKEN on purpose: a daemon of a shared store that judges it as exclusive,
the single-daemon rule under which every other incarnation is an earlier
one, gone: its start settles the live calls of every other daemon.

Run as `python -m tests.support.single_daemon_rule serve --store URL ...`.
The many-daemon process test must catch it.
"""

from __future__ import annotations

from sidecar import cli, server
from sidecar.rpc import summaries
from sidecar.storage.api import Store
from sidecar.storage.postgres.options import PostgresOptions
from sidecar.storage.postgres.store import PostgresStore


class ExclusivePostgresStore(PostgresStore):
    @property
    def exclusive(self) -> bool:
        return True


class SingleDaemonRuleDaemon(server.Daemon):
    def open_store(self) -> Store:
        assert self.config.store is not None
        return ExclusivePostgresStore(
            self.config.store, PostgresOptions(summarize=summaries.summarize)
        )


if __name__ == "__main__":
    raise SystemExit(cli.main(daemon_class=SingleDaemonRuleDaemon))
