"""`bench/pg_cost.py`'s probe of a database's WAL: a phase that wrote none
(every call a read) counts nothing, rather than failing the benchmark
(pg_walinspect refuses a range that starts where it ends)."""

from __future__ import annotations

import urllib.parse

import psycopg
from pg_cost import Probe


def test_a_phase_that_wrote_no_wal_counts_nothing(pg_database: str) -> None:
    name = urllib.parse.urlsplit(pg_database).path.lstrip("/")
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        probe = Probe(conn, name, conn)
        mark = probe.mark()
        assert probe.wal(mark["lsn"], mark["lsn"]) == (0, 0)
