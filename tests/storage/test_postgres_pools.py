"""The pool sizes a store URL sets (`sidecar.storage.postgres.connecting`,
`POOLS`): effectd's own parameters, removed before libpq sees the URL,
overriding the store's options; a size out of its range refused by name."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from sidecar.cli import main
from sidecar.errors import StorageUnavailable
from sidecar.storage.api import ReadView, Table, WriteView
from sidecar.storage.postgres import connecting
from sidecar.storage.postgres.store import PostgresOptions, PostgresStore
from sidecar.storage.postgres.views import PgReadView, StoreConnection


def _with(url: str, query: str) -> str:
    return url + ("&" if "?" in url else "?") + query


def test_pool_sizes_are_read_and_removed_from_the_url() -> None:
    target = connecting.parse(
        "postgresql://u@h/db?writers=2&connect_timeout=3&readers=8&max_batch=16"
        "&readers=6"
    )
    assert target.conninfo == "postgresql://u@h/db?connect_timeout=3"
    assert (target.writers, target.readers, target.max_batch) == (2, 6, 16)


@pytest.mark.parametrize(
    "query",
    ["writers=0", "writers=17", "readers=", "readers=-1", "max_batch=1e3", "writers=٣"],
)
def test_a_pool_size_out_of_its_range_is_refused_by_name(query: str) -> None:
    name = query.partition("=")[0]
    with pytest.raises(connecting.PoolerError, match=name):
        connecting.parse(_with("postgresql://h/db", query))


def _put(key: bytes, view: WriteView) -> None:
    view.put(Table.META, key, b"v")


def _count(view: ReadView) -> int:
    return len(list(view.scan(Table.META, b"pool-")))


def test_a_store_runs_the_writers_its_url_asks_for(pg_url: str) -> None:
    """The URL's sizes override the options given in code; the store
    serves with them."""
    store = PostgresStore(
        _with(pg_url, "writers=3&readers=2&max_batch=4"),
        PostgresOptions(writers=1, readers=4, max_batch=64),
    )
    try:
        assert (store.options.writers, store.options.readers) == (3, 2)
        assert store.options.max_batch == 4
        assert len(store._writers) == 3
        futures = [
            store.submit(functools.partial(_put, b"pool-%d" % n)) for n in range(20)
        ]
        for future in futures:
            future.result(timeout=30)
        assert store.read(_count) == 20
        assert store.stats.largest_batch <= 4
    finally:
        store.close()


def test_the_daemon_refuses_a_url_with_a_bad_pool_size(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate", "--store", _with(pg_url, "writers=100")]) == 2
    assert "writers='100'" in capsys.readouterr().err


def _pg(view: ReadView) -> PgReadView:
    assert isinstance(view, PgReadView)
    return view


def test_a_connections_statements_share_one_cursor(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Point reads, each a statement outside a transaction, make no cursor
    after their connection's first, and one that failed leaves the cursor
    good for the next (`views.StoreConnection`)."""
    made: list[object] = []
    cursor = StoreConnection.cursor

    def counted(conn: StoreConnection, *args: Any, **kwargs: Any) -> Any:
        made.append(conn)
        return cursor(conn, *args, **kwargs)

    monkeypatch.setattr(StoreConnection, "cursor", counted)
    store = PostgresStore(pg_url, PostgresOptions(writers=1, readers=1))
    try:
        store.submit(functools.partial(_put, b"pool-k")).result()
        made.clear()

        def point(view: ReadView) -> bytes | None:
            return view.get(Table.META, b"pool-k")

        assert [store.read_point(point) for _ in range(5)] == [b"v"] * 5
        with pytest.raises(StorageUnavailable, match="division by zero"):
            store.read_point(lambda view: _pg(view).rows("SELECT 1 / 0", ()))
        assert store.read_point(point) == b"v"
        assert len(made) <= 1
    finally:
        store.close()
