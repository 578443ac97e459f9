"""The PostgreSQL store through PgBouncer in transaction mode
(`sidecar.storage.postgres.connecting`): the store URL's `pooler` read, the
store refusing to start behind a pooler it was not told of (naming the
parameter), and the negative control of the parameter: the same store with
psycopg's server-side prepared statements on, through the same PgBouncer,
fails. The contract, race, crash and restart suites run through PgBouncer
too (`pg_path`, `store_kind` "pgbouncer")."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import psycopg
import pytest

from sidecar.storage.api import ReadView, Table, WriteView
from sidecar.storage.postgres import connecting
from sidecar.storage.postgres.store import PostgresOptions, PostgresStore
from sidecar.storage.postgres.views import DatabaseFailed
from tests.support import pgbouncer
from tests.support.tcp_proxy import commit_cutter

OPTIONS = PostgresOptions(readers=2)
WRITES = 40


@pytest.mark.parametrize(
    ("url", "conninfo", "pooler", "settings", "prepare"),
    [
        (
            "postgresql://h:5/db",
            "postgresql://h:5/db",
            "none",
            (),
            connecting.PREPARE_THRESHOLD,
        ),
        (
            "postgresql://h:5/db?pooler=session&options=-csearch_path%3Ds",
            "postgresql://h:5/db?options=-csearch_path%3Ds",
            "session",
            (),
            connecting.PREPARE_THRESHOLD,
        ),
        (
            "postgresql://h:5/db?pooler=transaction&connect_timeout=3",
            "postgresql://h:5/db?connect_timeout=3",
            "transaction",
            (),
            None,
        ),
        (
            "postgresql://u@h/db?options=-c%20search_path%3Ds%20--lock-timeout%3D2s"
            "&pooler=transaction",
            "postgresql://u@h/db",
            "transaction",
            (("search_path", "s"), ("lock_timeout", "2s")),
            None,
        ),
    ],
)
def test_a_store_url_says_how_the_database_is_reached(
    url: str,
    conninfo: str,
    pooler: str,
    settings: tuple[connecting.Setting, ...],
    prepare: int | None,
) -> None:
    """`pooler` is removed; behind a transaction pooler the URL's options
    become per-transaction settings and prepares are off."""
    target = connecting.parse(url)
    assert (target.conninfo, target.pooler, target.settings) == (
        conninfo,
        pooler,
        settings,
    )
    assert target.prepare_threshold == prepare


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://h/db?pooler=statement",
        "postgresql://h/db?pooler=transaction&options=-Ddata",
    ],
)
def test_a_store_url_the_store_cannot_follow_is_refused(url: str) -> None:
    with pytest.raises(connecting.PoolerError):
        connecting.parse(url)


def test_behind_pgbouncer_without_the_parameter_the_store_refuses_to_start(
    pg_database: str, pg_bouncer: pgbouncer.Bouncer
) -> None:
    """A store told nothing of the pooler would prepare statements and make
    settings a transaction pooler hands to other clients: it refuses, naming
    `pooler=transaction`."""
    url = pgbouncer.through(pg_database, pg_bouncer, pooler="")
    with pytest.raises(connecting.PoolerError, match="pooler=transaction"):
        PostgresStore(url, OPTIONS)


def test_direct_with_the_default_the_store_starts(pg_url: str) -> None:
    """The control of the refusal: reached directly, the same check passes."""
    PostgresStore(pg_url, OPTIONS).close()


class _Preparing(PostgresStore):
    """The negative control: `pooler=transaction` with psycopg's server-side
    prepared statements on (every statement prepared at once)."""

    def _pool(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        self._target = dataclasses.replace(self._target, prepare_threshold=0)
        return super()._pool(*args, **kwargs)  # type: ignore[arg-type]


def _get(view: ReadView, key: bytes) -> bytes | None:
    return view.get(Table.CHECKPOINTS, key)


def _writes(open_store: Callable[[], PostgresStore]) -> list[str]:
    """Two stores on one ledger alternate WRITES writes and reads; the
    failures seen."""
    failures: list[str] = []
    stores: list[PostgresStore] = []
    try:
        for _ in range(2):
            stores.append(open_store())
        for i in range(WRITES):
            store = stores[i % 2]
            key = b"ns\x00%d" % i

            def put(view: WriteView, key: bytes = key) -> None:
                view.put(Table.CHECKPOINTS, key, b"x")

            try:
                store.submit(put).result(30)
                assert store.read(functools.partial(_get, key=key)) == b"x"
            except (Exception, DatabaseFailed) as exc:  # what the check counts
                failures.append(repr(exc))
    except (Exception, DatabaseFailed) as exc:  # refused at open
        failures.append(repr(exc))
    finally:
        for store in stores:
            store.close()
    return failures


def test_through_pgbouncer_the_store_serves_two_stores_alternating(
    pg_url: str, pg_bouncer: pgbouncer.Bouncer
) -> None:
    url = pgbouncer.through(pg_url, pg_bouncer)
    assert _writes(lambda: PostgresStore(url, OPTIONS)) == []


def test_negative_control_prepared_statements_through_pgbouncer_fail(
    pg_url: str, pg_bouncer: pgbouncer.Bouncer
) -> None:
    """The same writes, with prepares on: PgBouncer hands a prepared
    statement's name to a server connection that has another, or none."""
    url = pgbouncer.through(pg_url, pg_bouncer)
    failures = _writes(lambda: _Preparing(url, OPTIONS))
    print("\n".join(failures[:3]))
    assert any("prepared statement" in failure for failure in failures)


