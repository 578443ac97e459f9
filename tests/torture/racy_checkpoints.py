"""BROKEN on purpose: a daemon whose checkpoint compare-and-swap reads the
key's revision in one transaction and writes in a later one, without the
write lock in between, so two writers that expect the same revision can both
succeed. The linearizability test must reject its histories.

Run as `python -m tests.torture.racy_checkpoints serve --data-dir D`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from sidecar import cli
from sidecar.composition import Services
from sidecar.ledger.checkpoints import Expect, Op, StoredCheckpoint, check
from sidecar.server import Daemon
from sidecar.services._common import committed
from sidecar.services.checkpoints import CheckpointService
from sidecar.storage.api import LedgerReads, LedgerWrites, Store


class RacyCheckpoints(CheckpointService):
    async def txn(
        self, namespace: str, compares: Sequence[Expect], ops: Sequence[Op]
    ) -> int:
        for expect in compares:

            def load(
                view: LedgerReads, key: str = expect.key
            ) -> StoredCheckpoint | None:
                return view.load_checkpoint(namespace, key)

            current = self._store.read(load)
            check(expect, None if current is None else current.revision)
        # A real pause between the compare and the write: the window the race needs.
        await asyncio.sleep(0.005)

        def blind_write(view: LedgerWrites) -> int:
            revision = view.next_checkpoint_revision()
            now = self._clock.wall_ns()
            for op in ops:
                if op.value is None:
                    view.delete_checkpoint(namespace, op.key)
                else:
                    cp = StoredCheckpoint(op.key, op.value, revision, now)
                    view.save_checkpoint(namespace, cp)
            return revision

        return await committed(self._store, blind_write)


class RacyCheckpointDaemon(Daemon):
    def compose(self, store: Store) -> Services:
        services = super().compose(store)
        racy = RacyCheckpoints(store, self.seams.clock)
        return replace(services, checkpoints=racy)


if __name__ == "__main__":
    raise SystemExit(cli.main(daemon_class=RacyCheckpointDaemon))
