"""The views a store function gets of one LMDB transaction: `TxnView`, the
`ReadView` of a read (or of the writer's transaction), and `BufferedView`, the
`WriteView` of one write function, whose writes reach the transaction only
when it returns (`sidecar.storage.lmdb.store`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any

import lmdb

from sidecar.storage.api import Table
from sidecar.storage.keys import check_key
from sidecar.storage.plan_rows import Summarize
from sidecar.storage.table_ledger import TableLedger, TableLedgerReads


class TxnView(TableLedgerReads):
    """A `ReadView` over one LMDB transaction."""

    def __init__(self, txn: lmdb.Transaction, dbs: dict[Table, Any]) -> None:
        self._txn = txn
        self._dbs = dbs

    def get(self, table: Table, key: bytes) -> bytes | None:
        value = self._txn.get(key, db=self._dbs[table])
        return None if value is None else bytes(value)

    def scan(
        self, table: Table, prefix: bytes, *, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        with self._txn.cursor(db=self._dbs[table]) as cursor:
            start = prefix if after is None or after < prefix else after
            if not cursor.set_range(start):
                return
            for raw_key, value in cursor:
                key = bytes(raw_key)
                if not key.startswith(prefix):
                    return
                if after is not None and key <= after:
                    continue
                yield key, bytes(value)


class BufferedView(TableLedger):
    """A `WriteView` whose writes stay in memory until `flush`, so a write
    function that raises leaves nothing behind."""

    def __init__(
        self,
        base: TxnView,
        txn: lmdb.Transaction,
        dbs: dict[Table, Any],
        summarize: Summarize | None = None,
    ) -> None:
        self.summarize = summarize
        self._base = base
        self._txn = txn
        self._dbs = dbs
        self._pending: dict[tuple[Table, bytes], bytes | None] = {}

    def get(self, table: Table, key: bytes) -> bytes | None:
        if (table, key) in self._pending:
            return self._pending[(table, key)]
        return self._base.get(table, key)

    def scan(
        self, table: Table, prefix: bytes, *, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        mine = sorted(
            (k, v)
            for (t, k), v in self._pending.items()
            if t is table and k.startswith(prefix) and (after is None or k > after)
        )
        shadowed = {k for k, _ in mine}
        stored: Iterator[tuple[bytes, bytes | None]] = (
            (k, v)
            for k, v in self._base.scan(table, prefix, after=after)
            if k not in shadowed
        )
        for key, value in heapq.merge(mine, stored, key=lambda kv: kv[0]):
            if value is not None:
                yield key, value

    def put(self, table: Table, key: bytes, value: bytes) -> None:
        check_key(key)
        self._pending[(table, key)] = value

    def delete(self, table: Table, key: bytes) -> None:
        check_key(key)
        self._pending[(table, key)] = None

    def flush(self) -> int:
        """Writes the buffered changes into the transaction. An `lmdb.Error`
        here may leave the transaction unusable (the writer then aborts it)."""
        for (table, key), value in self._pending.items():
            if value is None:
                self._txn.delete(key, db=self._dbs[table])
            else:
                self._txn.put(key, value, db=self._dbs[table])
        return len(self._pending)
