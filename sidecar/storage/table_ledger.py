"""The ledger (`api.LedgerReads`, `api.LedgerWrites`) over tables of bytes
(`api.Table`): the way of a store whose views only get, scan, put and delete
keys (LMDB), and of any view that wraps another's tables.

`TableLedgerReads` and `TableLedger` are mixins of such a view: each
operation is the codecs of `storage.records`, `tombstones`, `usage`,
`daemons` and `marking` run on the view itself. A store with a way of its
own overrides them in its views (PostgreSQL reads the typed columns of its
call rows, `storage.postgres.call_reads`).
"""

from __future__ import annotations

from collections.abc import Iterator

from sidecar.errors import UnsupportedKeyScheme
from sidecar.ledger.audit import Entry, Fact, Head
from sidecar.ledger.checkpoints import StoredCheckpoint
from sidecar.ledger.model import CallRef, State, ToolCall
from sidecar.ledger.ownership import PassLock, Registration
from sidecar.ledger.quota import Usage
from sidecar.ledger.retention import Tombstone
from sidecar.storage import (
    daemons,
    marking,
    plan_rows,
    records,
    retention_times,
    tombstones,
    usage,
)
from sidecar.storage.api import Listed, ReadView, Table, Tables, WritableTables
from sidecar.storage.call_documents import decode_call


def listed(raw: bytes, *, history: bool = True) -> Listed:
    """The record of a stored document, or the refusal of one a newer
    daemon made (`api.Listed`)."""
    try:
        return decode_call(raw, history=history)
    except UnsupportedKeyScheme as exc:
        return exc


