"""BROKEN on purpose: the daemon of the crash loop's negative control, which
answers a write before committing it (`tests.support.ack_before_commit`),
with a window short enough for the loop to keep going: its starts and every
write wait WINDOW_SECONDS between the answer and the commit. On PostgreSQL,
the daemon of `tests.support.pg_ack_before_commit`, whose COMMIT a database
restart makes fail after the answers left.

A test module, never installed with the daemon: no setting of a production
daemon can reach it.
"""

from __future__ import annotations

import time

from sidecar import server
from sidecar.rpc import summaries
from sidecar.storage.api import Store
from sidecar.storage.lmdb import answers
from sidecar.storage.lmdb.store import LmdbOptions, _Item
from tests.support.ack_before_commit import AckBeforeCommitStore
from tests.support.pg_ack_before_commit import AckBeforeCommitPgDaemon

WINDOW_SECONDS = 0.05


class ShortWindowStore(AckBeforeCommitStore):
    def _commit(self, batch: list[_Item]) -> None:
        with self._env.begin(write=True) as txn:
            outcomes, _ = self._apply(txn, batch)
            answers.resolve(outcomes)  # the reply leaves before the commit
            time.sleep(WINDOW_SECONDS)


class AckBeforeCommitDaemon(server.Daemon):
    def open_store(self) -> Store:
        options = LmdbOptions(
            map_size=self.config.map_size,
            sync=self.config.sync,
            summarize=summaries.summarize,
        )
        return ShortWindowStore(self.config.data_dir, options)


__all__ = ["AckBeforeCommitDaemon", "AckBeforeCommitPgDaemon"]
