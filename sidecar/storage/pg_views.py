"""The views a store function gets of one PostgreSQL transaction
(`sidecar.storage.postgres_store`): `PgReadView` for reads, `PgWriteView` for
a write function, whose writes to the key-value rows are buffered and sent
in one batch when it returns (fewer round trips; a function that raises
leaves the transaction to be rolled back).

Every `Table` is a range of `effectd_kv` (`sidecar.storage.pg_schema`),
except `Table.USAGE`, which reads the sums of the counter rows of
`effectd_usage` and writes them as changes to the row of the writing
connection's shard (`add_usage`), so that concurrent writers never update
the same row. A database error inside a view is raised as `DatabaseFailed`,
which is not an `Exception`: no `except Exception` in a write function can
take it for a refusal and commit what it wrote before.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from decimal import Decimal
from typing import LiteralString

import psycopg

from sidecar.ledger.quota import Usage
from sidecar.storage import usage
from sidecar.storage.api import Table
from sidecar.storage.keys import MAX_KEY_BYTES
from sidecar.storage.views import KeyTooLong

# Rows read per round trip of a scan.
SCAN_BATCH = 500
# Counter rows per namespace: each connection adds to the row of its
# backend's process id modulo this.
USAGE_SHARDS = 64

_Conn = psycopg.Connection[tuple[object, ...]]


class DatabaseFailed(BaseException):
    """A statement failed; `error` is psycopg's exception."""

    def __init__(self, error: psycopg.Error) -> None:
        super().__init__(error)
        self.error = error


def _bytes(value: object) -> bytes:
    assert isinstance(value, bytes | memoryview), type(value)
    return bytes(value)


def _int(value: object) -> int:
    # bigint, or the numeric of a sum of bigints
    assert isinstance(value, int | Decimal), type(value)
    return int(value)


