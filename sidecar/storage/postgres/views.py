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
(`Batch`), seen by the functions after it, and sent before COMMIT in one
statement where they touch no row twice (each table's writes a
data-modifying part of one WITH). A database error inside a view is raised
as `DatabaseFailed`, which is not an `Exception`: no `except Exception` in a
write function can take it for a refusal and commit what it wrote before.

A write view of a locking batch (`Batch(locking=True)`, the store's) makes
every compare-and-swap hold at READ COMMITTED: each row it reads (a call
row, a key of a key-value table, the rows a scan returns) is read
`FOR UPDATE`, locked until COMMIT, so no other transaction changes what the
function decided on; a key read absent is inserted by a plain INSERT, so a
concurrent insert of the same key fails the batch with a unique violation
(run again: `faults.CONFLICTS`); a namespace's usage is read after locking
its lock row (`USAGE_LOCK_SHARD`), so quota checks of one namespace take
turns. A scan of the registrations raises `Alone`: the store runs that
function again in a transaction of its own that holds the registrations'
lock (`REGISTRATIONS_LOCK`) from its first statement; every other read of a
registration holds that lock shared. `sidecar.storage.postgres.store` says
why each is there.

Over 400 lines on purpose: the reads, the writes kept in memory and their
flush are one translation of the seam, read together.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from typing import LiteralString

import psycopg

from sidecar.ledger.quota import Usage
from sidecar.storage import keys, records, usage
from sidecar.storage.api import Table
from sidecar.storage.keys import check_key
from sidecar.storage.plan_rows import Summarize
from sidecar.storage.postgres import tables
from sidecar.storage.postgres.call_reads import PgCallReads
from sidecar.storage.postgres.faults import Backend, Xact, xact_of
from sidecar.storage.table_ledger import TableLedger, TableLedgerReads

# Counter rows per namespace: each connection adds to the row of its
# backend's process id modulo this.
USAGE_SHARDS = 64
# The row of a namespace that a write deciding on its usage (a quota check)
# locks first, all zeros: no connection adds to it.
USAGE_LOCK_SHARD = -1
# pg_advisory_xact_lock key of the registrations (`Table.DAEMONS`): held
# exclusively by a write function that scans them (`Alone`), shared by any
# other transaction that reads one. "effectdR" in ASCII.
REGISTRATIONS_LOCK = 0x65_66_66_65_63_74_64_52


# A statement's parameters: by position, or by name.
Params = tuple[object, ...] | Mapping[str, object]


class StoreConnection(psycopg.Connection[tuple[object, ...]]):
    """A connection of the store's pools, whose statements share one cursor:
    psycopg's `execute` makes a cursor each time (an adapters map, a
    preparing state), about a third of a point read's CPU in psycopg. A view
    reads each statement's rows before it sends the next."""

    _statements: psycopg.Cursor[tuple[object, ...]] | None = None
    # The server process it talks to, learnt when a write pool made it
    # (`PostgresStore`): a save lost with it is settled by ending that
    # process (`call_saves.settle`). None: not learnt.
    backend: Backend | None = None

    def statement(
        self, query: LiteralString, params: Params
    ) -> psycopg.Cursor[tuple[object, ...]]:
        """`query` run on the connection's cursor."""
        cursor = self._statements
        if cursor is None:
            cursor = self._statements = self.cursor()
        return cursor.execute(query, params)


_Conn = StoreConnection
# A statement and its parameters.
Statement = tuple[LiteralString, tuple[object, ...]]
# What opens a write transaction on a connection in autocommit mode (the
# store's writers); more statements may follow it (a pooler's settings).
BEGIN: Statement = ("BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE", ())
# What opens a read on a snapshot of its own (the store's snapshot reads).
READ_BEGIN: Statement = ("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", ())


# The names of the parts of a flush's one statement (`Batch._send`), and
# the reads of their results.
_PARTS: tuple[LiteralString, ...] = (
    "w0",
    "w1",
    "w2",
    "w3",
    "w4",
    "w5",
    "w6",
    "w7",
    "w8",
    "w9",
    "w10",
    "w11",
    "w12",
    "w13",
    "w14",
    "w15",
    "w16",
    "w17",
    "w18",
    "w19",
    "w20",
    "w21",
    "w22",
    "w23",
)
# What each write returns: the transaction's id and its server's start time
# (`faults.Xact`).
_RETURNING: LiteralString = (
    " RETURNING pg_current_xact_id()::text AS x, pg_postmaster_start_time() AS s"
)
_READS: tuple[LiteralString, ...] = (
    "SELECT x, s FROM w0",
    "SELECT x, s FROM w1",
    "SELECT x, s FROM w2",
    "SELECT x, s FROM w3",
    "SELECT x, s FROM w4",
    "SELECT x, s FROM w5",
    "SELECT x, s FROM w6",
    "SELECT x, s FROM w7",
    "SELECT x, s FROM w8",
    "SELECT x, s FROM w9",
    "SELECT x, s FROM w10",
    "SELECT x, s FROM w11",
    "SELECT x, s FROM w12",
    "SELECT x, s FROM w13",
    "SELECT x, s FROM w14",
    "SELECT x, s FROM w15",
    "SELECT x, s FROM w16",
    "SELECT x, s FROM w17",
    "SELECT x, s FROM w18",
    "SELECT x, s FROM w19",
    "SELECT x, s FROM w20",
    "SELECT x, s FROM w21",
    "SELECT x, s FROM w22",
    "SELECT x, s FROM w23",
)


class Alone(BaseException):
    """A write function scanned the registrations in a transaction that does
    not hold their lock exclusively: the store runs it again, alone, in one
    that does. Not an `Exception`, like `DatabaseFailed`."""


class Locks:
    """What the write transaction of a locking batch holds, beyond its rows:
    the keys of key-value tables it read absent (inserted by a plain INSERT),
    the namespaces whose lock row it locked, and the registrations' lock."""

    def __init__(self, *, alone: bool) -> None:
        self.absent: set[tuple[Table, bytes]] = set()
        # Namespace -> its counters, read once its lock row was locked; the
        # batch adds its changes to that row (inserted: one read absent).
        self.usage: dict[bytes, Usage] = {}
        self.lockless: set[bytes] = set()
        # Exclusive (alone) or shared, once taken.
        self.alone = alone
        self.registrations = alone


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


class PgReadView(PgCallReads, TableLedgerReads):
    """A `ReadView` of the transaction open on `conn`. The call rows it
    read are kept in `rows` (each read once: a record and its tombstone are
    one row); with `locks` (a write transaction's), what it reads is locked
    as the module says."""

    def __init__(
        self,
        conn: _Conn,
        rows: dict[bytes, tables.Row | None] | None = None,
        *,
        locks: Locks | None = None,
        opening: list[Statement] | None = None,
    ) -> None:
        self._conn = conn
        self._read_rows: dict[bytes, tables.Row | None] = {} if rows is None else rows
        self._locks = locks
        self._lock = locks is not None
        # What opens the transaction, not sent yet (shared by the views of
        # one transaction; emptied once sent).
        self._opening = opening

    def _cursor(
        self, query: LiteralString, params: Params
    ) -> psycopg.Cursor[tuple[object, ...]]:
        """`query` run. The transaction's first statement is sent with what
        opens it (`BEGIN`, and a pooler's settings), in one round trip: one
        pipeline, whose results are all read at its end."""
        conn, opening = self._conn, self._opening
        try:
            if not opening:
                return conn.statement(query, params)
            with conn.pipeline():
                for statement, values in opening:
                    conn.execute(statement, values)
                cursor = conn.execute(query, params)
            opening.clear()
            return cursor
        except psycopg.Error as exc:
            raise DatabaseFailed(exc) from exc

    def _rows(self, query: LiteralString, params: Params) -> list[tuple[object, ...]]:
        cursor = self._cursor(query, params)
        try:
            return cursor.fetchall()
        except psycopg.Error as exc:
            raise DatabaseFailed(exc) from exc

    @property
    def locks(self) -> bool:
        """Whether the rows this view reads are locked until the commit."""
        return self._lock

    def rows(self, query: LiteralString, params: Params) -> list[tuple[object, ...]]:
        """The rows of `query`."""
        return self._rows(query, params)

    def run(self, query: LiteralString, params: tuple[object, ...]) -> None:
        """Runs a statement that returns nothing."""
        self._cursor(query, params)

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
            return self._kv(table, key)
        return tables.value_in(table, key, self.call_row(tables.family_key(table, key)))

    def _kv(self, table: Table, key: bytes) -> bytes | None:
        locks = self._locks
        if locks is None:
            rows = self._rows(
                tables.on_table(table, "SELECT v FROM {t} WHERE k = %s"), (key,)
            )
            return _bytes(rows[0][0]) if rows else None
        if table is Table.DAEMONS and not locks.registrations:
            self._rows("SELECT pg_advisory_xact_lock_shared(%s)", (REGISTRATIONS_LOCK,))
            locks.registrations = True
        rows = self._rows(
            tables.on_table(table, "SELECT v FROM {t} WHERE k = %s FOR UPDATE"),
            (key,),
        )
        if not rows:
            locks.absent.add((table, key))
            return None
        return _bytes(rows[0][0])

    def _scan_locks(self, table: Table) -> LiteralString:
        """What a scan of `table` in a write transaction takes first; the
        clause that locks the rows it returns."""
        locks = self._locks
        if locks is None:
            return ""
        if table is Table.DAEMONS:
            if not locks.alone:
                raise Alone
            return ""
        if table is Table.USAGE:
            # A recount (`usage.ensure_counted`): every counter writer waits.
            self.run("LOCK TABLE effectd_usage IN EXCLUSIVE MODE", ())
            return ""
        return " FOR UPDATE"

    def _ranged(
        self,
        select: LiteralString,
        head: tuple[object, ...],
        prefix: bytes,
        after: bytes | None,
        lock: LiteralString = "",
    ) -> Iterator[tuple[bytes, bytes]]:
        """The (key, value) rows of `select` in the key range of a prefix
        scan, in key order, a batch per round trip; `lock` ends the query."""
        low, inclusive, upper = tables.key_range(prefix, after)
        while True:
            query = tables.range_query(select, inclusive, upper is not None) + lock
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
        lock: LiteralString = "",
    ) -> Iterator[bytes]:
        """The derived keys of a time-ordered scan after `start`."""
        while True:
            rows = self._rows(query + lock, (*head, *start, tables.SCAN_BATCH))
            for t, k in rows:
                yield key(_int(t), _bytes(k))
            if len(rows) < tables.SCAN_BATCH:
                return
            start = (_int(rows[-1][0]), _bytes(rows[-1][1]))

    def scan(
        self, table: Table, prefix: bytes, *, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        lock = self._scan_locks(table)
        if table is Table.USAGE:
            yield from self._usages(prefix, after)
        elif table in tables.KV:
            yield from self._ranged(tables.kv_select(table), (), prefix, after, lock)
        elif table in tables.FAMILY:
            select = tables.family_select(table)
            yield from self._ranged(select, (), prefix, after, lock)
        elif table is Table.CALL_STATES:
            for code, sub, sub_after in tables.state_ranges(prefix, after):
                for k, _ in self._ranged(
                    tables.STATE_SELECT, (code,), sub, sub_after, lock
                ):
                    yield bytes([code]) + k, b""
        else:
            yield from (
                (key, b"")
                for key in self._derived_times(table, after, lock)
                if key.startswith(prefix) and (after is None or key > after)
            )

    def _derived_times(
        self, table: Table, after: bytes | None, lock: LiteralString
    ) -> Iterator[bytes]:
        if table is Table.TOMBSTONE_TIMES:
            yield from self._timed(
                tables.TOMBSTONE_SCAN,
                (),
                tables.time_bound(after, 0),
                lambda t, k: t.to_bytes(8, "big") + k,
                lock,
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
                lock,
            )

    def _usage(self, namespace: bytes) -> bytes | None:
        locks = self._locks
        if locks is None:
            rows = self._rows(
                "SELECT coalesce(sum(open_calls), 0), "
                "coalesce(sum(stored_bytes), 0), coalesce(sum(tombstone_bytes), 0) "
                "FROM effectd_usage WHERE namespace = %s",
                (namespace,),
            )
            total = Usage(*(_int(n) for n in rows[0]))
        else:
            found = locks.usage.get(namespace)
            total = self._locked_usage(namespace) if found is None else found
        return None if total == Usage() else usage.encode(total)

    def _locked_usage(self, namespace: bytes) -> Usage:
        """The counters of `namespace`, its lock row locked first and kept
        for the rest of the transaction (`Locks.usage`).

        The lock row is read `FOR UPDATE`: as its newest version, after
        waiting for any transaction holding it; the other shards as of the
        statement's start. Every write that decided on the namespace's usage
        held the lock row and added its changes to it (`Batch.flush`; a lock
        row read absent is inserted then by a plain INSERT, so two first
        checks of a namespace meet as two inserts of one key), so each quota
        check counts every earlier one exactly; the other shards hold
        changes no quota decided on (results committed, calls finished),
        which may be counted before or after. Locking writes no row."""
        locks = self._locks
        assert locks is not None
        rows = self._rows(
            "WITH l AS (SELECT open_calls, stored_bytes, tombstone_bytes "
            "FROM effectd_usage WHERE namespace = %s AND shard = %s FOR UPDATE), "
            "o AS (SELECT coalesce(sum(open_calls), 0) AS open_calls, "
            "coalesce(sum(stored_bytes), 0) AS stored_bytes, "
            "coalesce(sum(tombstone_bytes), 0) AS tombstone_bytes "
            "FROM effectd_usage WHERE namespace = %s AND shard <> %s) "
            "SELECT (SELECT count(*) FROM l), "
            "o.open_calls + coalesce((SELECT open_calls FROM l), 0), "
            "o.stored_bytes + coalesce((SELECT stored_bytes FROM l), 0), "
            "o.tombstone_bytes + coalesce((SELECT tombstone_bytes FROM l), 0) "
            "FROM o",
            (namespace, USAGE_LOCK_SHARD, namespace, USAGE_LOCK_SHARD),
        )
        found, *counters = (_int(n) for n in rows[0])
        if not found:
            locks.lockless.add(namespace)
        total = Usage(*counters)
        locks.usage[namespace] = total
        return total

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
    functions before it without a round trip each. With `locking`, what its
    views read is locked (the module says how); `alone`: the transaction
    holds the registrations' lock exclusively (`Alone`)."""

    def __init__(
        self,
        *,
        locking: bool = True,
        alone: bool = False,
        opening: list[Statement] | None = None,
    ) -> None:
        super().__init__()
        # What opens the transaction, sent with its first statement: on a
        # connection in autocommit mode (the store's writers), BEGIN first.
        self.opening = [BEGIN] if opening is None else opening
        # The call rows the transaction read, as stored (`PgReadView.call_row`).
        self.read_rows: dict[bytes, tables.Row | None] = {}
        self.locks = Locks(alone=alone) if locking else None
        # The transaction, once a write returned its id.
        self.xact: Xact | None = None
        # Writes not sent yet (`_write`).
        self._pending: list[tuple[LiteralString, tuple[object, ...]]] = []

    def flush(self, conn: _Conn, shard: int) -> Xact | None:
        """Sends every write, in one statement (the writes of each table its
        own data-modifying part of a WITH) where it can; returns the id of
        the transaction (`pg_current_xact_id` and its server's start time,
        returned by its writes), or None when it wrote nothing."""
        view = PgReadView(conn, self.read_rows, locks=self.locks, opening=self.opening)
        for table in tables.KV:
            self._flush_kv(view, table)
        self._flush_calls(view)
        self._flush_usage(view, shard)
        self._send(view)
        return self.xact

    def _write(
        self,
        view: PgReadView,
        query: LiteralString,
        params: tuple[object, ...],
        *,
        now: bool = False,
    ) -> None:
        """A write, sent with the others by `_send` (`now`: at once, before
        them: it must precede a write of the same rows)."""
        self._pending.append((query, params))
        if now:
            self._send(view)

    def _send(self, view: PgReadView) -> None:
        """Sends the pending writes, touching no row twice: each part sees
        the rows as they were before the statement, and all of them run.
        Keeps the transaction's id their rows return."""
        pending, self._pending = (
            self._pending[: len(_PARTS)],
            self._pending[len(_PARTS) :],
        )
        if not pending:
            return
        if len(pending) == 1:
            query, params = pending[0][0] + _RETURNING, pending[0][1]
        else:
            parts: list[LiteralString] = []
            reads: list[LiteralString] = []
            values: list[object] = []
            for name, read, (part, part_params) in zip(
                _PARTS, _READS, pending, strict=False
            ):
                parts.append(name + " AS (" + part + _RETURNING + ")")
                reads.append(read)
                values.extend(part_params)
            query = "WITH " + ", ".join(parts) + " " + " UNION ALL ".join(reads)
            query += " LIMIT 1"
            params = tuple(values)
        rows = view.rows(query, params)
        if rows and self.xact is None:
            self.xact = xact_of(rows[0])
        self._send(view)

    def _absent(self, table: Table, key: bytes) -> bool:
        """Whether `key` of a key-value table was read absent by a locking
        view: inserted by a plain INSERT, never over a concurrent one."""
        return self.locks is not None and (table, key) in self.locks.absent

    def _flush_kv(self, view: PgReadView, table: Table) -> None:
        puts = [
            (k, v) for (t, k), v in self.rows.items() if t is table and v is not None
        ]
        deletes = [k for (t, k), v in self.rows.items() if t is table and v is None]
        if deletes:
            self._write(
                view,
                tables.on_table(table, "DELETE FROM {t} WHERE k = ANY(%s::bytea[])"),
                (deletes,),
            )
        new = [(k, v) for k, v in puts if self._absent(table, k)]
        over = [(k, v) for k, v in puts if not self._absent(table, k)]
        for rows, conflict in ((new, ""), (over, tables.KV_ON_CONFLICT)):
            if rows:
                self._put_kv(view, table, rows, conflict)

    def _put_kv(
        self,
        view: PgReadView,
        table: Table,
        puts: list[tuple[bytes, bytes]],
        conflict: LiteralString,
    ) -> None:
        if table is Table.CHECKPOINTS:
            rows: list[tables.Columns] = []
            for k, v in puts:
                head = records.checkpoint_head(v)
                revision, updated = (None, None) if head is None else head
                rows.append((k, keys.namespace_of(k), revision, updated, v))
            on_conflict = tables.CHECKPOINT_ON_CONFLICT if conflict else ""
            self._write(
                view,
                *tables.one_or_many(
                    rows,
                    tables.CHECKPOINT_INSERT_ONE + on_conflict,
                    tables.CHECKPOINT_INSERT + on_conflict,
                ),
            )
            return
        self._write(
            view,
            *tables.one_or_many(
                list(puts),
                tables.on_table(table, tables.KV_INSERT_ONE + conflict),
                tables.on_table(table, tables.KV_INSERT + conflict),
            ),
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
        whole, new, gone = self._call_rows(changed, locking=view.locks)
        if gone:
            self._write(
                view, "DELETE FROM effectd_calls WHERE k = ANY(%s::bytea[])", (gone,)
            )
        if new:
            self._write(
                view, *tables.one_or_many(new, tables.INSERT_CALL, tables.INSERT_CALLS)
            )
        if whole:
            self._write(
                view,
                *tables.one_or_many(whole, tables.UPSERT_CALL, tables.UPSERT_CALLS),
            )

    def _call_rows(
        self, changed: dict[bytes, dict[Table, bytes | None]], *, locking: bool
    ) -> tuple[list[tables.Columns], list[tables.Columns], list[bytes]]:
        """The rows of `changed` calls to write over stored (or unread)
        ones, to insert (read absent by a locking view), and to delete."""
        whole: list[tables.Columns] = []
        new: list[tables.Columns] = []
        gone: list[bytes] = []
        for k, writes in changed.items():
            stored = self.read_rows[k]
            doc, plan, tomb = (None, None, None) if stored is None else stored[:3]
            doc = writes.get(Table.CALLS, doc)
            plan = writes.get(Table.PLAN_ROWS, plan)
            tomb = writes.get(Table.TOMBSTONES, tomb)
            if doc is None and tomb is None and plan is None:
                if stored is not None:
                    gone.append(k)
            elif stored is None and locking:
                # Read absent: inserted, never over a concurrent insert.
                new.append(tables.columns(k, doc, plan, tomb))
            else:
                whole.append(tables.columns(k, doc, plan, tomb))
        return whole, new, gone

    def _flush_usage(self, view: PgReadView, shard: int) -> int:
        if self.totals:
            # A total replaces every shard's row of its namespace: deleted
            # before the totals are inserted.
            self._write(
                view,
                "DELETE FROM effectd_usage WHERE namespace = ANY(%s::bytea[])",
                (list(self.totals),),
                now=True,
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
            # The namespaces whose usage the batch decided on: on the lock
            # row it holds (or inserts), so that the next check counts them.
            locks = self.locks
            locked = {} if locks is None else locks.usage
            new = set() if locks is None else locks.lockless
            names = sorted(changes)
            for chosen, conflict in (
                ([n for n in names if n in new], ""),
                ([n for n in names if n not in new], tables.USAGE_ON_CONFLICT),
            ):
                if not chosen:
                    continue
                rows: list[tables.Columns] = [
                    (
                        n,
                        USAGE_LOCK_SHARD if n in locked else shard,
                        changes[n].open_calls,
                        changes[n].stored_bytes,
                        changes[n].tombstone_bytes,
                    )
                    for n in chosen
                ]
                self._write(
                    view,
                    *tables.one_or_many(
                        rows,
                        tables.USAGE_INSERT_ONE + conflict,
                        tables.USAGE_INSERT + conflict,
                    ),
                )
        return len(changes)


class PgWriteView(PgReadView, TableLedger):
    """A `WriteView` of one write function of a batch; also `AddsUsage`,
    `IssuesRevisions` and `SkipsRevisions`. Its writes stay in memory; `done`
    hands them to the batch once the function returned (one that raises
    leaves nothing). It reads the ledger through the tables, which hold
    those writes and lock what they read (`call_reads` says so)."""

    calls_in_state = TableLedger.calls_in_state
    plan = TableLedger.plan
    retained = TableLedger.retained

    def __init__(
        self, conn: _Conn, batch: Batch, summarize: Summarize | None = None
    ) -> None:
        super().__init__(
            conn, batch.read_rows, locks=batch.locks, opening=batch.opening
        )
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

    def assume_absent(self, k: bytes) -> None:
        """Takes the call row under `k` as absent, unread, when this view's
        batch has not read it: its writer decided so on a read outside the
        transaction. Only on a locking view, where a row read absent is
        written by a plain INSERT, which fails on a row stored meanwhile
        (`store._NewCall`); elsewhere, nothing."""
        if self._lock:
            self._read_rows.setdefault(k, None)

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
