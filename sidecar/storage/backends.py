"""The store backends, and which `--store` URLs open each: the one place that
names them.

Each backend is a package of `sidecar.storage` (`lmdb`, `postgres`) whose
`entry` module offers an `Entry` (opening a store, migrating a schema,
marking a store restored by its own tools). The package is imported only
when its backend is used, so a daemon of the LMDB store loads no PostgreSQL
driver. A third backend is one new package and one line of `BACKENDS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sidecar.clock import Clock
from sidecar.failpoints import Failpoints
from sidecar.ledger.restore import Marker
from sidecar.storage.api import Store
from sidecar.storage.plan_rows import Summarize


@dataclass(frozen=True, slots=True)
class Opening:
    """What every backend is opened with, besides where its store is."""

    # Called by a writer after each durable commit with the batch size and
    # the seconds the commit took; must be cheap.
    on_commit: Callable[[int, float], None] | None = None
    # A test build's crash points in the write path (`sidecar.failpoints`).
    failpoints: Failpoints | None = None
    # LMDB: fsync every commit; its map size (virtual address space).
    sync: bool = True
    map_size: int | None = None
    # Makes the plan rows (`storage.plan_rows`): the daemon's, from the gRPC
    # boundary; None (an offline tool's open): no rows are written.
    summarize: Summarize | None = None


class Entry(Protocol):
    """What a backend package's `entry` module offers as `ENTRY`."""

    def open(self, where: str, opening: Opening) -> Store:
        """The store at `where` (a data directory, or a URL)."""
        ...

    def migrate(self, where: str) -> tuple[int, int]:
        """Creates or upgrades the store's schema; the version found (0:
        none) and the version now."""
        ...

    def mark_restored(
        self, where: str, backup: str, *, actor: str, reason: str, clock: Clock
    ) -> Marker:
        """Marks the store at `where`, restored by its own tools from
        `backup`, restored (`storage.marking`).

        Raises:
            RestoreRefused: the store cannot be marked; nothing changed.
        """
        ...


@dataclass(frozen=True, slots=True)
class Backend:
    """One backend: its name, the URL schemes of `--store` that open it (none:
    opened by `--data-dir`), and its package's entry module."""

    name: str
    schemes: tuple[str, ...]
    module: str

    def entry(self) -> Entry:
        """The backend's entry, its package imported now."""
        found: Entry = importlib.import_module(self.module).ENTRY
        return found


BACKENDS: tuple[Backend, ...] = (
    Backend("lmdb", (), "sidecar.storage.lmdb.entry"),
    Backend("postgresql", ("postgresql", "postgres"), "sidecar.storage.postgres.entry"),
)
# The backend of a daemon given no `--store` URL: LMDB under its data directory.
DEFAULT = BACKENDS[0]
SCHEMES = tuple(scheme for b in BACKENDS for scheme in b.schemes)


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def of_url(url: str) -> Backend | None:
    """The backend a `--store` URL opens; None when no backend takes it."""
    scheme = scheme_of(url)
    for backend in BACKENDS:
        if scheme in backend.schemes:
            return backend
    return None
