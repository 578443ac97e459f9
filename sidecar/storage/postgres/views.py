"""The views a store function gets of one PostgreSQL transaction
(`sidecar.storage.postgres.store`): `PgReadView` for reads, `PgWriteView` for
a write function of a batch, whose writes stay in memory until the batch
is sent (a function that raises leaves nothing).

Every `Table` is read and written where `sidecar.storage.postgres.tables`
puts it (a call's record, plan row and tombstone are one row, read once per
transaction and written whole), except `Table.USAGE`, which reads the sums
of the counter rows of `effectd_usage` and writes them as changes to the row
of the writing connection's shard (`add_usage`), so that concurrent writers never update
the same row. The writes of every function of a batch are kept in memory
(`Batch`), seen by the functions after it, and sent in a few statements
before COMMIT. A database error inside a view is raised as `DatabaseFailed`,
which is not an `Exception`: no `except Exception` in a write function can
take it for a refusal and commit what it wrote before.

Over 400 lines on purpose: the reads, the writes kept in memory and their
flush are one translation of the seam, read together.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import LiteralString

import psycopg

from sidecar.ledger.quota import Usage
from sidecar.storage import records, usage
from sidecar.storage.api import Table
from sidecar.storage.keys import check_key
from sidecar.storage.plan_rows import Summarize
from sidecar.storage.postgres import tables

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


class PgReadView:
    """A `ReadView` of the transaction open on `conn`. The call rows it
    read are kept in `rows` (each read once: a record and its tombstone are
    one row); with `lock`, each is read `FOR UPDATE`."""

    def __init__(
        self,
        conn: _Conn,
        rows: dict[bytes, tables.Row | None] | None = None,
        *,
        lock: bool = False,
    ) -> None:
        self._conn = conn
        self._read_rows: dict[bytes, tables.Row | None] = {} if rows is None else rows
        self._lock = lock

    def _rows(
        self, query: LiteralString, params: tuple[object, ...]
    ) -> list[tuple[object, ...]]:
        try:
            return self._conn.execute(query, params).fetchall()
        except psycopg.Error as exc:
            raise DatabaseFailed(exc) from exc

    @property
    def locks(self) -> bool:
        """Whether the rows this view reads are locked until the commit."""
        return self._lock

    def rows(
        self, query: LiteralString, params: tuple[object, ...]
    ) -> list[tuple[object, ...]]:
        """The rows of `query`."""
        return self._rows(query, params)

    def run(self, query: LiteralString, params: tuple[object, ...]) -> None:
        """Runs a statement that returns nothing."""
        try:
            self._conn.execute(query, params)
        except psycopg.Error as exc:
            raise DatabaseFailed(exc) from exc

    def call_row(self, k: bytes) -> tables.Row | None:
        """The stored row of the call under `k` (None: none)."""
        if k in self._read_rows:
            return self._read_rows[k]
        query = tables.ROW_QUERY + " FOR UPDATE" if self._lock else tables.ROW_QUERY
        found = self._rows(query, (k,))
        row = tables.row_of(found[0]) if found else None
        self._read_rows[k] = row
        return row

    def get(self, table: Table, key: bytes) -> bytes | None:
        if table is Table.USAGE:
            return self._usage(key)
        if table in tables.KV:
            rows = self._rows(
                tables.on_table(table, "SELECT v FROM {t} WHERE k = %s"), (key,)
            )
            return _bytes(rows[0][0]) if rows else None
        return tables.value_in(table, key, self.call_row(tables.family_key(table, key)))

    def _ranged(
        self,
        select: LiteralString,
        head: tuple[object, ...],
        prefix: bytes,
        after: bytes | None,
    ) -> Iterator[tuple[bytes, bytes]]:
        """The (key, value) rows of `select` in the key range of a prefix
        scan, in key order, a batch per round trip."""
        low, inclusive, upper = tables.key_range(prefix, after)
        while True:
            query = tables.range_query(select, inclusive, upper is not None)
            bounds = (low,) if upper is None else (low, upper)
            rows = self._rows(query, (*head, *bounds, tables.SCAN_BATCH))
            for k, v in rows:
                yield _bytes(k), b"" if v is None else _bytes(v)
            if len(rows) < tables.SCAN_BATCH:
                return
            low, inclusive = _bytes(rows[-1][0]), False

    def _timed(
        self,
        query: LiteralString,
        head: tuple[object, ...],
        start: tuple[int, bytes],
        key: Callable[[int, bytes], bytes],
    ) -> Iterator[bytes]:
        """The derived keys of a time-ordered scan after `start`."""
        while True:
            rows = self._rows(query, (*head, *start, tables.SCAN_BATCH))
            for t, k in rows:
                yield key(_int(t), _bytes(k))
            if len(rows) < tables.SCAN_BATCH:
                return
            start = (_int(rows[-1][0]), _bytes(rows[-1][1]))

    def scan(
        self, table: Table, prefix: bytes, *, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        if table is Table.USAGE:
            yield from self._usages(prefix, after)
        elif table in tables.KV:
            yield from self._ranged(tables.kv_select(table), (), prefix, after)
        elif table in tables.FAMILY:
            yield from self._ranged(tables.family_select(table), (), prefix, after)
        elif table is Table.CALL_STATES:
            for code, sub, sub_after in tables.state_ranges(prefix, after):
                for k, _ in self._ranged(tables.STATE_SELECT, (code,), sub, sub_after):
                    yield bytes([code]) + k, b""
        else:
            yield from (
                (key, b"")
                for key in self._derived_times(table, after)
                if key.startswith(prefix) and (after is None or key > after)
            )

    def _derived_times(self, table: Table, after: bytes | None) -> Iterator[bytes]:
        if table is Table.TOMBSTONE_TIMES:
            yield from self._timed(
                tables.TOMBSTONE_SCAN,
                (),
                tables.time_bound(after, 0),
                lambda t, k: t.to_bytes(8, "big") + k,
            )
            return
        assert table is Table.RETENTION_TIMES, table
        for flag in (False, True):
            head = bytes([flag])
            if after is not None and after[:1] > head:
                continue
            start = (
                tables.time_bound(after, 1)
                if after is not None and after[:1] == head
                else (-1, b"")
            )
            yield from self._timed(
                tables.RETENTION_SCAN,
                (flag,),
                start,
                functools.partial(tables.retention_key, flag),
            )

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

    def __init__(self) -> None:
        super().__init__()
        # The call rows the transaction read, as stored (`PgReadView.call_row`).
        self.read_rows: dict[bytes, tables.Row | None] = {}

    def flush(self, conn: _Conn, shard: int, *, lock: bool = False) -> int:
        """Sends every write in a few statements; returns the rows written."""
        view = PgReadView(conn, self.read_rows, lock=lock)
        for table in tables.KV:
            self._flush_kv(view, table)
        self._flush_calls(view)
        return len(self.rows) + self._flush_usage(view, shard)

    def _flush_kv(self, view: PgReadView, table: Table) -> None:
        puts = [
            (k, v) for (t, k), v in self.rows.items() if t is table and v is not None
        ]
        deletes = [k for (t, k), v in self.rows.items() if t is table and v is None]
        if deletes:
            view.run(
                tables.on_table(table, "DELETE FROM {t} WHERE k = ANY(%s::bytea[])"),
                (deletes,),
            )
        if not puts:
            return
        keys = [k for k, _ in puts]
        values = [v for _, v in puts]
        if table is Table.CHECKPOINTS:
            heads = [records.checkpoint_head(v) for v in values]
            view.run(
                "INSERT INTO effectd_checkpoints (k, namespace, revision, "
                "updated_ns, v) SELECT * FROM unnest(%s::bytea[], %s::text[], "
                "%s::bigint[], %s::bigint[], %s::bytea[]) ON CONFLICT (k) DO "
                "UPDATE SET revision = EXCLUDED.revision, "
                "updated_ns = EXCLUDED.updated_ns, v = EXCLUDED.v",
                (
                    keys,
                    [records.namespace_of(k) for k in keys],
                    [None if h is None else h[0] for h in heads],
                    [None if h is None else h[1] for h in heads],
                    values,
                ),
            )
            return
        view.run(
            tables.on_table(table, tables.KV_UPSERT),
            (keys, values),
        )

    def _flush_calls(self, view: PgReadView) -> None:
        """Each call row written, whole: its documents as stored, with what
        the batch wrote over them, and the typed columns read from those."""
        changed: dict[bytes, dict[Table, bytes | None]] = {}
        for (table, key), value in self.rows.items():
            if table in tables.FAMILY:
                changed.setdefault(key, {})[table] = value
        if not changed:
            return
        missing = [k for k in changed if k not in self.read_rows]
        if missing:
            query = tables.ROWS_QUERY + (" FOR UPDATE" if view.locks else "")
            for k, *found in view.rows(query, (missing,)):
                self.read_rows[_bytes(k)] = tables.row_of(tuple(found))
            for k in missing:
                self.read_rows.setdefault(k, None)
        whole: list[tables.Columns] = []
        gone: list[bytes] = []
        for k, writes in changed.items():
            stored = self.read_rows[k]
            doc, plan, tomb = (None, None, None) if stored is None else stored[:3]
            doc = writes.get(Table.CALLS, doc)
            plan = writes.get(Table.PLAN_ROWS, plan)
            tomb = writes.get(Table.TOMBSTONES, tomb)
            if doc is None and tomb is None and plan is None:
                gone.append(k)
            else:
                whole.append(tables.columns(k, doc, plan, tomb))
        if gone:
            view.run("DELETE FROM effectd_calls WHERE k = ANY(%s::bytea[])", (gone,))
        if whole:
            view.run(tables.UPSERT_CALLS, tables.upsert_params(whole))

    def _flush_usage(self, view: PgReadView, shard: int) -> int:
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
        return len(changes)


class PgWriteView(PgReadView):
    """A `WriteView` of one write function of a batch; also `AddsUsage`,
    `IssuesRevisions` and `SkipsRevisions`. Its writes stay in memory; `done`
    hands them to the batch once the function returned (one that raises
    leaves nothing)."""

    def __init__(
        self,
        conn: _Conn,
        batch: Batch,
        summarize: Summarize | None = None,
        *,
        lock: bool = False,
    ) -> None:
        super().__init__(conn, batch.read_rows, lock=lock)
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
