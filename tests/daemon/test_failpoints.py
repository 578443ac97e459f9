"""The failpoints of a test build (`sidecar.failpoints`): how an entry is
read and counted, and that the shipped program refuses to start while
`EFFECTD_FAILPOINTS` is set. What a crash at each point leaves is
`tests/torture/test_failpoints.py`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar import cli, failpoints
from sidecar.failpoints import FailpointError, Failpoints, Point
from sidecar.seams import Seams
from sidecar.storage.api import Table, WriteView
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore
from sidecar.storage.postgres.store import PostgresOptions, PostgresStore
from tests.support import failpoint_daemon


class Fired(Exception):
    """Raised by the test's crash in place of exiting."""


def _crash(where: str) -> None:
    raise Fired(where)


def test_an_entry_fires_at_its_count_and_only_once() -> None:
    armed = Failpoints("lmdb.before_commit:3", crash=_crash)
    armed.reached(Point.LMDB_BEFORE_COMMIT, [])
    armed.reached(Point.LMDB_AFTER_COMMIT, [])  # another point: not counted
    armed.reached(Point.LMDB_BEFORE_COMMIT, [])
    with pytest.raises(Fired, match=r"^lmdb\.before_commit@\*$"):
        armed.reached(Point.LMDB_BEFORE_COMMIT, [])
    armed.reached(Point.LMDB_BEFORE_COMMIT, [])  # spent


def test_a_method_scope_counts_only_batches_holding_a_write_of_that_rpc() -> None:
    scope = {"now": ""}
    armed = Failpoints("pg.after_commit@CommitTool", lambda: scope["now"], crash=_crash)
    unscoped = armed.tag(lambda view: None)
    scope["now"] = "/effectd.v1.ToolLedger/StartTool"
    start = armed.tag(lambda view: None)
    scope["now"] = "/effectd.v1.ToolLedger/CommitTool"
    commit = armed.tag(lambda view: None)
    assert commit(None) is None  # a tagged function is the function
    armed.reached(Point.PG_AFTER_COMMIT, [unscoped, start])
    with pytest.raises(Fired, match="CommitTool"):
        armed.reached(Point.PG_AFTER_COMMIT, [start, commit])


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("", "names no failpoint"),
        (" , ", "names no failpoint"),
        ("lmdb.before_fsync", "unknown failpoint 'lmdb.before_fsync'"),
        ("lmdb.after_commit:0", "the count must be a number >= 1"),
        ("lmdb.after_commit:x", "the count must be a number >= 1"),
    ],
)
def test_an_entry_that_does_not_parse_is_refused(spec: str, says: str) -> None:
    with pytest.raises(FailpointError, match=says):
        Failpoints(spec)


def test_every_point_of_both_stores_is_named() -> None:
    names = {p.value for p in Point}
    for store in ("lmdb", "pg"):
        for where in ("before_apply", "mid_batch", "before_commit", "after_commit"):
            assert f"{store}.{where}" in names


def test_production_seams_arm_no_failpoint() -> None:
    assert Seams().failpoints is None


def test_the_shipped_program_refuses_to_start_with_failpoints_set(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Production mode: `effectd serve` with EFFECTD_FAILPOINTS set exits 2
    with a clear error before it opens anything."""
    monkeypatch.setenv(failpoints.ENV, "lmdb.after_commit")
    data = short_tmp / "data"
    assert cli.main(["serve", "--data-dir", str(data)]) == 2
    err = capsys.readouterr().err
    assert "EFFECTD_FAILPOINTS is set" in err
    assert "only a test build arms them" in err
    assert not data.exists()


def test_a_test_build_refuses_failpoints_it_cannot_read(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(failpoints.ENV, "lmdb.nowhere")
    data = short_tmp / "data"
    assert failpoint_daemon.main(["serve", "--data-dir", str(data)]) == 2
    assert "unknown failpoint 'lmdb.nowhere'" in capsys.readouterr().err


NOWHERE = ",".join(f"{p.value}@Nothing" for p in Point)


def _never(where: str) -> None:
    raise AssertionError(f"{where} fired for a write of another RPC")


def test_failpoints_of_another_rpc_leave_lmdb_writes_alone(short_tmp: Path) -> None:
    """Armed for an RPC that never writes, every point is passed through by
    both ways of writing (the writer thread, the event loop), batches of
    several requests included."""
    armed = Failpoints(NOWHERE, lambda: "/effectd.v1.ToolLedger/CommitTool", _never)
    store = LmdbStore(short_tmp / "data", LmdbOptions(failpoints=armed))
    try:
        submitted = [store.submit(_put(i)) for i in range(3)]
        assert [f.result(30) for f in submitted] == [0, 1, 2]

        async def on_the_loop() -> list[int]:
            return list(await asyncio.gather(*(store.write(_put(i)) for i in range(3))))

        assert asyncio.run(on_the_loop()) == [0, 1, 2]
    finally:
        store.close()


def test_failpoints_of_another_rpc_leave_postgres_writes_alone(pg_url: str) -> None:
    armed = Failpoints(NOWHERE, lambda: "/effectd.v1.ToolLedger/CommitTool", _never)
    store = PostgresStore(pg_url, PostgresOptions(failpoints=armed))
    try:
        submitted = [store.submit(_put(i)) for i in range(3)]
        assert [f.result(30) for f in submitted] == [0, 1, 2]
    finally:
        store.close()


def _put(i: int) -> Callable[[WriteView], int]:
    def put(view: WriteView) -> int:
        view.put(Table.META, f"fp-{i}".encode(), b"x")
        return i

    return put
