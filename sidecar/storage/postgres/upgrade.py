"""The step of the PostgreSQL schema from version 2 (every table in one
key-value table, `effectd_kv`) to version 3 (one table per concept,
`sidecar.storage.postgres.tables`), in place.

`start`, in the transaction that moves the version, renames `effectd_kv` to
`effectd_kv_2`: a daemon of version 2 still running then fails every
statement (it answers UNAVAILABLE, nothing applied) instead of writing where
no copy reads, and a daemon of version 3 refuses the store until the step
finished (`schema.check`). `copy` copies the rows in transactions of
`CHUNK` rows, each recording how far it got, so a run that crashed resumes
where the last one committed; every row is written by an upsert, so a chunk
copied twice is copied once. `finish` drops `effectd_kv_2`. The indexes of
version 2 (`call_states`, `retention_times`, `tombstone_times`) are not
copied: version 3 reads them from the columns of the call rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, LiteralString

from sidecar.storage import keys, records
from sidecar.storage.api import Table
from sidecar.storage.postgres import tables

if TYPE_CHECKING:
    import psycopg

CHUNK = 1000

CREATE: tuple[LiteralString, ...] = (
    # The state codes are `tables.STATE_CODES` (5: COMMITTED).
    """CREATE TABLE effectd_calls (
        k bytea PRIMARY KEY,
        namespace text NOT NULL,
        run_id text,
        call_id text,
        state smallint,
        revision bigint,
        attempt integer,
        lease_expires_ns bigint,
        created_ns bigint,
        updated_ns bigint,
        acknowledged boolean NOT NULL DEFAULT false,
        retained_ns bigint,
        doc bytea,
        plan bytea,
        tomb bytea,
        compacted_ns bigint
    )""",
    # The open calls by state: the approval queue (2), the reconciliation
    # queue (4), the lease sweep's STARTED calls (3); a COMMITTED record
    # leaves it.
    "CREATE INDEX effectd_calls_open ON effectd_calls (state, k) "
    "WHERE state IS NOT NULL AND state <> 5",
    # What a retention pass may compact, oldest first; read by it alone.
    "CREATE INDEX effectd_calls_retained ON effectd_calls "
    "(acknowledged, retained_ns, k) WHERE retained_ns IS NOT NULL",
    # Tombstones in the order their lifetime ends; read by their expiry.
    "CREATE INDEX effectd_calls_compacted ON effectd_calls (compacted_ns, k) "
    "WHERE tomb IS NOT NULL",
    """CREATE TABLE effectd_checkpoints (
        k bytea PRIMARY KEY,
        namespace text NOT NULL,
        revision bigint,
        updated_ns bigint,
        v bytea NOT NULL
    )""",
    "CREATE TABLE effectd_audit (k bytea PRIMARY KEY, v bytea NOT NULL)",
    "CREATE TABLE effectd_meta (k bytea PRIMARY KEY, v bytea NOT NULL)",
    "CREATE TABLE effectd_daemons (k bytea PRIMARY KEY, v bytea NOT NULL)",
    "CREATE TABLE effectd_passes (k bytea PRIMARY KEY, v bytea NOT NULL)",
)


def start(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """In the migration's transaction: the old table out of every daemon's
    reach, and the progress columns."""
    conn.execute("ALTER TABLE effectd_kv RENAME TO effectd_kv_2")
    conn.execute(
        "ALTER TABLE effectd_schema ADD COLUMN IF NOT EXISTS copied_tbl text, "
        "ADD COLUMN IF NOT EXISTS copied_k bytea"
    )
    conn.execute("UPDATE effectd_schema SET copied_tbl = NULL, copied_k = NULL")


_CALL_DOCS: LiteralString = (
    tables.UPSERT_CALLS.split(" ON CONFLICT")[0]
    + " ON CONFLICT (k) DO UPDATE SET run_id = EXCLUDED.run_id, "
    "call_id = EXCLUDED.call_id, state = EXCLUDED.state, "
    "revision = EXCLUDED.revision, attempt = EXCLUDED.attempt, "
    "lease_expires_ns = EXCLUDED.lease_expires_ns, "
    "created_ns = EXCLUDED.created_ns, updated_ns = EXCLUDED.updated_ns, "
    "acknowledged = EXCLUDED.acknowledged, retained_ns = EXCLUDED.retained_ns, "
    "doc = EXCLUDED.doc"
)
_TOMBS: LiteralString = (
    tables.UPSERT_CALLS.split(" ON CONFLICT")[0]
    + " ON CONFLICT (k) DO UPDATE SET tomb = EXCLUDED.tomb, "
    "compacted_ns = EXCLUDED.compacted_ns"
)
_PLANS: LiteralString = (
    tables.UPSERT_CALLS.split(" ON CONFLICT")[0]
    + " ON CONFLICT (k) DO UPDATE SET plan = EXCLUDED.plan"
)
_FAMILY_SQL = {
    Table.CALLS: _CALL_DOCS,
    Table.TOMBSTONES: _TOMBS,
    Table.PLAN_ROWS: _PLANS,
}


def _bytes(value: object) -> bytes:
    assert isinstance(value, bytes | memoryview), type(value)
    return bytes(value)


def _family_row(table: Table, k: bytes, v: bytes) -> tables.Columns:
    if table is Table.CALLS:
        return tables.columns(k, v, None, None)
    if table is Table.TOMBSTONES:
        return tables.columns(k, None, None, v)
    return tables.columns(k, None, v, None)


def _copy_rows(
    conn: psycopg.Connection[tuple[object, ...]], rows: list[tuple[object, ...]]
) -> None:
    by_table: dict[Table, list[tuple[bytes, bytes]]] = {}
    for tbl, k, v in rows:
        by_table.setdefault(Table(str(tbl)), []).append((_bytes(k), _bytes(v)))
    for table, items in by_table.items():
        if table in tables.DERIVED:
            continue
        if table in tables.FAMILY:
            conn.execute(
                _FAMILY_SQL[table],
                tables.upsert_params(_family_row(table, k, v) for k, v in items),
            )
        elif table is Table.CHECKPOINTS:
            heads = [records.checkpoint_head(v) for _, v in items]
            conn.execute(
                "INSERT INTO effectd_checkpoints (k, namespace, revision, "
                "updated_ns, v) SELECT * FROM unnest(%s::bytea[], %s::text[], "
                "%s::bigint[], %s::bigint[], %s::bytea[]) ON CONFLICT (k) DO "
                "UPDATE SET v = EXCLUDED.v, revision = EXCLUDED.revision, "
                "updated_ns = EXCLUDED.updated_ns",
                (
                    [k for k, _ in items],
                    [keys.namespace_of(k) for k, _ in items],
                    [None if h is None else h[0] for h in heads],
                    [None if h is None else h[1] for h in heads],
                    [v for _, v in items],
                ),
            )
        else:
            conn.execute(
                tables.on_table(table, tables.KV_UPSERT),
                ([k for k, _ in items], [v for _, v in items]),
            )


def copy(
    conn: psycopg.Connection[tuple[object, ...]],
    *,
    chunk: int = CHUNK,
    on_chunk: Callable[[int], None] | None = None,
) -> int:
    """Copies every row of `effectd_kv_2` after the last chunk committed;
    returns how many rows this run copied."""
    copied = 0
    while True:
        with conn.transaction():
            mark = conn.execute(
                "SELECT copied_tbl, copied_k FROM effectd_schema FOR UPDATE"
            ).fetchone()
            assert mark is not None
            tbl, k = mark
            rows = conn.execute(
                "SELECT tbl, k, v FROM effectd_kv_2 WHERE tbl > %(t)s OR "
                "(tbl = %(t)s AND k > %(k)s) ORDER BY tbl, k LIMIT %(n)s",
                {"t": "" if tbl is None else tbl, "k": k or b"", "n": chunk},
            ).fetchall()
            if not rows:
                return copied
            _copy_rows(conn, rows)
            last_tbl, last_k, _ = rows[-1]
            conn.execute(
                "UPDATE effectd_schema SET copied_tbl = %s, copied_k = %s",
                (last_tbl, last_k),
            )
        copied += len(rows)
        if on_chunk is not None:
            on_chunk(copied)


def finish(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Drops the copied table (in the transaction that ends the step)."""
    conn.execute("DROP TABLE IF EXISTS effectd_kv_2")
