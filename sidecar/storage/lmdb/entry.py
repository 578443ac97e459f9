"""The LMDB backend's entry (`storage.backends`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sidecar.clock import Clock
from sidecar.errors import NotImplementedYet
from sidecar.ledger.restore import Marker
from sidecar.storage.api import Store
from sidecar.storage.backends import Opening
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore


class _Lmdb:
    def open(self, where: str, opening: Opening) -> Store:
        options = LmdbOptions(
            sync=opening.sync,
            on_commit=opening.on_commit,
            failpoints=opening.failpoints,
            summarize=opening.summarize,
        )
        if opening.map_size is not None:
            options = dataclasses.replace(options, map_size=opening.map_size)
        return LmdbStore(Path(where), options)

    def migrate(self, where: str) -> tuple[int, int]:
        raise NotImplementedYet(
            "an LMDB store is upgraded in place when a daemon opens it"
        )

    def mark_restored(
        self, where: str, backup: str, *, actor: str, reason: str, clock: Clock
    ) -> Marker:
        raise NotImplementedYet(
            "an LMDB store is restored with `effectd ctl restore BACKUP --data-dir`"
        )


ENTRY = _Lmdb()
