"""The PostgreSQL backend's entry (`storage.backends`). Its driver is
imported only when a store is opened or migrated."""

from __future__ import annotations

from sidecar.clock import Clock
from sidecar.ledger.restore import Marker
from sidecar.storage.api import Store
from sidecar.storage.backends import Opening
from sidecar.storage.postgres import schema


class _Postgres:
    def open(self, where: str, opening: Opening) -> Store:
        from sidecar.storage.postgres.store import (  # noqa: PLC0415
            PostgresOptions,
            PostgresStore,
        )

        # No plan rows (`storage.plan_rows`) on the shared store: a row is
        # the committed record once more, in every commit's WAL (about a
        # tenth of a call's) and its encoding in every commit's CPU, where
        # what it spares is a Recover's decoding of the documents it reads
        # (docs/operations.md, "The schema").
        options = PostgresOptions(
            on_commit=opening.on_commit, failpoints=opening.failpoints
        )
        return PostgresStore(where, options)

    def migrate(self, where: str) -> tuple[int, int]:
        return schema.migrate_url(where)

    def mark_restored(
        self, where: str, backup: str, *, actor: str, reason: str, clock: Clock
    ) -> Marker:
        from sidecar.storage.postgres.restore import mark_database  # noqa: PLC0415

        return mark_database(where, backup, actor=actor, reason=reason, clock=clock)


ENTRY = _Postgres()