def test_per_transaction_settings_hold_through_pgbouncer(
    pg_url: str, pg_bouncer: pgbouncer.Bouncer
) -> None:
    """The URL's search_path and the store's statement timeout are in force
    in each transaction, and nothing is left on the server connection."""
    url = pgbouncer.through(pg_url, pg_bouncer)
    target = connecting.parse(url)
    with psycopg.connect(target.conninfo, prepare_threshold=None) as conn:
        connecting.begin(conn, [*target.settings, ("statement_timeout", "1234ms")])
        row = conn.execute(
            "SELECT current_setting('search_path'), "
            "current_setting('statement_timeout')"
        ).fetchone()
        conn.rollback()
        after = conn.execute("SELECT current_setting('statement_timeout')").fetchone()
        conn.rollback()
    assert row is not None
    assert after is not None
    assert row == (dict(target.settings)["search_path"], "1234ms")
    assert after[0] != "1234ms"


def test_a_lost_commit_through_pgbouncer_is_resolved_not_answered_as_failed(
    pg_url: str,
) -> None:
    """The server connection PgBouncer sent a COMMIT on is cut before its
    answer: PgBouncer ends the client's connection with an error of its own
    (SQLSTATE 08P01, "server conn crashed?"). The store must take it as a
    lost connection and learn from `pg_xact_status` that the transaction
    committed (fails before: answered as failed with mayHaveBeenApplied
    false, though it committed)."""
    with commit_cutter(pg_url) as (proxy, cut_url):
        host, port = pgbouncer.server_of(cut_url)
        with pgbouncer.bouncer(host, port) as bouncer:
            url = pgbouncer.through(cut_url, bouncer)
            store = PostgresStore(url, PostgresOptions(writers=1, readers=1))
            try:
                proxy.arm()

                def put(view: WriteView) -> bytes:
                    view.put(Table.CHECKPOINTS, b"ns\x00k", b"once")
                    return b"k"

                assert store.submit(put).result(30) == b"k"
                assert proxy.cuts == 1
                assert store.stats.commits_resolved == 1
                assert store.stats.retries == 0
            finally:
                store.close()
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT k, v FROM effectd_checkpoints").fetchall()
    assert rows == [(b"ns\x00k", b"once")]
