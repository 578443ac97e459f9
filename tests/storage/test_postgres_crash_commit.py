"""A COMMIT lost in a crash of the database server, on a private cluster
(`tests.support.pg_cluster`).

A server that crashes gives again, once recovered, every transaction id
whose records had not reached its WAL: the id of the transaction whose
COMMIT was lost then names a newer transaction, and `pg_xact_status` says
'committed' of that one. The store must not take it for its own: a write is
acknowledged only if it is stored (regression: a write whose COMMIT was
lost in the crash was answered as committed, and nothing of it was stored;
under load, a tool call's start answered so ran its side effect twice).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from sidecar.errors import StorageUnavailable
from sidecar.failpoints import Failpoints, Point
from sidecar.storage.postgres.store import (
    MAY_HAVE_BEEN_APPLIED,
    PostgresOptions,
    PostgresStore,
)
from tests.support import postgres
from tests.support.pg_cluster import PrivateCluster, private_cluster, schema_on

pytestmark = pytest.mark.slow

# Transactions committed after the crash, each taking a new id: more than the
# ids the crash let go, so the lost transaction's is given again.
TAKEN = 20


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    with private_cluster() as c:
        # The WAL writer flushes on its own only every 10 s: the lost
        # transaction's records are still in memory when the server crashes
        # (nothing else writes meanwhile), as under load they often are.
        with c.connect() as conn:
            conn.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
            conn.execute("SELECT pg_reload_conf()")
        yield c


@pytest.fixture
def store_url(cluster: PrivateCluster) -> Iterator[str]:
    with schema_on(cluster) as url:
        yield url


@dataclass
class Lost:
    """What became of a write whose COMMIT a crash took."""

    acknowledged: bool
    stored: bytes | None
    resolved: int
    unknown: int


def _write_through_a_crash(cluster: PrivateCluster, url: str, taken: int) -> Lost:
    """One write, at whose COMMIT the server crashes (immediate stop) and
    starts again, and `taken` transactions commit on it, each with a new id,
    before the store learns its COMMIT was lost; then a new write, which
    must commit (the store serves on)."""
    crashed = threading.Event()

    def crash(_where: str) -> None:
        cluster.stop("immediate")
        cluster.start()
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(taken):
                conn.execute("SELECT pg_current_xact_id()")
        crashed.set()

    # Only the write submitted in the scope of "/Lost" reaches the failpoint
    # (the store's own writes at its start do not).
    scope = [""]
    armed = Failpoints(
        f"{Point.PG_BEFORE_COMMIT.value}@Lost", scope=lambda: scope[0], crash=crash
    )
    store = PostgresStore(url, PostgresOptions(writers=1, readers=1, failpoints=armed))
    try:
        scope[0] = "/Lost"
        lost = store.submit(postgres.put_checkpoint(b"lost"))
        scope[0] = ""
        refusal: dict[str, str] | None = None
        try:
            acknowledged = lost.result(60) == b"lost"
        except StorageUnavailable as refused:
            refusal, acknowledged = refused.metadata, False
        # Refused: only as a write that may have been applied.
        assert refusal in (None, {MAY_HAVE_BEEN_APPLIED: "true"})
        assert crashed.is_set()
        assert store.submit(postgres.put_checkpoint(b"after")).result(60) == b"after"
        return Lost(
            acknowledged,
            store.read(postgres.get_checkpoint(b"lost")),
            store.stats.commits_resolved,
            store.stats.commits_unknown,
        )
    finally:
        store.close()


@pytest.mark.timeout(120)
def test_a_commit_lost_in_a_crash_is_not_taken_for_a_newer_transaction(
    cluster: PrivateCluster, store_url: str
) -> None:
    """Transactions commit on the recovered server before the store asks
    what became of its own, one of them with its id: the write is answered
    UNAVAILABLE with mayHaveBeenApplied, never acknowledged (fails before:
    it was acknowledged, and nothing was stored)."""
    lost = _write_through_a_crash(cluster, store_url, TAKEN)
    assert (lost.resolved, lost.unknown) == (0, 1)
    assert not lost.acknowledged
    assert lost.stored is None


@pytest.mark.timeout(120)
def test_a_commit_lost_in_a_crash_whose_id_is_not_given_again_yet_runs_again(
    cluster: PrivateCluster, store_url: str
) -> None:
    """The store asks before the recovered server gave the lost
    transaction's id again ("in the future"): no recovery replayed its
    commit, so it did not commit; the write runs again and is acknowledged,
    stored once (fails before: answered "may have been applied")."""
    lost = _write_through_a_crash(cluster, store_url, 0)
    assert (lost.resolved, lost.unknown) == (1, 0)
    assert lost.acknowledged
    assert lost.stored == b"v"
