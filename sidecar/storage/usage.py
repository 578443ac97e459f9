"""The usage counters of each namespace, kept in the store and exact.

`Table.USAGE` maps a namespace to its open calls (records whose by-state
index entry is not COMMITTED), its stored bytes (key and value of its call
records and checkpoints) and its tombstone bytes (key and value of its
tombstones, which no quota counts). The counters are not updated by the
code that saves records: every write function a store runs gets a `Counting`
view, which adjusts them on each put and delete of a counted table, in the
same transaction. No save path can forget them, and any store that runs its
write functions through `counted` (LMDB now, another backend later) keeps
them the same way. A store that holds records from before the table existed,
or from before tombstones were counted apart, is recounted once when it is
opened (`ensure_counted`). A store whose view adds the changes itself
(`AddsUsage`: PostgreSQL's counter rows sharded per connection, so that
concurrent writers of one namespace never update the same row) gets them
as changes rather than as new totals.

Keys of the counted tables start with `namespace NUL` (see
`records.call_key`, `records.checkpoint_key`); index keys of CALL_STATES
have one state byte before that.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar, runtime_checkable

from sidecar.ledger.model import State
from sidecar.ledger.quota import Usage
from sidecar.storage import records
from sidecar.storage.api import (
    IssuesRevisions,
    ReadView,
    SkipsRevisions,
    Table,
    WriteView,
)
from sidecar.storage.table_ledger import TableLedger

T = TypeVar("T")

_SEP = b"\x00"
_VALUE = struct.Struct(">qqq")
# Before tombstones were counted apart (store formats before 3).
_OLD_VALUE = struct.Struct(">qq")
# Set in META once the counters were counted from the records themselves.
COUNTED_KEY = b"usage_counted"
# Tables whose rows count as the namespace's stored or tombstone bytes.
SIZED = (Table.CALLS, Table.CHECKPOINTS, Table.TOMBSTONES)
_COMMITTED_CODE = records.state_prefix(State.COMMITTED)[0]


def _namespace_of(key: bytes) -> bytes:
    return key.split(_SEP, 1)[0]


@runtime_checkable
class AddsUsage(Protocol):
    """A write view that adds counter changes itself, in its transaction."""

    def add_usage(self, namespace: bytes, change: Usage) -> None: ...


def decode(raw: bytes | None) -> Usage:
    """The counters of a stored `Table.USAGE` value (None: all zero)."""
    return _decode(raw)


def encode(usage: Usage) -> bytes:
    """The stored `Table.USAGE` value of `usage`."""
    return _encode(usage)


def _decode(raw: bytes | None) -> Usage:
    if raw is None:
        return Usage()
    if len(raw) == _OLD_VALUE.size:
        return Usage(*_OLD_VALUE.unpack(raw))
    return Usage(*_VALUE.unpack(raw))


def _encode(usage: Usage) -> bytes:
    return _VALUE.pack(usage.open_calls, usage.stored_bytes, usage.tombstone_bytes)


def load(view: ReadView, namespace: str) -> Usage:
    """The counters of `namespace` as of `view`, including the changes a
    `Counting` view has not written yet."""
    key = namespace.encode()
    found = _decode(view.get(Table.USAGE, key))
    if isinstance(view, Counting):
        change = view.pending(key)
        return found.plus(
            change.open_calls, change.stored_bytes, change.tombstone_bytes
        )
    return found


def stored(view: ReadView) -> dict[str, Usage]:
    """Every namespace's counters as stored; namespaces with nothing are
    absent."""
    return {key.decode(): _decode(raw) for key, raw in view.scan(Table.USAGE, b"")}


def _add(view: WriteView, namespace: bytes, change: Usage) -> None:
    total = _decode(view.get(Table.USAGE, namespace)).plus(
        change.open_calls, change.stored_bytes, change.tombstone_bytes
    )
    if total == Usage():
        # An empty namespace leaves no row behind.
        view.delete(Table.USAGE, namespace)
    else:
        view.put(Table.USAGE, namespace, _encode(total))


def _sized(table: Table) -> bool:
    # Identity tests: this runs on every put, and enum hashing is slow.
    return table is Table.CALLS or table is Table.CHECKPOINTS


class Counting(TableLedger):
    """A `WriteView` that keeps `Table.USAGE` in step with every put and
    delete of the counted tables it passes on to `view`.

    The changes are summed per namespace and written by `flush`, once per
    write function rather than once per row; `load` adds those not yet
    written."""

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
                _add(self._view, namespace, change)
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
        sums = self._sums(_namespace_of(key))
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
            new = _is_open(key) and self._view.get(table, key) is None
            self._view.put(table, key, value)
            if new:
                self._sums(_namespace_of(key[1:]))[0] += 1
        else:
            self._view.put(table, key, value)

    def delete(self, table: Table, key: bytes) -> None:
        if _sized(table) or table is Table.TOMBSTONES:
            old = self._view.get(table, key)
            self._view.delete(table, key)
            if old is not None:
                self._resized(table, key, -(len(key) + len(old)))
        elif table is Table.CALL_STATES:
            gone = _is_open(key) and self._view.get(table, key) is not None
            self._view.delete(table, key)
            if gone:
                self._sums(_namespace_of(key[1:]))[0] -= 1
        else:
            self._view.delete(table, key)


def _is_open(index_key: bytes) -> bool:
    return bool(index_key) and index_key[0] != _COMMITTED_CODE


def counted(fn: Callable[[WriteView], T]) -> Callable[[WriteView], T]:
    """`fn`, run on a `Counting` view of the view it is given, its counter
    changes written after it returns (a function that raises leaves none)."""

    def run(view: WriteView) -> T:
        counting = Counting(view)
        value = fn(counting)
        counting.flush()
        return value

    return run


def recount(view: ReadView) -> dict[str, Usage]:
    """Every namespace's counters, counted from the tables they describe."""
    found: dict[bytes, Usage] = {}
    for table in SIZED:
        for key, raw in view.scan(table, b""):
            namespace = _namespace_of(key)
            size = len(key) + len(raw)
            was = found.get(namespace, Usage())
            found[namespace] = (
                was.plus(tombstone_bytes=size)
                if table is Table.TOMBSTONES
                else was.plus(stored_bytes=size)
            )
    for key, _ in view.scan(Table.CALL_STATES, b""):
        if _is_open(key):
            namespace = _namespace_of(key[1:])
            found[namespace] = found.get(namespace, Usage()).plus(open_calls=1)
    return {
        namespace.decode(): usage
        for namespace, usage in found.items()
        if usage != Usage()
    }


def ensure_counted(view: WriteView) -> int:
    """At open: counts every namespace from its records, once, when the
    store was written before the counters existed. Returns how many
    namespaces it counted (0 when the counters were there already)."""
    if view.get(Table.META, COUNTED_KEY) is not None:
        return 0
    for key, _ in list(view.scan(Table.USAGE, b"")):
        view.delete(Table.USAGE, key)
    counts = recount(view)
    for namespace, usage in counts.items():
        view.put(Table.USAGE, namespace.encode(), _encode(usage))
    view.put(Table.META, COUNTED_KEY, b"1")
    return len(counts)
