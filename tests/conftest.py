"""Shared fixtures: a real daemon on a temporary Unix socket, real LMDB, or
the shared PostgreSQL store: `store_kind` says which (LMDB unless
EFFECTD_TEST_STORE=postgres; a module that overrides it with both runs its
tests on each; "pgbouncer" is the PostgreSQL store reached through a
PgBouncer in transaction mode)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from effectd.v1 import checkpoints_pb2_grpc, ledger_pb2_grpc

from effectd_client import Client
from effectd_client._frames_wire import TRANSPORT_ENV
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.testing import RunningDaemon, running_daemon
from tests.support import pgbouncer, postgres, slow


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary directory with a short path (Unix sockets allow 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="effectd-", dir="/tmp") as tmp:
        yield Path(tmp)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


# The periodic passes (the lease sweep, compaction) sleep on the manual clock: a
# test that moves the clock would otherwise race the daemon's own pass. Tests
# of a loop set a short interval.
NO_SWEEP_SECONDS = NO_COMPACTION_SECONDS = 1e9


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A database of this test process, dropped at its end."""
    with postgres.database() as url:
        yield url


@pytest.fixture
def pg_url(pg_database: str) -> Iterator[str]:
    """The URL of a new, migrated store of its own (a schema)."""
    with postgres.schema(pg_database) as url:
        yield url


@pytest.fixture(scope="session")
def pg_bouncer() -> Iterator[pgbouncer.Bouncer]:
    """A PgBouncer in transaction mode in front of the tests' server, for
    this test process (`tests.support.pgbouncer`)."""
    with pgbouncer.bouncer(*pgbouncer.server_of(postgres.SERVER_URL)) as running:
        yield running


@pytest.fixture(params=postgres.PATHS)
def pg_path(request: pytest.FixtureRequest) -> str:
    """How a test reaches its store: "direct", or "pgbouncer" (transaction
    pooling); a test that takes it runs both ways."""
    return str(request.param)


@pytest.fixture
def pg_url_via(pg_url: str, pg_path: str, request: pytest.FixtureRequest) -> str:
    """`pg_url`, reached the way `pg_path` says."""
    if pg_path == "pgbouncer":
        return pgbouncer.through(pg_url, request.getfixturevalue("pg_bouncer"))
    return pg_url


@pytest.fixture
def store_kind() -> str:
    """The store the `config` fixture's daemon serves: "lmdb" or "postgres"."""
    return postgres.DEFAULT_STORE


@pytest.fixture
def store_url(store_kind: str, request: pytest.FixtureRequest) -> str | None:
    """`--store` of the `config` fixture: None for LMDB."""
    if store_kind == "postgres":
        return str(request.getfixturevalue("pg_url"))
    if store_kind == "pgbouncer":
        url = str(request.getfixturevalue("pg_url"))
        return pgbouncer.through(url, request.getfixturevalue("pg_bouncer"))
    return None


@pytest.fixture
def config(short_tmp: Path, store_url: str | None) -> ServeConfig:
    return ServeConfig(
        data_dir=short_tmp / "data",
        init=True,
        store=store_url,
        settle_interval_seconds=NO_SWEEP_SECONDS,
        retention_interval_seconds=NO_COMPACTION_SECONDS,
    )


@pytest.fixture
def daemon(config: ServeConfig, clock: ManualClock) -> Iterator[RunningDaemon]:
    """A daemon on the manual clock: leases expire only when the test says."""
    with running_daemon(config, clock) as running:
        yield running


@pytest.fixture(params=["session", "stream", "unary"])
def session(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """How the client sends its ledger requests, the value of its `session`
    option: as messages of a session (True), on the framed transport where
    the daemon serves it on this host (the default, "session") or on the
    gRPC session stream ("stream": `EFFECTD_TRANSPORT=grpc`), or as unary
    calls (False); a test that takes it runs all three ways."""
    if request.param == "stream":
        monkeypatch.setenv(TRANSPORT_ENV, "grpc")
    return bool(request.param != "unary")


@pytest.fixture
def client(daemon: RunningDaemon, session: bool) -> Iterator[Client]:
    with Client(daemon.target, session=session) as c:
        yield c


@pytest.fixture
def channel(daemon: RunningDaemon) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(daemon.target) as ch:
        yield ch


@pytest.fixture
def ledger_stub(channel: grpc.Channel) -> ledger_pb2_grpc.ToolLedgerStub:
    return ledger_pb2_grpc.ToolLedgerStub(channel)


@pytest.fixture
def checkpoints_stub(channel: grpc.Channel) -> checkpoints_pb2_grpc.CheckpointsStub:
    return checkpoints_pb2_grpc.CheckpointsStub(channel)


def pytest_report_header() -> str:
    return f"effectd tests, pid {os.getpid()}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks `slow` what `tests.support.slow` names, before `-m` selects."""
    slow.mark(items)
