"""BROKEN on purpose: a daemon that answers before its LMDB commit.

Run as `python -m tests.support.ack_before_commit serve --data-dir D`. The
crash-durability test must catch it: a call acknowledged as committed is
missing after kill -9 and restart. Its own writes at start commit without the
window, so that it starts as fast as a good daemon.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from sidecar import cli, server
from sidecar.rpc import summaries
from sidecar.storage.api import ReadView, Store, WriteView
from sidecar.storage.lmdb import answers
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore, _Item

T = TypeVar("T")

WINDOW_SECONDS = 3.0


class AckBeforeCommitStore(LmdbStore):
    # Its reads may wait (below): off the event loop, on worker threads.
    reads_wait = True
    # The seconds between a reply and its commit: none for the daemon's own
    # writes at its start (registration, settling, compaction), which no
    # client is answered, and WINDOW_SECONDS once it serves.
    window = 0.0

    def read(self, fn: Callable[[ReadView], T]) -> T:
        # A read waits for the commit in flight, so that a request after an
        # answered write finds it (as it would once committed): the answer
        # it got is what a crash in the window then loses.
        with self._txn:
            pass
        return super().read(fn)

    async def write(self, fn: Callable[[WriteView], T]) -> T:
        # Every write through the writer thread, so that the reply leaves
        # while the loop is free to send it (a commit on the loop would hold
        # the loop, and the reply, until it ends).
        return await asyncio.wrap_future(self.submit(fn))

    def _commit(self, batch: list[_Item]) -> None:
        with self._env.begin(write=True) as txn:
            outcomes, _ = self._apply(txn, batch)
            answers.resolve(outcomes)  # the reply leaves before the commit
            # A real window between the reply and the commit, for kill -9 to land in.
            time.sleep(self.window)


class AckBeforeCommitDaemon(server.Daemon):
    def open_store(self) -> Store:
        options = LmdbOptions(
            map_size=self.config.map_size,
            sync=self.config.sync,
            summarize=summaries.summarize,
        )
        self.broken = AckBeforeCommitStore(self.config.data_dir, options)
        return self.broken

    async def start(self) -> server.Endpoints:
        endpoints = await super().start()
        self.broken.window = WINDOW_SECONDS
        return endpoints


if __name__ == "__main__":
    raise SystemExit(cli.main(daemon_class=AckBeforeCommitDaemon))