def _successor(prefix: bytes) -> bytes | None:
    """The least key greater than every key starting with `prefix`; None
    when there is none (empty, or all 0xFF)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


# (from the low key itself, bounded above) -> the query of one batch.
_SCANS: dict[tuple[bool, bool], LiteralString] = {
    (True, False): "SELECT k, v FROM effectd_kv WHERE tbl = %s AND k >= %s "
    "ORDER BY k LIMIT %s",
    (False, False): "SELECT k, v FROM effectd_kv WHERE tbl = %s AND k > %s "
    "ORDER BY k LIMIT %s",
    (True, True): "SELECT k, v FROM effectd_kv WHERE tbl = %s AND k >= %s "
    "AND k < %s ORDER BY k LIMIT %s",
    (False, True): "SELECT k, v FROM effectd_kv WHERE tbl = %s AND k > %s "
    "AND k < %s ORDER BY k LIMIT %s",
}


class PgReadView:
    """A `ReadView` of the transaction open on `conn`."""

    def __init__(self, conn: _Conn) -> None:
        self._conn = conn

    def _rows(
        self, query: LiteralString, params: tuple[object, ...]
    ) -> list[tuple[object, ...]]:
        try:
            return self._conn.execute(query, params).fetchall()
        except psycopg.Error as exc:
            raise DatabaseFailed(exc) from exc

    def get(self, table: Table, key: bytes) -> bytes | None:
        if table is Table.USAGE:
            return self._usage(key)
        rows = self._rows(
            "SELECT v FROM effectd_kv WHERE tbl = %s AND k = %s", (table.value, key)
        )
        return _bytes(rows[0][0]) if rows else None

    def scan(
        self, table: Table, prefix: bytes, *, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        if table is Table.USAGE:
            yield from self._usages(prefix, after)
            return
        upper = _successor(prefix)
        # Inclusive of `prefix` itself, exclusive of `after`.
        low, inclusive = (
            (prefix, True)
            if after is None or after < prefix
            else (
                after,
                False,
            )
        )
        while True:
            query = _SCANS[(inclusive, upper is not None)]
            params: tuple[object, ...] = (
                (table.value, low, SCAN_BATCH)
                if upper is None
                else (table.value, low, upper, SCAN_BATCH)
            )
            rows = self._rows(query, params)
            for k, v in rows:
                yield _bytes(k), _bytes(v)
            if len(rows) < SCAN_BATCH:
                return
            low, inclusive = _bytes(rows[-1][0]), False

    def _usage(self, namespace: bytes) -> bytes | None:
        rows = self._rows(
            "SELECT coalesce(sum(open_calls), 0), coalesce(sum(stored_bytes), 0), "
            "coalesce(sum(tombstone_bytes), 0) FROM effectd_usage "
            "WHERE namespace = %s",
            (namespace,),
        )
        total = Usage(*(_int(n) for n in rows[0]))
        return None if total == Usage() else usage.encode(total)

    def _usages(
        self, prefix: bytes, after: bytes | None
    ) -> Iterator[tuple[bytes, bytes]]:
        rows = self._rows(
            "SELECT namespace, sum(open_calls), sum(stored_bytes), "
            "sum(tombstone_bytes) FROM effectd_usage GROUP BY namespace "
            "ORDER BY namespace",
            (),
        )
        for namespace, *sums in rows:
            key = _bytes(namespace)
            total = Usage(*(_int(n) for n in sums))
            if (
                key.startswith(prefix)
                and (after is None or key > after)
                and total != Usage()
            ):
                yield key, usage.encode(total)


def _check_key(key: bytes) -> None:
    # The same bound as LMDB's: a key one store refuses, the other does too.
    if len(key) > MAX_KEY_BYTES:
        raise KeyTooLong(
            f"a store key has {len(key)} bytes, the store keeps {MAX_KEY_BYTES}"
        )


class PgWriteView(PgReadView):
    """A `WriteView` of one write function's transaction; also `AddsUsage`
    and `IssuesRevisions`."""

    def __init__(self, conn: _Conn) -> None:
        super().__init__(conn)
        self._pending: dict[tuple[Table, bytes], bytes | None] = {}
        # Totals put into Table.USAGE (a recount), written by `flush`.
        self._totals: dict[bytes, Usage] = {}
        self._shard = conn.info.backend_pid % USAGE_SHARDS

    def get(self, table: Table, key: bytes) -> bytes | None:
        if table is Table.USAGE and key in self._totals:
            total = self._totals[key]
            return None if total == Usage() else usage.encode(total)
        if (table, key) in self._pending:
            return self._pending[(table, key)]
        return super().get(table, key)

    def scan(
        self, table: Table, prefix: bytes, *, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        if table is Table.USAGE and self._totals:
            rows = dict(super().scan(table, prefix, after=after))
            for key, total in self._totals.items():
                rows.pop(key, None)
                if (
                    total != Usage()
                    and key.startswith(prefix)
                    and (after is None or key > after)
                ):
                    rows[key] = usage.encode(total)
            yield from sorted(rows.items())
            return
        mine = sorted(
            (k, v)
            for (t, k), v in self._pending.items()
            if t is table and k.startswith(prefix) and (after is None or k > after)
        )
        shadowed = {k for k, _ in mine}
        stored: Iterator[tuple[bytes, bytes | None]] = (
            (k, v)
            for k, v in super().scan(table, prefix, after=after)
            if k not in shadowed
        )
        for key, value in heapq.merge(mine, stored, key=lambda kv: kv[0]):
            if value is not None:
                yield key, value

    def put(self, table: Table, key: bytes, value: bytes) -> None:
        _check_key(key)
        if table is Table.USAGE:
            # A total (a recount): it replaces every shard's row.
            self._totals[key] = usage.decode(value)
            return
        self._pending[(table, key)] = value

    def delete(self, table: Table, key: bytes) -> None:
        _check_key(key)
        if table is Table.USAGE:
            self._totals[key] = Usage()
            return
        self._pending[(table, key)] = None

    def _set_usage(self, namespace: bytes, total: Usage) -> None:
        self._rows_none("DELETE FROM effectd_usage WHERE namespace = %s", (namespace,))
        if total != Usage():
            self.add_usage(namespace, total)

    def add_usage(self, namespace: bytes, change: Usage) -> None:
        self._rows_none(
            "INSERT INTO effectd_usage AS u (namespace, shard, open_calls, "
            "stored_bytes, tombstone_bytes) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (namespace, shard) DO UPDATE SET "
            "open_calls = u.open_calls + EXCLUDED.open_calls, "
            "stored_bytes = u.stored_bytes + EXCLUDED.stored_bytes, "
            "tombstone_bytes = u.tombstone_bytes + EXCLUDED.tombstone_bytes",
            (
                namespace,
                self._shard,
                change.open_calls,
                change.stored_bytes,
                change.tombstone_bytes,
            ),
        )

    def issued_revision(self) -> int | None:
        rows = self._rows("SELECT nextval('effectd_checkpoint_revision')", ())
        return _int(rows[0][0])

    def _rows_none(self, query: LiteralString, params: tuple[object, ...]) -> None:
        try:
            self._conn.execute(query, params)
        except psycopg.Error as exc:
            raise DatabaseFailed(exc) from exc

    def flush(self) -> int:
        """Sends the buffered writes; returns how many rows were written.
        Until then the transaction holds none of them: a function that
        raises is never flushed, and leaves nothing in a batch."""
        for namespace, total in self._totals.items():
            self._set_usage(namespace, total)
        puts = [(t.value, k, v) for (t, k), v in self._pending.items() if v is not None]
        deletes = [(t.value, k) for (t, k), v in self._pending.items() if v is None]
        # One statement each, whatever the number of rows: one round trip.
        if deletes:
            self._rows_none(
                "DELETE FROM effectd_kv WHERE (tbl, k) IN "
                "(SELECT * FROM unnest(%s::text[], %s::bytea[]))",
                ([t for t, _ in deletes], [k for _, k in deletes]),
            )
        if puts:
            self._rows_none(
                "INSERT INTO effectd_kv (tbl, k, v) "
                "SELECT * FROM unnest(%s::text[], %s::bytea[], %s::bytea[]) "
                "ON CONFLICT (tbl, k) DO UPDATE SET v = EXCLUDED.v",
                (
                    [t for t, _, _ in puts],
                    [k for _, k, _ in puts],
                    [v for _, _, v in puts],
                ),
            )
        written = len(self._pending) + len(self._totals)
        self._pending.clear()
        self._totals.clear()
        return written
