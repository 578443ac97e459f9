"""The PostgreSQL store under faults: a connection killed mid-transaction
(`pg_terminate_backend`), every connection killed (as a restart does), a
statement timeout, the read pool exhausted, and a COMMIT whose answer is
lost. Nothing is acknowledged that did not commit; a request that did not
commit answers `StorageUnavailable` saying whether it may have been applied;
the store reconnects and serves on."""

from __future__ import annotations

import dataclasses
import secrets
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from sidecar.errors import StorageUnavailable
from sidecar.storage.api import ReadView, Table, WriteView
from sidecar.storage.postgres.store import (
    MAY_HAVE_BEEN_APPLIED,
    PostgresOptions,
    PostgresStore,
)
from tests.support import postgres
from tests.support.tcp_proxy import commit_cutter


def _options(**changes: Any) -> PostgresOptions:
    name = f"effectd-fault-{secrets.token_hex(4)}"
    base = PostgresOptions(writers=1, readers=1, application_name=name)
    return dataclasses.replace(base, **changes)


@pytest.fixture
def opened(pg_url: str) -> Iterator[Callable[[PostgresOptions], PostgresStore]]:
    stores: list[PostgresStore] = []

    def open_store(options: PostgresOptions) -> PostgresStore:
        stores.append(PostgresStore(pg_url, options))
        return stores[-1]

    yield open_store
    for s in stores:
        s.close()


def _put(key: bytes, value: bytes = b"v") -> Callable[[WriteView], bytes]:
    def fn(view: WriteView) -> bytes:
        view.put(Table.CHECKPOINTS, b"ns\x00" + key, value)
        return key

    return fn


def _get(key: bytes) -> Callable[[ReadView], bytes | None]:
    return lambda view: view.get(Table.CHECKPOINTS, b"ns\x00" + key)


