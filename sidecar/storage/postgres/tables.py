"""Where each `api.Table` lives in the PostgreSQL schema (version 3,
`sidecar.storage.postgres.schema`), read and written through the seam's keys.

One table per concept:

- `effectd_calls`: one row per call identity (its record key), holding the
  record document (`doc`), its plan row (`plan`) or, once compacted, its
  tombstone (`tomb`), with typed columns of what is queried: namespace, run,
  call, state, revision, attempt, lease expiry, creation, last change, the
  acknowledged flag, `retained_ns` (the last change of a COMMITTED record
  with a result: what a retention pass may compact) and `compacted_ns`.
  `Table.CALLS`, `PLAN_ROWS` and `TOMBSTONES` are its columns; the indexes
  `CALL_STATES`, `RETENTION_TIMES` and `TOMBSTONE_TIMES` are not stored at
  all: they are read from its columns through partial indexes, and the
  writes the seam makes to them are kept only for the write function's own
  reads. A new call and the tombstone it must not have are one row, so a
  new call is an insert of its key and nothing else: no two writers of
  different calls touch a common key, and no commit writes a key ordered by
  time into a table that every commit writes.
- `effectd_checkpoints` (key, namespace, revision, last change, value),
  `effectd_audit`, `effectd_meta`, `effectd_daemons`, `effectd_passes`:
  key to value, as the seam has them.
- `effectd_usage`: the counters (`sidecar.storage.postgres.views`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, LiteralString

from sidecar.ledger.model import State
from sidecar.storage import keys, records
from sidecar.storage.api import Table

# Rows read per round trip of a scan.
SCAN_BATCH = 500

STATE_CODES = {s: records.state_prefix(s)[0] for s in State}
_STATES_BY_VALUE = {s.value: STATE_CODES[s] for s in State}
_CODES = sorted(STATE_CODES.values())
_TIME = 8

# The tables that are columns of `effectd_calls`, and those read from them.
FAMILY = frozenset({Table.CALLS, Table.PLAN_ROWS, Table.TOMBSTONES})
DERIVED = frozenset({Table.CALL_STATES, Table.RETENTION_TIMES, Table.TOMBSTONE_TIMES})
KV: dict[Table, LiteralString] = {
    Table.META: "effectd_meta",
    Table.AUDIT: "effectd_audit",
    Table.DAEMONS: "effectd_daemons",
    Table.PASSES: "effectd_passes",
    Table.CHECKPOINTS: "effectd_checkpoints",
}
_COLUMN: dict[Table, LiteralString] = {
    Table.CALLS: "doc",
    Table.PLAN_ROWS: "plan",
    Table.TOMBSTONES: "tomb",
}

# What a read of one call row keeps: (doc, plan, tomb, state, acknowledged,
# retained_ns, compacted_ns); None: no row.
Row = tuple[
    bytes | None, bytes | None, bytes | None, int | None, bool, int | None, int | None
]
ROW_QUERY: LiteralString = (
    "SELECT doc, plan, tomb, state, acknowledged, retained_ns, compacted_ns "
    "FROM effectd_calls WHERE k = %s"
)
ROWS_QUERY: LiteralString = (
    "SELECT k, doc, plan, tomb, state, acknowledged, retained_ns, compacted_ns "
    "FROM effectd_calls WHERE k = ANY(%s::bytea[])"
)


def _opt_bytes(value: object) -> bytes | None:
    if value is None:
        return None
    assert isinstance(value, bytes | memoryview), type(value)
    return bytes(value)


def _opt_int(value: object) -> int | None:
    if value is None:
        return None
    assert isinstance(value, int), type(value)
    return value


def row_of(found: tuple[object, ...]) -> Row:
    doc, plan, tomb, state, ack, retained, compacted = found
    return (
        _opt_bytes(doc),
        _opt_bytes(plan),
        _opt_bytes(tomb),
        _opt_int(state),
        bool(ack),
        _opt_int(retained),
        _opt_int(compacted),
    )


def family_key(table: Table, key: bytes) -> bytes:
    """The call row's key of a key of `table` (a family or derived table)."""
    if table is Table.CALL_STATES:
        return key[1:]
    if table is Table.RETENTION_TIMES:
        return key[1 + _TIME :]
    if table is Table.TOMBSTONE_TIMES:
        return key[_TIME:]
    return key


