"""BROKEN on purpose: a daemon that answers before its LMDB commit.

Run as `python -m tests.support.ack_before_commit serve --data-dir D`. The
crash-durability test must catch it: a call acknowledged as committed is
missing after kill -9 and restart.
"""

from __future__ import annotations

import time

from sidecar import cli, server
from sidecar.storage import answers
from sidecar.storage.api import Store
from sidecar.storage.lmdb_store import LmdbOptions, LmdbStore, _Item


class AckBeforeCommitStore(LmdbStore):
    def _commit(self, batch: list[_Item]) -> None:
        with self._env.begin(write=True) as txn:
            outcomes, _ = self._apply(txn, batch)
            answers.settle(outcomes)  # the reply leaves before the commit
            # A real window between the reply and the commit, for kill -9 to land in.
            time.sleep(3.0)


class AckBeforeCommitDaemon(server.Daemon):
    def open_store(self) -> Store:
        options = LmdbOptions(map_size=self.config.map_size, sync=self.config.sync)
        return AckBeforeCommitStore(self.config.data_dir, options)


if __name__ == "__main__":
    raise SystemExit(cli.main(daemon_class=AckBeforeCommitDaemon))