def _rows(url: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT k, v FROM effectd_checkpoints").fetchall()


def test_a_connection_killed_mid_transaction_is_retried_once_committed(
    opened: Callable[[PostgresOptions], PostgresStore], pg_url: str, pg_database: str
) -> None:
    """The writer's backend is terminated between the function's read and
    its writes: nothing of that transaction commits, the function runs again
    on a new connection, and the answer is that of the one commit (fails
    before: the lost connection answered the request as failed, or as done
    without a commit)."""
    options = _options()
    store = opened(options)
    reached, go = threading.Event(), threading.Event()
    runs = []

    def fn(view: WriteView) -> int:
        runs.append(view.get(Table.CHECKPOINTS, b"ns\x00k"))
        reached.set()
        go.wait(10)
        view.put(Table.CHECKPOINTS, b"ns\x00k", b"%d" % len(runs))
        return len(runs)

    future = store.submit(fn)
    assert reached.wait(10)
    assert postgres.terminate(options.application_name, pg_database) >= 1
    go.set()
    assert future.result(30) == 2
    assert runs == [None, None]
    assert store.stats.retries == 1
    assert _rows(pg_url) == [(b"ns\x00k", b"2")]
    assert store.read(_get(b"k")) == b"2"


def test_every_connection_killed_as_by_a_restart_the_store_reconnects(
    opened: Callable[[PostgresOptions], PostgresStore], pg_database: str
) -> None:
    """After every connection of the daemon is terminated (what a database
    restart does to it), the next read and the next write succeed."""
    options = _options(readers=2, writers=2)
    store = opened(options)
    store.submit(_put(b"before")).result(10)
    assert store.read(_get(b"before")) == b"v"
    assert postgres.terminate(options.application_name, pg_database) >= 2
    assert store.read(_get(b"before")) == b"v"
    assert store.submit(_put(b"after")).result(30) == b"after"
    assert store.read(_get(b"after")) == b"v"


def test_a_read_after_every_pooled_connection_broke_is_answered(
    opened: Callable[[PostgresOptions], PostgresStore], pg_database: str
) -> None:
    """A restart breaks every connection the read pool holds (here four):
    the first read that meets one checks the pool and reads on a new
    connection (fails before: the second try met another broken one and
    answered UNAVAILABLE though the database was back)."""
    options = _options(readers=4)
    store = opened(options)
    together = threading.Barrier(4)

    def held(view: ReadView) -> bytes | None:
        together.wait(10)  # four reads at once: the pool grows to four
        return view.get(Table.CHECKPOINTS, b"ns\x00k")

    readers = [threading.Thread(target=store.read, args=(held,)) for _ in range(4)]
    for t in readers:
        t.start()
    for t in readers:
        t.join(30)
    assert postgres.terminate(options.application_name + "/reads", pg_database) == 4
    assert store.read(_get(b"k")) is None
    assert store.read(_get(b"k")) is None


def test_a_statement_timeout_answers_unavailable_and_applies_nothing(
    opened: Callable[[PostgresOptions], PostgresStore], pg_url: str
) -> None:
    """A write stuck behind a lock past the statement timeout fails
    UNAVAILABLE, not applied (mayHaveBeenApplied=false); the store serves
    the next write once the lock is gone."""
    # Long enough that opening the store (its schema check) never hits it on
    # a loaded machine; the locked write waits it out.
    store = opened(_options(statement_timeout=3.0))
    with psycopg.connect(pg_url) as blocker:
        blocker.execute("LOCK TABLE effectd_checkpoints IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(StorageUnavailable) as raised:
            store.submit(_put(b"stuck")).result(30)
        blocker.rollback()
    assert raised.value.metadata == {MAY_HAVE_BEEN_APPLIED: "false"}
    assert "timed out" in raised.value.message
    assert _rows(pg_url) == []
    assert store.submit(_put(b"next")).result(30) == b"next"


@pytest.mark.serial
def test_the_read_pool_exhausted_answers_unavailable(
    opened: Callable[[PostgresOptions], PostgresStore],
) -> None:
    """With the one read connection held by a long read, another read waits
    the pool timeout, then fails UNAVAILABLE; the held read still finishes."""
    store = opened(_options(readers=1, pool_timeout=0.3))
    holding, release = threading.Event(), threading.Event()

    def long_read(view: ReadView) -> bytes | None:
        holding.set()
        release.wait(10)
        return view.get(Table.META, b"nothing")

    result: list[bytes | None] = []
    reader = threading.Thread(target=lambda: result.append(store.read(long_read)))
    reader.start()
    try:
        assert holding.wait(10)
        with pytest.raises(StorageUnavailable) as raised:
            store.read(_get(b"k"))
        assert raised.value.metadata == {MAY_HAVE_BEEN_APPLIED: "false"}
    finally:
        release.set()
        reader.join(10)
    assert result == [None]


def test_a_lost_commit_that_committed_is_acknowledged(
    pg_url: str,
) -> None:
    """The COMMIT's answer is lost with its connection after the server
    committed: the store learns from `pg_xact_status` that it committed and
    answers it, once (fails before: answered as failed, or run again)."""
    with commit_cutter(pg_url) as (proxy, url):
        store = PostgresStore(url, _options())
        try:
            proxy.arm()
            assert store.submit(_put(b"k", b"once")).result(30) == b"k"
            assert proxy.cuts == 1
            assert store.stats.commits_resolved == 1
            assert store.stats.retries == 0
        finally:
            store.close()
    assert _rows(pg_url) == [(b"ns\x00k", b"once")]


def test_a_lost_commit_is_resolved_on_a_read_pool_broken_with_it(
    pg_url: str, pg_database: str
) -> None:
    """As a restart does, the COMMIT's answer is lost and the read pool's
    connections break with it, the database back at once: the store asks
    on a new connection, learns it committed and answers it (fails before:
    the question was asked on a broken connection and the answer was
    "may have been applied")."""
    with commit_cutter(pg_url) as (proxy, url):
        store = PostgresStore(url, _options())
        try:
            reads = store.options.application_name + "/reads"
            proxy.on_cut = lambda: postgres.terminate(reads, pg_database)
            proxy.arm()
            assert store.submit(_put(b"k", b"once")).result(30) == b"k"
            assert (proxy.cuts, store.stats.commits_resolved) == (1, 1)
            assert store.stats.retries == 0
        finally:
            store.close()
    assert _rows(pg_url) == [(b"ns\x00k", b"once")]


def test_a_lost_commit_whose_outcome_is_unknown_may_have_been_applied(
    pg_url: str, pg_database: str
) -> None:
    """The COMMIT's answer is lost and the database cannot be reached to
    ask: UNAVAILABLE with mayHaveBeenApplied=true, never an acknowledgement
    and never a second run (the commit did happen: the negative control of
    answering it "not applied")."""
    with commit_cutter(pg_url) as (proxy, url):
        store = PostgresStore(url, _options(pool_timeout=0.5))
        try:
            # As the COMMIT's answer is lost, the database becomes
            # unreachable: the question asked after it fails.
            reads = store.options.application_name + "/reads"

            def unreachable() -> None:
                proxy.refusing = True
                postgres.terminate(reads, pg_database)

            proxy.on_cut = unreachable
            proxy.arm()
            with pytest.raises(StorageUnavailable) as raised:
                store.submit(_put(b"k", b"maybe")).result(30)
            assert raised.value.metadata == {MAY_HAVE_BEEN_APPLIED: "true"}
            assert store.stats.commits_unknown == 1
        finally:
            store.close()
    assert _rows(pg_url) == [(b"ns\x00k", b"maybe")]