def value_in(  # noqa: PLR0911 (one answer per table)
    table: Table, key: bytes, row: Row | None
) -> bytes | None:
    """The value `table` holds under `key`, read from its call's row."""
    if row is None:
        return None
    doc, plan, tomb, state, ack, retained, compacted = row
    if table is Table.CALLS:
        return doc
    if table is Table.PLAN_ROWS:
        return plan
    if table is Table.TOMBSTONES:
        return tomb
    if table is Table.CALL_STATES:
        return b"" if doc is not None and state == key[0] else None
    if table is Table.RETENTION_TIMES:
        return (
            b""
            if retained is not None
            and retention_key(ack, retained, b"") == key[: 1 + _TIME]
            else None
        )
    if table is Table.TOMBSTONE_TIMES:
        return (
            b""
            if tomb is not None
            and compacted is not None
            and compacted.to_bytes(_TIME, "big") == key[:_TIME]
            else None
        )
    raise AssertionError(table)


def retention_key(acknowledged: bool, retained_ns: int, k: bytes) -> bytes:
    return bytes([1 if acknowledged else 0]) + retained_ns.to_bytes(_TIME, "big") + k


# -- the columns of a row ------------------------------------------------------

Columns = tuple[object, ...]
# The rows an INSERT writes come as arrays, one per column, unnested; one
# row as VALUES of plain parameters (`one_or_many`): a call at a time is the
# common case, and psycopg dumps a plain value in C where it dumps each array
# in Python, about 18 times the work for an array of one.
_CALLS_INTO: LiteralString = (
    "INSERT INTO effectd_calls AS t (k, namespace, run_id, call_id, state, "
    "revision, attempt, lease_expires_ns, created_ns, updated_ns, acknowledged, "
    "retained_ns, doc, plan, tomb, compacted_ns) "
)
_CALLS_ARRAYS: LiteralString = (
    "SELECT * FROM unnest(%s::bytea[], %s::text[], %s::text[], %s::text[], "
    "%s::smallint[], %s::bigint[], %s::integer[], %s::bigint[], %s::bigint[], "
    "%s::bigint[], %s::boolean[], %s::bigint[], %s::bytea[], %s::bytea[], "
    "%s::bytea[], %s::bigint[])"
)
_CALLS_VALUES: LiteralString = (
    "VALUES (%s::bytea, %s::text, %s::text, %s::text, %s::smallint, %s::bigint, "
    "%s::integer, %s::bigint, %s::bigint, %s::bigint, %s::boolean, %s::bigint, "
    "%s::bytea, %s::bytea, %s::bytea, %s::bigint)"
)
_CALLS_ON_CONFLICT: LiteralString = (
    " ON CONFLICT (k) DO UPDATE SET namespace = EXCLUDED.namespace, "
    "run_id = EXCLUDED.run_id, call_id = EXCLUDED.call_id, state = EXCLUDED.state, "
    "revision = EXCLUDED.revision, attempt = EXCLUDED.attempt, "
    "lease_expires_ns = EXCLUDED.lease_expires_ns, created_ns = EXCLUDED.created_ns, "
    "updated_ns = EXCLUDED.updated_ns, acknowledged = EXCLUDED.acknowledged, "
    "retained_ns = EXCLUDED.retained_ns, doc = EXCLUDED.doc, plan = EXCLUDED.plan, "
    "tomb = EXCLUDED.tomb, compacted_ns = EXCLUDED.compacted_ns"
)
# New rows: a row inserted meanwhile by another transaction fails it (a
# unique violation), never overwritten.
INSERT_CALLS: LiteralString = _CALLS_INTO + _CALLS_ARRAYS
INSERT_CALL: LiteralString = _CALLS_INTO + _CALLS_VALUES
# Rows read (and locked) as stored, written whole.
UPSERT_CALLS: LiteralString = INSERT_CALLS + _CALLS_ON_CONFLICT
UPSERT_CALL: LiteralString = INSERT_CALL + _CALLS_ON_CONFLICT
_UPSERT_WIDTH = 16