class TableLedgerReads:
    """`api.CallReads` through the view's own `get` and `scan`."""

    def load_call(self: Tables, ref: CallRef) -> ToolCall | None:
        return records.load_call(self, ref)

    def load_call_at(self: Tables, key: bytes) -> ToolCall | None:
        return records.load_call_at(self, key)

    def find_call(
        self: Tables, ref: CallRef
    ) -> tuple[ToolCall | None, Tombstone | None]:
        call = records.load_call(self, ref)
        if call is not None:
            return call, None
        return None, tombstones.load(self, ref)

    def calls(
        self: Tables,
        prefix: bytes,
        *,
        after: bytes | None = None,
        history: bool = True,
    ) -> Iterator[tuple[bytes, Listed]]:
        for key, raw in self.scan(Table.CALLS, prefix, after=after):
            yield key, listed(raw, history=history)

    def calls_in_state(
        self: Tables,
        state: State,
        namespace: str | None = None,
        *,
        after: bytes | None = None,
    ) -> Iterator[bytes]:
        prefix = records.state_prefix(state, namespace)
        start = None if after is None else prefix[:1] + after
        for key, _ in self.scan(Table.CALL_STATES, prefix, after=start):
            yield key[1:]

    def plan(
        self: Tables, prefix: bytes, *, after: bytes | None = None, rows: bool = True
    ) -> Iterator[tuple[bytes, Listed | bytes]]:
        # The plan rows of the same range, walked beside the records.
        planned = iter(self.scan(Table.PLAN_ROWS, prefix, after=after) if rows else ())
        row = next(planned, None)
        for key, raw in self.scan(Table.CALLS, prefix, after=after):
            while row is not None and row[0] < key:
                row = next(planned, None)
            if row is not None and row[0] == key and plan_rows.is_current(row[1]):
                yield row
            else:
                yield key, listed(raw, history=False)

    def retained(
        self: Tables, *, acknowledged: bool, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        flag = (
            retention_times.ACKNOWLEDGED
            if acknowledged
            else retention_times.UNACKNOWLEDGED
        )
        for place, _ in self.scan(Table.RETENTION_TIMES, flag, after=after):
            yield place, retention_times.split(place)[1]

    def load_checkpoint(
        self: Tables, namespace: str, key: str
    ) -> StoredCheckpoint | None:
        return records.load_checkpoint(self, namespace, key)

    def checkpoints(
        self: Tables, namespace: str, prefix: str, *, after: bytes | None = None
    ) -> Iterator[tuple[bytes, StoredCheckpoint]]:
        return records.scan_checkpoints(self, namespace, prefix, after)

    def usage(self: Tables, namespace: str) -> Usage:
        return usage.load(self, namespace)

    def usages(self: Tables) -> dict[str, Usage]:
        return usage.stored(self)

    def audit_head(self: Tables) -> Head | None:
        return records.load_audit_head(self)

    def audit_entry(self: Tables, sequence: int) -> bytes | None:
        return records.load_audit(self, sequence)

    def audit_entries(self: Tables, after: int = 0) -> Iterator[tuple[int, bytes]]:
        return records.scan_audit(self, after)

    def registration(self: Tables, incarnation: int) -> Registration | None:
        return daemons.load(self, incarnation)

    def registrations(self: Tables) -> Iterator[Registration]:
        return daemons.every(self)

    def pass_lock(self: Tables, name: str) -> PassLock | None:
        return daemons.load_lock(self, name)

    def refuse_unfinished_restore(self: Tables) -> None:
        marking.refuse_unfinished_marking(self)


class TableLedger(TableLedgerReads):
    """`api.CallWrites` through the view's own `put` and `delete` too."""

    def write_call(self: WritableTables, old: ToolCall | None, new: ToolCall) -> None:
        records.save_call(self, old, new)

    def compact_call(self: WritableTables, call: ToolCall, tomb: Tombstone) -> None:
        tombstones.compact(self, call, tomb)

    def expire_tombstones(
        self: WritableTables, before_ns: int, limit: int
    ) -> tuple[int, bool]:
        return tombstones.expire(self, before_ns, limit)

    def next_checkpoint_revision(self: WritableTables) -> int:
        return records.next_checkpoint_revision(self)

    def save_checkpoint(
        self: WritableTables, namespace: str, cp: StoredCheckpoint
    ) -> None:
        records.save_checkpoint(self, namespace, cp)

    def delete_checkpoint(self: WritableTables, namespace: str, key: str) -> None:
        records.delete_checkpoint(self, namespace, key)

    def append_audit(self: WritableTables, fact: Fact) -> Entry:
        return records.append_audit(self, fact)

    def save_registration(self: WritableTables, reg: Registration) -> None:
        daemons.save(self, reg)

    def forget_registration(self: WritableTables, incarnation: int) -> None:
        daemons.forget(self, incarnation)

    def save_pass_lock(self: WritableTables, name: str, lock: PassLock) -> None:
        daemons.save_lock(self, name, lock)


class Unread(Exception):
    """A read of `NO_READS`."""


class _NoReads(TableLedgerReads):
    """A view with nothing to read: what a rule is decided on when the
    record it needs is at hand (`services.recent_calls`); any read raises
    `Unread`."""

    def get(self, table: Table, key: bytes) -> bytes | None:
        raise Unread(table)

    def scan(
        self, table: Table, prefix: bytes, *, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        raise Unread(table)


NO_READS: ReadView = _NoReads()


class _Holding(_NoReads):
    """A view that holds one call (its record, or its tombstone, or
    neither) and nothing else."""

    def __init__(
        self, ref: CallRef, call: ToolCall | None, tomb: Tombstone | None
    ) -> None:
        self._ref = ref
        self._found = (call, tomb)

    def find_call(self, ref: CallRef) -> tuple[ToolCall | None, Tombstone | None]:
        if ref != self._ref:
            raise Unread(ref)
        return self._found

    def load_call(self, ref: CallRef) -> ToolCall | None:
        return self.find_call(ref)[0]


def absent(ref: CallRef) -> ReadView:
    """A view with nothing to read but that `ref`'s call is not stored:
    what a new call is decided on before a save whose own compare proves it
    (a record or tombstone stored meanwhile fails it, `api.Conflict`); any
    other read raises `Unread`."""
    return _Holding(ref, None, None)


def holding(ref: CallRef, call: ToolCall | None, tomb: Tombstone | None) -> ReadView:
    """A view with nothing to read but `ref`'s call as found: its record
    `call`, or its tombstone `tomb` (`api.Conflict.found`); any other read
    raises `Unread`."""
    return _Holding(ref, call, tomb)
