"""Shared fixtures: a real daemon on a temporary Unix socket, real LMDB."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from effectd.v1 import checkpoints_pb2_grpc, ledger_pb2_grpc

from effectd_client import Client
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.testing import RunningDaemon, running_daemon


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary directory with a short path (Unix sockets allow 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="effectd-", dir="/tmp") as tmp:
        yield Path(tmp)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


# The periodic passes (settlement, compaction) sleep on the manual clock: a
# test that moves the clock would otherwise race the daemon's own pass. Tests
# of a loop set a short interval.
NO_SETTLEMENT_SECONDS = NO_COMPACTION_SECONDS = 1e9


@pytest.fixture
def config(short_tmp: Path) -> ServeConfig:
    return ServeConfig(
        data_dir=short_tmp / "data",
        settle_interval_seconds=NO_SETTLEMENT_SECONDS,
        retention_interval_seconds=NO_COMPACTION_SECONDS,
    )


@pytest.fixture
def daemon(config: ServeConfig, clock: ManualClock) -> Iterator[RunningDaemon]:
    """A daemon on the manual clock: leases expire only when the test says."""
    with running_daemon(config, clock) as running:
        yield running


@pytest.fixture(params=[True, False], ids=["session", "unary"])
def session(request: pytest.FixtureRequest) -> bool:
    """How the client sends its ledger requests: over the session stream (the
    default) or as unary calls; a test that takes it runs both ways."""
    return bool(request.param)


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
