"""`effectd migrate` takes a filled schema-2 database (every table in
`effectd_kv`) to schema 3 in place: every row of every table reads back the
same through the store, a run that crashed half-way is finished by the next,
and neither a daemon nor the store opens the database before it finished."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from sidecar.cli import main
from sidecar.ledger import audit, retention, rules
from sidecar.ledger.checkpoints import StoredCheckpoint
from sidecar.ledger.model import Outcome, Result, State, ToolCall
from sidecar.ledger.policy import Policy
from sidecar.ledger.rules import Now
from sidecar.rpc import summaries
from sidecar.storage import records, tombstones
from sidecar.storage.api import Table, WriteView
from sidecar.storage.postgres import schema as pg_schema
from sidecar.storage.postgres.options import PostgresOptions
from sidecar.storage.postgres.store import PostgresStore
from tests.services import support
from tests.support import postgres

Dump = dict[str, list[tuple[bytes, bytes]]]


def _call(call_id: str, state: State, *, result: bool = False) -> ToolCall:
    asked = dataclasses.replace(support.spec(call_id), lease_ms=60_000)
    call = rules.prepare(None, asked, Now(1, 1, 1), Policy()).call
    return dataclasses.replace(
        call,
        state=state,
        updated_ns=10_000 + len(call_id),
        result=Result(Outcome.OK, None, "", "", "digest") if result else None,
        acknowledged=call_id.endswith("ack"),
    )


def _fact(i: int) -> audit.Fact:
    return audit.Fact(
        at_ns=i,
        actor="operator",
        action=audit.Action.POLICY_RELOAD,
        namespace="ns",
        run_id="",
        call_id="",
        revision_before=0,
        revision_after=0,
        state_before=None,
        state_after=None,
        reason=str(i),
        evidence="",
    )


def _fill(view: WriteView) -> None:
    """Calls in every state (COMMITTED with and without an acknowledged
    result: plan rows and the retention index), a tombstone, checkpoints,
    an audit chain, a pass lock and the meta rows."""
    for state in State:
        records.save_call(view, None, _call(f"c-{state.value}", state))
    for name in ("done-ack", "done-unack"):
        records.save_call(view, None, _call(name, State.COMMITTED, result=True))
    gone = _call("gone-ack", State.COMMITTED, result=True)
    records.save_call(view, None, gone)
    tombstones.compact(view, gone, retention.tombstone(gone, 50_000))
    for i in range(5):
        cp = StoredCheckpoint(f"step/{i}", b"v" * i, i + 1, 1_000 + i)
        records.save_checkpoint(view, "ns", cp)
        records.append_audit(view, _fact(i))
    view.put(Table.PASSES, b"retention", b"lock")


def _dump(store: PostgresStore) -> Dump:
    """Every table as the seam reads it."""

    def read(view: object) -> Dump:
        return {
            t.value: list(view.scan(t, b""))  # type: ignore[attr-defined]
            for t in Table
            if t is not Table.DAEMONS
        }

    return store.read(read)


def _as_schema_2(url: str, dump: Dump, usage: list[tuple[object, ...]]) -> None:
    """A schema-2 database holding `dump`, as a daemon of version 2 left
    it: the statements of versions 1 and 2, then every row in `effectd_kv`."""
    with psycopg.connect(url) as conn:
        conn.execute(pg_schema._CREATE_VERSION)
        for version in (1, 2):
            for statement in pg_schema.MIGRATIONS[version]:
                params = pg_schema._PARAMETERS if "%(" in statement else None
                conn.execute(statement, params)
        conn.execute("INSERT INTO effectd_schema (version) VALUES (2)")
        conn.execute("DELETE FROM effectd_kv")
        for tbl, rows in dump.items():
            # (the counters are rows of their own table, as in version 3)
            for k, v in rows if tbl != Table.USAGE.value else ():
                conn.execute(
                    "INSERT INTO effectd_kv (tbl, k, v) VALUES (%s, %s, %s)",
                    (tbl, k, v),
                )
        for row in usage:
            conn.execute("INSERT INTO effectd_usage VALUES (%s, %s, %s, %s, %s)", row)


@pytest.fixture
def filled(pg_url: str, pg_database: str) -> Iterator[tuple[str, Dump]]:
    """A schema-2 store URL, filled, and what each of its tables holds."""
    # Opened as a daemon opens it, with the plan rows' wire form.
    store = PostgresStore(pg_url, PostgresOptions(summarize=summaries.summarize))
    try:
        store.submit(_fill).result(30)
        dump = _dump(store)
    finally:
        store.close()
    with psycopg.connect(pg_url) as conn:
        usage = conn.execute("SELECT * FROM effectd_usage").fetchall()
    with postgres.schema(pg_database, migrate=False) as old:
        _as_schema_2(old, dump, usage)
        yield old, dump


def test_a_filled_schema_2_database_reads_the_same_after_migrate(
    filled: tuple[str, Dump], capsys: pytest.CaptureFixture[str]
) -> None:
    url, before = filled
    for table in ("calls", "tombstones", "plan_rows", "audit", "checkpoints"):
        assert before[table], table
    assert before["retention_times"]
    assert main(["migrate", "--store", url]) == 0
    assert "upgraded from schema version 2 to 3" in capsys.readouterr().out
    store = PostgresStore(url)
    try:
        assert _dump(store) == before
        keys = [key for key, _ in before["calls"]]
        loaded = store.read(lambda v: [records.load_call_at(v, k) for k in keys])
        assert None not in loaded
    finally:
        store.close()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT to_regclass('effectd_kv_2')").fetchone() == (None,)


def test_a_migration_that_crashed_is_refused_then_finished_by_the_next(
    filled: tuple[str, Dump], short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Crashed after its second chunk: a daemon refuses the store, naming
    the command; the next run copies the rest and the store reads the same."""
    url, before = filled

    def crash(copied: int) -> None:
        if copied >= 6:
            raise RuntimeError("the migration crashed")

    with psycopg.connect(url) as conn, pytest.raises(RuntimeError):
        pg_schema.migrate(conn, chunk=3, on_chunk=crash)
    argv = ["serve", "--data-dir", str(short_tmp / "d"), "--store", url]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "has not finished" in err
    assert "effectd migrate --store URL" in err
    with psycopg.connect(url) as conn:
        assert pg_schema.migrate(conn, chunk=3) == (3, 3)
    store = PostgresStore(url)
    try:
        assert _dump(store) == before
    finally:
        store.close()


def test_a_daemon_refuses_a_schema_2_database_naming_migrate(
    filled: tuple[str, Dump], short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = filled
    argv = ["serve", "--data-dir", str(short_tmp / "d"), "--store", url]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "schema version 2, older than version 3" in err
    assert "effectd migrate --store URL" in err
