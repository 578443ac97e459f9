"""A count of the rows committed to a PostgreSQL store, kept by the database
itself: triggers on the store's tables add each row inserted, updated or
deleted (and each truncation) to a counter row in the store's schema, in
the writing transaction, so a transaction that rolls back counts nothing
and one that commits counts every row it wrote, whoever wrote it. The
PostgreSQL analogue of the LMDB store's count of rows written
(`WriterStats.writes`), for a test that must see that a request wrote
nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

_INSTALL = """
CREATE TABLE effectd_test_rows_written (n bigint NOT NULL);
INSERT INTO effectd_test_rows_written VALUES (0);
CREATE FUNCTION effectd_test_rows_written_add() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE effectd_test_rows_written SET n = n + 1;
    RETURN NULL;
END $$;
"""
_ADD = "EXECUTE FUNCTION effectd_test_rows_written_add()"


def install(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Creates the counter, and its triggers on every table of the store
    (all there are in the first schema of `conn`'s search path, migrated
    before: a table a later schema version adds is counted too)."""
    with conn.transaction():
        found = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        ).fetchall()
        tables = sorted(str(name) for (name,) in found)
        assert "effectd_calls" in tables, f"not a migrated store: {tables}"
        conn.execute(_INSTALL)
        for table in tables:
            conn.execute(
                f"CREATE TRIGGER {table}_rows_counted AFTER INSERT OR UPDATE "
                f"OR DELETE ON {table} FOR EACH ROW {_ADD}"
            )
            conn.execute(
                f"CREATE TRIGGER {table}_truncate_counted AFTER TRUNCATE "
                f"ON {table} FOR EACH STATEMENT {_ADD}"
            )


class RowsWritten:
    """Reads the counter of a store whose counter is installed."""

    def __init__(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        self._conn = conn

    def __call__(self) -> int:
        row = self._conn.execute("SELECT n FROM effectd_test_rows_written").fetchone()
        assert row is not None, "the counter has no row"
        return int(str(row[0]))


@contextmanager
def counted(store_url: str) -> Iterator[RowsWritten]:
    """Installs the counter in the store at `store_url` (a migrated schema);
    yields its reader, on a connection of its own."""
    with psycopg.connect(store_url, autocommit=True, connect_timeout=10) as conn:
        install(conn)
        yield RowsWritten(conn)
