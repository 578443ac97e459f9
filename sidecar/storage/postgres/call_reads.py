"""The calls of the ledger read the PostgreSQL way (`api.CallReads`,
`api.RetentionReads`): statements on the typed columns of `effectd_calls`
(`storage.postgres.tables`), where the tables of bytes would read each
index through a translation of its keys.

- The records in a state: one statement a batch on the `state` column (the
  partial index `effectd_calls_open` for the open states), of one namespace
  by its `namespace` column; how many of each state, one statement.
- A recovery plan: each record's document and plan row in one statement a
  batch, where the tables read them in two walks side by side.
- What a retention pass may compact: the index `effectd_calls_retained` of
  one acknowledged flag. Read through the tables, a pass over the
  acknowledged records first read every unacknowledged one's key and
  dropped it.

A mixin of the snapshot views (`views.PgReadView`): a write view reads the
tables, which hold what its batch wrote and has not sent, and lock what
they read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import LiteralString, Protocol

from sidecar.ledger.model import State
from sidecar.storage import plan_rows
from sidecar.storage.api import Listed
from sidecar.storage.postgres import tables
from sidecar.storage.table_ledger import listed

_IN_STATE: LiteralString = (
    "SELECT k FROM effectd_calls WHERE state = %s AND doc IS NOT NULL AND k > %s "
    "ORDER BY k LIMIT %s"
)
_IN_STATE_OF: LiteralString = (
    "SELECT k FROM effectd_calls WHERE state = %s AND doc IS NOT NULL "
    "AND namespace = %s AND k > %s ORDER BY k LIMIT %s"
)
_BY_STATE: LiteralString = (
    "SELECT state, count(*) FROM effectd_calls "
    "WHERE state IS NOT NULL AND doc IS NOT NULL GROUP BY state"
)
_PLAN: LiteralString = "SELECT k, plan, doc FROM effectd_calls WHERE doc IS NOT NULL"
_RECORDS: LiteralString = "SELECT k, NULL, doc FROM effectd_calls WHERE doc IS NOT NULL"


class _Statements(Protocol):
    def rows(
        self, query: LiteralString, params: tuple[object, ...]
    ) -> list[tuple[object, ...]]: ...


def _bytes(value: object) -> bytes:
    assert isinstance(value, bytes | memoryview), type(value)
    return bytes(value)


def _count(value: object) -> int:
    assert isinstance(value, int), type(value)
    return value


class PgCallReads:
    """`calls_in_state`, `plan`, `retained` and `state_counts` as statements
    of their own."""

    def calls_in_state(
        self: _Statements,
        state: State,
        namespace: str | None = None,
        *,
        after: bytes | None = None,
    ) -> Iterator[bytes]:
        code = tables.STATE_CODES[state]
        last = b"" if after is None else after
        while True:
            if namespace is None:
                found = self.rows(_IN_STATE, (code, last, tables.SCAN_BATCH))
            else:
                found = self.rows(
                    _IN_STATE_OF, (code, namespace, last, tables.SCAN_BATCH)
                )
            for (k,) in found:
                last = _bytes(k)
                yield last
            if len(found) < tables.SCAN_BATCH:
                return

    def state_counts(self: _Statements) -> dict[State, int]:
        """The records of each state, counted by the server (`api.
        CountsStates`): one statement, a few rows back, however many calls
        are stored."""
        found = {row[0]: row[1] for row in self.rows(_BY_STATE, ())}
        return {s: _count(found.get(code, 0)) for s, code in tables.STATE_CODES.items()}

    def plan(
        self: _Statements,
        prefix: bytes,
        *,
        after: bytes | None = None,
        rows: bool = True,
    ) -> Iterator[tuple[bytes, Listed | bytes]]:
        select = _PLAN if rows else _RECORDS
        low, inclusive, upper = tables.key_range(prefix, after)
        while True:
            query = tables.range_query(select, inclusive, upper is not None)
            bounds = (low,) if upper is None else (low, upper)
            found = self.rows(query, (*bounds, tables.SCAN_BATCH))
            for k, plan, doc in found:
                if plan is not None and plan_rows.is_current(_bytes(plan)):
                    yield _bytes(k), _bytes(plan)
                else:
                    yield _bytes(k), listed(_bytes(doc), history=False)
            if len(found) < tables.SCAN_BATCH:
                return
            low, inclusive = _bytes(found[-1][0]), False

    def retained(
        self: _Statements, *, acknowledged: bool, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        start = tables.time_bound(after, 1)
        while True:
            found = self.rows(
                tables.RETENTION_SCAN, (acknowledged, *start, tables.SCAN_BATCH)
            )
            for t, k in found:
                assert isinstance(t, int), type(t)
                start = (t, _bytes(k))
                yield tables.retention_key(acknowledged, *start), start[1]
            if len(found) < tables.SCAN_BATCH:
                return
