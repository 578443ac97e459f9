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
`keys.call_key`, `keys.checkpoint_key`); index keys of CALL_STATES
have one state byte before that.
"""

from __future__ import annotations

import struct
from typing import Protocol, TypeVar, runtime_checkable

from sidecar.ledger.model import State
from sidecar.ledger.quota import Usage
from sidecar.storage import records
from sidecar.storage.api import (
    Table,
    Tables,
    WritableTables,
)

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


def key_namespace(key: bytes) -> bytes:
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


def load(view: Tables, namespace: str) -> Usage:
    """The counters of `namespace` as `view`'s tables hold them (a
    `counting.Counting` view adds the changes it has not written yet)."""
    return _decode(view.get(Table.USAGE, namespace.encode()))


def stored(view: Tables) -> dict[str, Usage]:
    """Every namespace's counters as stored; namespaces with nothing are
    absent."""
    return {key.decode(): _decode(raw) for key, raw in view.scan(Table.USAGE, b"")}


def add_change(view: WritableTables, namespace: bytes, change: Usage) -> None:
    total = _decode(view.get(Table.USAGE, namespace)).plus(
        change.open_calls, change.stored_bytes, change.tombstone_bytes
    )
    if total == Usage():
        # An empty namespace leaves no row behind.
        view.delete(Table.USAGE, namespace)
    else:
        view.put(Table.USAGE, namespace, _encode(total))


def is_open_entry(index_key: bytes) -> bool:
    return bool(index_key) and index_key[0] != _COMMITTED_CODE


def recount(view: Tables) -> dict[str, Usage]:
    """Every namespace's counters, counted from the tables they describe."""
    found: dict[bytes, Usage] = {}
    for table in SIZED:
        for key, raw in view.scan(table, b""):
            namespace = key_namespace(key)
            size = len(key) + len(raw)
            was = found.get(namespace, Usage())
            found[namespace] = (
                was.plus(tombstone_bytes=size)
                if table is Table.TOMBSTONES
                else was.plus(stored_bytes=size)
            )
    for key, _ in view.scan(Table.CALL_STATES, b""):
        if is_open_entry(key):
            namespace = key_namespace(key[1:])
            found[namespace] = found.get(namespace, Usage()).plus(open_calls=1)
    return {
        namespace.decode(): usage
        for namespace, usage in found.items()
        if usage != Usage()
    }


def ensure_counted(view: WritableTables) -> int:
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