def columns(
    k: bytes, doc: bytes | None, plan: bytes | None, tomb: bytes | None
) -> Columns:
    """The row of `effectd_calls` holding these documents, its typed columns
    read from them (a record document's own fields; a tombstone's time)."""
    namespace = keys.namespace_of(k)
    run_id = call_id = state = revision = attempt = lease = None
    created = updated = retained = compacted = None
    acknowledged = False
    d = _document(doc)
    if d is not None:
        _, run_id, call_id = d["ref"]
        state = _STATES_BY_VALUE[d["state"]]
        revision = d["rev"]
        attempt = d["attempt"]
        lease = None if d["lease"] is None else d["lease"][2]
        created = d["created"]
        updated = d["updated"]
        acknowledged = bool(d["ack"])
        if d["state"] == State.COMMITTED.value and d["result"] is not None:
            retained = updated
    t = _document(tomb)
    if t is not None:
        compacted = t["compacted"]
    return (
        k, namespace, run_id, call_id, state, revision, attempt, lease, created,
        updated, acknowledged, retained, doc, plan, tomb, compacted,
    )  # fmt: skip


def _document(raw: bytes | None) -> dict[str, Any] | None:
    """A stored JSON document with the fields the typed columns are read
    from; None for anything else (a value the seam's byte-keyed contract
    stores as it is, with no columns)."""
    if raw is None:
        return None
    try:
        found = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None
    if "compacted" in found:
        return found
    return found if found.get("state") in _STATES_BY_VALUE else None


def _arrays(rows: Iterable[Columns], width: int) -> tuple[list[object], ...]:
    """The rows' values as arrays, one per column."""
    arrays: tuple[list[object], ...] = tuple([] for _ in range(width))
    for row in rows:
        for array, value in zip(arrays, row, strict=True):
            array.append(value)
    return arrays


def upsert_params(rows: Iterable[Columns]) -> tuple[list[object], ...]:
    """The arrays of `UPSERT_CALLS`, one per column."""
    return _arrays(rows, _UPSERT_WIDTH)


def one_or_many(
    rows: list[Columns], one: LiteralString, many: LiteralString
) -> tuple[LiteralString, tuple[object, ...]]:
    """The statement that writes `rows` and its parameters: `one` with the
    row's own values for a single row, else `many` with an array per
    column."""
    if len(rows) == 1:
        return one, rows[0]
    return many, _arrays(rows, len(rows[0]))


# -- scans ----------------------------------------------------------------------


