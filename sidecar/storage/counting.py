"""The view every write function of a store runs on (`counted`): it keeps
the usage counters of `storage.usage` in step with every put and delete of
a counted table, in the same transaction, so no save path can forget them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from sidecar.ledger.quota import Usage
from sidecar.storage import usage
from sidecar.storage.api import (
    IssuesRevisions,
    SkipsRevisions,
    Table,
    WriteView,
)
from sidecar.storage.table_ledger import TableLedger

T = TypeVar("T")


def _sized(table: Table) -> bool:
    # Identity tests: this runs on every put, and enum hashing is slow.
    return table is Table.CALLS or table is Table.CHECKPOINTS


class Counting(TableLedger):
    """A `WriteView` that keeps `Table.USAGE` in step with every put and
    delete of the counted tables it passes on to `view`.

    The changes are summed per namespace and written by `flush`, once per
    write function rather than once per row; `usage` adds those not yet
    written (`usage`)."""

    def __init__(self, view: WriteView) -> None:
        self._view = view
        self.summarize = view.summarize
        # Per namespace, the changes not yet written: open calls, stored
        # bytes, tombstone bytes, summed in place (a `Usage` is built only
        # when read or written, not on every put).
        self._pending: dict[bytes, list[int]] = {}
        # An attribute lookup, not isinstance(view, AddsUsage): a runtime
        # protocol check walks the protocol's members on every call, tens of
        # microseconds on each write function of the hot path.
        self._add_usage: Callable[[bytes, Usage], None] | None = getattr(
            view, "add_usage", None
        )

    def pending(self, namespace: bytes) -> Usage:
        """The changes of `namespace` not yet written to `Table.USAGE`."""
        sums = self._pending.get(namespace)
        return Usage() if sums is None else Usage(*sums)

    def usage(self, namespace: str) -> Usage:
        """The counters as stored, and the changes not yet written."""
        change = self.pending(namespace.encode())
        return usage.load(self._view, namespace).plus(
            change.open_calls, change.stored_bytes, change.tombstone_bytes
        )

    def _sums(self, namespace: bytes) -> list[int]:
        sums = self._pending.get(namespace)
        if sums is None:
            sums = self._pending[namespace] = [0, 0, 0]
        return sums

    def flush(self) -> None:
        """Writes the summed changes to `Table.USAGE`."""
        for namespace, sums in self._pending.items():
            if not any(sums):
                continue
            change = Usage(*sums)
            if self._add_usage is not None:
                self._add_usage(namespace, change)
            else:
                usage.add_change(self._view, namespace, change)
        self._pending.clear()

    def issued_revision(self) -> int | None:
        view = self._view
        return view.issued_revision() if isinstance(view, IssuesRevisions) else None

    def skip_revisions(self, gap: int) -> None:
        view = self._view
        if isinstance(view, SkipsRevisions):
            view.skip_revisions(gap)

    def get(self, table: Table, key: bytes) -> bytes | None:
        return self._view.get(table, key)

    def scan(
        self, table: Table, prefix: bytes, *, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        return self._view.scan(table, prefix, after=after)

    def _resized(self, table: Table, key: bytes, grown: int) -> None:
        sums = self._sums(usage.key_namespace(key))
        if table is Table.TOMBSTONES:
            sums[2] += grown
        else:
            sums[1] += grown

    def put(self, table: Table, key: bytes, value: bytes) -> None:
        if _sized(table) or table is Table.TOMBSTONES:
            old = self._view.get(table, key)
            grown = len(value) - (-len(key) if old is None else len(old))
            self._view.put(table, key, value)
            self._resized(table, key, grown)
        elif table is Table.CALL_STATES:
            new = usage.is_open_entry(key) and self._view.get(table, key) is None
            self._view.put(table, key, value)
            if new:
                self._sums(usage.key_namespace(key[1:]))[0] += 1
        else:
            self._view.put(table, key, value)

    def delete(self, table: Table, key: bytes) -> None:
        if _sized(table) or table is Table.TOMBSTONES:
            old = self._view.get(table, key)
            self._view.delete(table, key)
            if old is not None:
                self._resized(table, key, -(len(key) + len(old)))
        elif table is Table.CALL_STATES:
            gone = usage.is_open_entry(key) and self._view.get(table, key) is not None
            self._view.delete(table, key)
            if gone:
                self._sums(usage.key_namespace(key[1:]))[0] -= 1
        else:
            self._view.delete(table, key)


def counted(fn: Callable[[WriteView], T]) -> Callable[[WriteView], T]:
    """`fn`, run on a `Counting` view of the view it is given, its counter
    changes written after it returns (a function that raises leaves none)."""

    def run(view: WriteView) -> T:
        counting = Counting(view)
        value = fn(counting)
        counting.flush()
        return value

    return run
