"""The views a store function gets of one PostgreSQL transaction
(`sidecar.storage.postgres.store`): `PgReadView` for reads, `PgWriteView` for
a write function of a batch, whose writes stay in memory until the batch
is sent (a function that raises leaves nothing).

Every `Table` is a range of `effectd_kv` (`sidecar.storage.postgres.schema`),
except `Table.USAGE`, which reads the sums of the counter rows of
`effectd_usage` and writes them as changes to the row of the writing
connection's shard (`add_usage`), so that concurrent writers never update
the same row. The writes of every function of a batch are kept in memory
(`Batch`), seen by the functions after it, and sent in a few statements
before COMMIT. A database error inside a view is raised as `DatabaseFailed`,
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
from sidecar.storage.keys import check_key
from sidecar.storage.plan_rows import Summarize

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

    def run(self, query: LiteralString, params: tuple[object, ...]) -> None:
        """Runs a statement that returns nothing."""
        try:
            self._conn.execute(query, params)
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


class _Layer:
    """Writes not sent yet: rows (None: deleted), usage totals that replace
    what is below them (a recount), then usage changes added on top."""

    def __init__(self) -> None:
        self.rows: dict[tuple[Table, bytes], bytes | None] = {}
        self.totals: dict[bytes, Usage] = {}
        self.changes: dict[bytes, Usage] = {}

    def usage_over(self, namespace: bytes, below: Usage) -> Usage:
        total = self.totals.get(namespace, below)
        change = self.changes.get(namespace)
        if change is None:
            return total
        return total.plus(
            change.open_calls, change.stored_bytes, change.tombstone_bytes
        )

    def namespaces(self) -> set[bytes]:
        return set(self.totals) | set(self.changes)

    def add(self, namespace: bytes, change: Usage) -> None:
        was = self.changes.get(namespace, Usage())
        self.changes[namespace] = was.plus(
            change.open_calls, change.stored_bytes, change.tombstone_bytes
        )

    def set_total(self, namespace: bytes, total: Usage) -> None:
        self.totals[namespace] = total
        self.changes.pop(namespace, None)

    def absorb(self, upper: _Layer) -> None:
        """Takes the writes of `upper`, made on top of these, as its own."""
        self.rows.update(upper.rows)
        for namespace, total in upper.totals.items():
            self.set_total(namespace, total)
        for namespace, change in upper.changes.items():
            self.add(namespace, change)


class Batch(_Layer):
    """The writes of the functions of one transaction that returned, sent
    together by `flush` before COMMIT: a function's reads see those of the
    functions before it without a round trip each."""

    def flush(self, conn: _Conn, shard: int) -> int:
        """Sends every write in a few statements; returns the rows written."""
        view = PgReadView(conn)
        puts = [(t.value, k, v) for (t, k), v in self.rows.items() if v is not None]
        deletes = [(t.value, k) for (t, k), v in self.rows.items() if v is None]
        if deletes:
            view.run(
                "DELETE FROM effectd_kv WHERE (tbl, k) IN "
                "(SELECT * FROM unnest(%s::text[], %s::bytea[]))",
                ([t for t, _ in deletes], [k for _, k in deletes]),
            )
        if puts:
            view.run(
                "INSERT INTO effectd_kv (tbl, k, v) "
                "SELECT * FROM unnest(%s::text[], %s::bytea[], %s::bytea[]) "
                "ON CONFLICT (tbl, k) DO UPDATE SET v = EXCLUDED.v",
                (
                    [t for t, _, _ in puts],
                    [k for _, k, _ in puts],
                    [v for _, _, v in puts],
                ),
            )
        if self.totals:
            # A total replaces every shard's row of its namespace.
            view.run(
                "DELETE FROM effectd_usage WHERE namespace = ANY(%s::bytea[])",
                (list(self.totals),),
            )
        changes = dict(self.totals)
        for namespace, change in self.changes.items():
            base = changes.get(namespace, Usage())
            changes[namespace] = base.plus(
                change.open_calls, change.stored_bytes, change.tombstone_bytes
            )
        changes = {n: u for n, u in changes.items() if u != Usage()}
        # (a zero total needs no row: the delete above said it)
        if changes:
            names = sorted(changes)
            view.run(
                "INSERT INTO effectd_usage AS u (namespace, shard, open_calls, "
                "stored_bytes, tombstone_bytes) SELECT n, %s, o, s, t FROM "
                "unnest(%s::bytea[], %s::bigint[], %s::bigint[], %s::bigint[]) "
                "AS c(n, o, s, t) "
                "ON CONFLICT (namespace, shard) DO UPDATE SET "
                "open_calls = u.open_calls + EXCLUDED.open_calls, "
                "stored_bytes = u.stored_bytes + EXCLUDED.stored_bytes, "
                "tombstone_bytes = u.tombstone_bytes + EXCLUDED.tombstone_bytes",
                (
                    shard,
                    names,
                    [changes[n].open_calls for n in names],
                    [changes[n].stored_bytes for n in names],
                    [changes[n].tombstone_bytes for n in names],
                ),
            )
        return len(self.rows) + len(changes)


class PgWriteView(PgReadView):
    """A `WriteView` of one write function of a batch; also `AddsUsage`,
    `IssuesRevisions` and `SkipsRevisions`. Its writes stay in memory; `done`
    hands them to the batch once the function returned (one that raises
    leaves nothing)."""

    def __init__(
        self, conn: _Conn, batch: Batch, summarize: Summarize | None = None
    ) -> None:
        super().__init__(conn)
        self.summarize = summarize
        self._batch = batch
        self._own = _Layer()

    def done(self) -> None:
        self._batch.absorb(self._own)

    def get(self, table: Table, key: bytes) -> bytes | None:
        if table is Table.USAGE:
            return self._usage_of(key, super().get(table, key))
        for layer in (self._own, self._batch):
            if (table, key) in layer.rows:
                return layer.rows[(table, key)]
        return super().get(table, key)

    def _usage_of(self, namespace: bytes, stored: bytes | None) -> bytes | None:
        """The counters of `namespace` over the row `stored` as read."""
        total = self._own.usage_over(
            namespace, self._batch.usage_over(namespace, usage.decode(stored))
        )
        return None if total == Usage() else usage.encode(total)

    def scan(
        self, table: Table, prefix: bytes, *, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        if table is Table.USAGE:
            stored = dict(super().scan(table, prefix, after=after))
            names = set(stored) | {
                n
                for n in self._own.namespaces() | self._batch.namespaces()
                if n.startswith(prefix) and (after is None or n > after)
            }
            for name in sorted(names):
                value = self._usage_of(name, stored.get(name))
                if value is not None:
                    yield name, value
            return
        unsent = {
            k: v
            for (t, k), v in self._batch.rows.items()
            if t is table and k.startswith(prefix) and (after is None or k > after)
        }
        unsent.update(
            (k, v)
            for (t, k), v in self._own.rows.items()
            if t is table and k.startswith(prefix) and (after is None or k > after)
        )
        mine = sorted(unsent.items())
        stored_rows: Iterator[tuple[bytes, bytes | None]] = (
            (k, v)
            for k, v in super().scan(table, prefix, after=after)
            if k not in unsent
        )
        for key, value in heapq.merge(mine, stored_rows, key=lambda kv: kv[0]):
            if value is not None:
                yield key, value

    def put(self, table: Table, key: bytes, value: bytes) -> None:
        check_key(key)
        if table is Table.USAGE:
            self._own.set_total(key, usage.decode(value))
        else:
            self._own.rows[(table, key)] = value

    def delete(self, table: Table, key: bytes) -> None:
        check_key(key)
        if table is Table.USAGE:
            self._own.set_total(key, Usage())
        else:
            self._own.rows[(table, key)] = None

    def add_usage(self, namespace: bytes, change: Usage) -> None:
        self._own.add(namespace, change)

    def issued_revision(self) -> int | None:
        rows = self._rows("SELECT nextval('effectd_checkpoint_revision')", ())
        return _int(rows[0][0])

    def skip_revisions(self, gap: int) -> None:
        # A sequence is not transactional: a retried transaction jumps again,
        # further ahead, which is as good.
        self._rows(
            "SELECT setval('effectd_checkpoint_revision', "
            "nextval('effectd_checkpoint_revision') + %s)",
            (gap,),
        )