def successor(prefix: bytes) -> bytes | None:
    """The least key greater than every key starting with `prefix`; None
    when there is none (empty, or all 0xFF)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def key_range(prefix: bytes, after: bytes | None) -> tuple[bytes, bool, bytes | None]:
    """(low key, whether inclusive, upper bound or None) of a prefix scan."""
    if after is None or after < prefix:
        return prefix, True, successor(prefix)
    return after, False, successor(prefix)


def range_query(select: LiteralString, inclusive: bool, bounded: bool) -> LiteralString:
    """`select` (ending in a WHERE clause's conditions) with the key range
    and the batch limit; parameters: low, [upper,] limit."""
    low: LiteralString = " AND k >= %s" if inclusive else " AND k > %s"
    upper: LiteralString = " AND k < %s" if bounded else ""
    return select + low + upper + " ORDER BY k LIMIT %s"


def on_table(table: Table, template: LiteralString) -> LiteralString:
    """`template` with `{t}` replaced by the name of `table`'s own table and
    `{c}` by the column of `effectd_calls` it is (constants, never input)."""
    if table in KV:
        return template.replace("{t}", KV[table])
    return template.replace("{c}", _COLUMN[table])


def kv_select(table: Table) -> LiteralString:
    return on_table(table, "SELECT k, v FROM {t} WHERE true")


def family_select(table: Table) -> LiteralString:
    return on_table(table, "SELECT k, {c} FROM effectd_calls WHERE {c} IS NOT NULL")


STATE_SELECT: LiteralString = (
    "SELECT k, NULL FROM effectd_calls WHERE state = %s AND doc IS NOT NULL"
)


def state_ranges(
    prefix: bytes, after: bytes | None
) -> Iterator[tuple[int, bytes, bytes | None]]:
    """(state code, prefix, after) of each state's part of a scan of
    `Table.CALL_STATES`, in key order."""
    for code in _CODES:
        head = bytes([code])
        if prefix and prefix[0] != code:
            continue
        sub_after: bytes | None = None
        if after is not None:
            if after[:1] > head:
                continue
            if after[:1] == head:
                sub_after = after[1:]
        yield code, prefix[1:], sub_after


# Time-ordered scans of a derived table: (time, key) after a bound.
RETENTION_SCAN: LiteralString = (
    "SELECT retained_ns, k FROM effectd_calls WHERE retained_ns IS NOT NULL "
    "AND acknowledged = %s AND (retained_ns, k) > (%s, %s) "
    "ORDER BY retained_ns, k LIMIT %s"
)
TOMBSTONE_SCAN: LiteralString = (
    "SELECT compacted_ns, k FROM effectd_calls WHERE tomb IS NOT NULL "
    "AND (compacted_ns, k) > (%s, %s) ORDER BY compacted_ns, k LIMIT %s"
)


def time_bound(after: bytes | None, skip: int) -> tuple[int, bytes]:
    """The (time, key) a time-ordered scan starts after: those of `after`, a
    derived key whose time starts after `skip` bytes (none: before all)."""
    if after is None or len(after) < skip + _TIME:
        return -1, b""
    return int.from_bytes(after[skip : skip + _TIME], "big"), after[skip + _TIME :]


# A key-value table's new keys; with `KV_ON_CONFLICT` after it, keys that
# were read (locked) or not read at all.
KV_INSERT: LiteralString = (
    "INSERT INTO {t} (k, v) SELECT * FROM unnest(%s::bytea[], %s::bytea[])"
)
KV_INSERT_ONE: LiteralString = "INSERT INTO {t} (k, v) VALUES (%s::bytea, %s::bytea)"
KV_ON_CONFLICT: LiteralString = " ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v"
KV_UPSERT: LiteralString = KV_INSERT + KV_ON_CONFLICT
_CHECKPOINT_INTO: LiteralString = (
    "INSERT INTO effectd_checkpoints (k, namespace, revision, updated_ns, v) "
)
_CHECKPOINT_ARRAYS: LiteralString = (
    "SELECT * FROM unnest(%s::bytea[], %s::text[], %s::bigint[], "
    "%s::bigint[], %s::bytea[])"
)
_CHECKPOINT_VALUES: LiteralString = (
    "VALUES (%s::bytea, %s::text, %s::bigint, %s::bigint, %s::bytea)"
)
CHECKPOINT_INSERT: LiteralString = _CHECKPOINT_INTO + _CHECKPOINT_ARRAYS
CHECKPOINT_INSERT_ONE: LiteralString = _CHECKPOINT_INTO + _CHECKPOINT_VALUES
CHECKPOINT_ON_CONFLICT: LiteralString = (
    " ON CONFLICT (k) DO UPDATE SET revision = EXCLUDED.revision, "
    "updated_ns = EXCLUDED.updated_ns, v = EXCLUDED.v"
)

# Counter changes, one row per (namespace, shard); with `USAGE_ON_CONFLICT`
# after it, added to the row there.
_USAGE_INTO: LiteralString = (
    "INSERT INTO effectd_usage AS u (namespace, shard, open_calls, "
    "stored_bytes, tombstone_bytes) "
)
_USAGE_ARRAYS: LiteralString = (
    "SELECT * FROM unnest(%s::bytea[], %s::integer[], %s::bigint[], "
    "%s::bigint[], %s::bigint[])"
)
_USAGE_VALUES: LiteralString = (
    "VALUES (%s::bytea, %s::integer, %s::bigint, %s::bigint, %s::bigint)"
)
USAGE_INSERT: LiteralString = _USAGE_INTO + _USAGE_ARRAYS
USAGE_INSERT_ONE: LiteralString = _USAGE_INTO + _USAGE_VALUES
USAGE_ON_CONFLICT: LiteralString = (
    " ON CONFLICT (namespace, shard) DO UPDATE SET "
    "open_calls = u.open_calls + EXCLUDED.open_calls, "
    "stored_bytes = u.stored_bytes + EXCLUDED.stored_bytes, "
    "tombstone_bytes = u.tombstone_bytes + EXCLUDED.tombstone_bytes"
)
