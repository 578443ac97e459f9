"""The PostgreSQL store serves again as soon as its database is back, however
long the database was away.

Regression: the connection pools backed off (1, 2, 4, 8 s... up to psycopg_pool's
default of 5 minutes) while the database was away and kept that schedule
after it returned, so the next connection attempt came about as long after
the return as the outage had lasted, and every request in between answered
UNAVAILABLE (a 30 s outage: 27 s more of it). Now a pool stops trying after
`reconnect_seconds`, and the next request that needs a connection starts a
new try at once; the writer, waiting for a connection, asks again every
second, so a write that waited since before the return is not left waiting
on a pool that stopped trying.

On a private cluster (`tests.support.pg_cluster`), a schema of it per test:
the tests stop it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from sidecar.errors import StorageUnavailable
from sidecar.storage.postgres.store import PostgresOptions, PostgresStore
from tests.support import postgres
from tests.support.pg_cluster import PrivateCluster, private_cluster, schema_on

# Failed connection attempts of the write pool awaited while the database is
# away: the old backoff's fourth comes 7 s after the first and its fifth 15 s
# after it, further from the return than a request waits for a connection.
FAILED_ATTEMPTS = 4
FAILED = "error connecting in 'effectd-writes'"
GAVE_UP = "reconnection attempt in pool 'effectd-writes' failed"


class _PoolLog(logging.Handler):
    """What psycopg_pool logs, as it comes."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self.changed:
            self.messages.append(record.getMessage())
            self.changed.notify_all()

    def wait(self, prefix: str, count: int, timeout: float = 60.0) -> bool:
        """Whether `count` messages starting with `prefix` came in time."""

        def seen() -> bool:
            return sum(m.startswith(prefix) for m in self.messages) >= count

        with self.changed:
            return self.changed.wait_for(seen, timeout)


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    with private_cluster() as c:
        yield c


@pytest.fixture
def store_url(cluster: PrivateCluster) -> Iterator[str]:
    with schema_on(cluster) as url:
        yield url


@pytest.fixture
def pool_log() -> Iterator[_PoolLog]:
    logger = logging.getLogger("psycopg.pool")
    handler = _PoolLog()
    level = logger.level
    logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_first_write_after_a_long_outage_commits(
    cluster: PrivateCluster, store_url: str, pool_log: _PoolLog
) -> None:
    """The database away while a write fails and the pool tries to reconnect
    several times, then back: the next write commits, on its first try."""
    store = PostgresStore(store_url)
    try:
        assert store.submit(postgres.put_checkpoint(b"before")).result() == b"before"
        cluster.stop("immediate")
        with pytest.raises(StorageUnavailable):
            store.submit(postgres.put_checkpoint(b"away")).result()
        assert pool_log.wait(FAILED, FAILED_ATTEMPTS)
        cluster.start()
        assert store.submit(postgres.put_checkpoint(b"after")).result() == b"after"
        assert store.read(postgres.get_checkpoint(b"after")) == b"v"
        assert store.read(postgres.get_checkpoint(b"before")) == b"v"
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_write_waiting_on_a_pool_that_stopped_trying_commits(
    cluster: PrivateCluster, store_url: str, pool_log: _PoolLog
) -> None:
    """A write waiting for a connection (30 s allowed) while the database is
    away and the pool gives up reconnecting: once the database is back, it
    commits, without waiting out its 30 s."""
    store = PostgresStore(store_url, PostgresOptions(pool_timeout=30.0))
    try:
        assert store.submit(postgres.put_checkpoint(b"before")).result() == b"before"
        cluster.stop("immediate")
        waiting = store.submit(postgres.put_checkpoint(b"waiting"))
        assert pool_log.wait(GAVE_UP, 1)
        assert not waiting.done()
        cluster.start()
        assert waiting.result() == b"waiting"
        assert store.read(postgres.get_checkpoint(b"waiting")) == b"v"
    finally:
        store.close()
