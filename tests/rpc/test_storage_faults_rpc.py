"""A daemon on the shared store whose database fails under a request: the
RPC answers UNAVAILABLE / STORAGE_UNAVAILABLE with ErrorInfo metadata
`mayHaveBeenApplied` saying whether the request may have been applied, and
the daemon serves the next request once the database is back.

The answer lost is that of the statement that commits the call: a save
alone in its writer's batch is one statement committed on its own
(`storage.postgres.call_saves`), whose document names the call."""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from effectd.v1 import admin_pb2
from effectd.v1 import ledger_pb2 as pb
from effectd.v1.admin_pb2_grpc import AdminStub
from effectd.v1.ledger_pb2_grpc import ToolLedgerStub

from effectd_client import Client, EffectdError
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.rpc.summaries import summarize
from sidecar.seams import Seams
from sidecar.server import Daemon
from sidecar.storage.api import Store
from sidecar.storage.postgres.store import PostgresOptions, PostgresStore
from sidecar.testing import RunningDaemon, running_daemon
from tests.rpc.support import decode, expect_refusal, prepare_request
from tests.support import postgres
from tests.support.tcp_proxy import CommitCutter, commit_cutter

# Seconds a request waits for a pool connection: the database made
# unreachable here refuses every new one, which a daemon's default (5 s)
# waits out in each test before it answers, and once more as it stops.
POOL_WAIT = 0.5
T = TypeVar("T")


class ShortPoolWait(Daemon):
    """The daemon with its store's pool wait POOL_WAIT."""

    def open_store(self) -> Store:
        assert self.config.store is not None
        options = PostgresOptions(
            pool_timeout=POOL_WAIT,
            on_commit=self.metrics.commit_observed,
            summarize=summarize,
        )
        return PostgresStore(self.config.store, options)


@pytest.fixture
def through_proxy(
    config: ServeConfig, pg_url: str, clock: ManualClock
) -> Iterator[tuple[RunningDaemon, CommitCutter]]:
    with commit_cutter(pg_url) as (proxy, url):
        shared = dataclasses.replace(config, store=url)
        daemon = ShortPoolWait(shared, Seams(clock=clock))
        with running_daemon(shared, daemon=daemon) as running:
            yield running, proxy


def _saving(call_id: str) -> bytes:
    """What only the statement that saves the call sends: its document's
    identity, ending with the call's id."""
    return f'"{call_id}"]'.encode()


def test_a_lost_commit_answers_unavailable_may_have_been_applied(
    through_proxy: tuple[RunningDaemon, CommitCutter], pg_database: str
) -> None:
    """Prepare-and-start whose COMMIT's answer is lost while the database
    becomes unreachable: UNAVAILABLE, mayHaveBeenApplied=true, never
    EXECUTE. Back, a repeat is IN_PROGRESS: it had committed, and its
    attempt is not given a second time."""
    daemon, proxy = through_proxy

    def unreachable() -> None:
        proxy.refusing = True
        postgres.terminate("effectd/reads", pg_database)

    proxy.on_cut = unreachable
    call = prepare_request(call_id=f"c-{secrets.token_hex(4)}", start=True)
    proxy.arm(_saving(call.ref.call_id))
    with grpc.insecure_channel(daemon.target) as channel:
        stub = ToolLedgerStub(channel)
        got = expect_refusal(
            lambda: stub.PrepareTool(call, timeout=60),
            grpc.StatusCode.UNAVAILABLE,
            "STORAGE_UNAVAILABLE",
        )
        assert got.metadata == {"mayHaveBeenApplied": "true"}
        proxy.refusing = False
        again = _once_connected(lambda: stub.PrepareTool(call, timeout=60))
    assert again.decision == pb.DECISION_IN_PROGRESS


def _once_connected(send: Callable[[], T]) -> T:
    """`send`'s answer once the daemon has a connection again. Its pool
    reconnects with a backoff of its own (a second and more after a refused
    attempt), longer than POOL_WAIT: until then a request is refused
    UNAVAILABLE as not applied, and is sent again, as a client would."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return send()
        except grpc.RpcError as error:
            refusal = decode(error)
            assert refusal.metadata == {"mayHaveBeenApplied": "false"}, refusal
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


@pytest.mark.parametrize("session", [True, False], ids=["session", "unary"])
def test_the_client_sees_an_unknown_commit_as_unknown(
    through_proxy: tuple[RunningDaemon, CommitCutter],
    pg_database: str,
    session: bool,
) -> None:
    """Through the Python client, on the session stream as on unary calls:
    the lost COMMIT is a StorageUnavailable error saying it may have been
    applied, never a decision."""
    daemon, proxy = through_proxy

    def unreachable() -> None:
        proxy.refusing = True
        postgres.terminate("effectd/reads", pg_database)

    proxy.on_cut = unreachable
    call_id = f"c-{secrets.token_hex(4)}"
    proxy.arm(_saving(call_id))
    with (
        Client(daemon.target, session=session) as client,
        pytest.raises(EffectdError) as raised,
    ):
        client.prepare_tool("run", call_id, "t", {}, start=True)
    assert raised.value.code is grpc.StatusCode.UNAVAILABLE
    assert raised.value.reason == "STORAGE_UNAVAILABLE"
    assert raised.value.metadata["mayHaveBeenApplied"] == "true"


def test_a_lost_commit_that_committed_answers_execute_once(
    through_proxy: tuple[RunningDaemon, CommitCutter],
) -> None:
    """The COMMIT's answer is lost but the database is still there: the
    daemon learns it committed and answers EXECUTE; a repeat is IN_PROGRESS."""
    daemon, proxy = through_proxy
    call = prepare_request(call_id=f"c-{secrets.token_hex(4)}", start=True)
    proxy.arm(_saving(call.ref.call_id))
    with grpc.insecure_channel(daemon.target) as channel:
        stub = ToolLedgerStub(channel)
        first = stub.PrepareTool(call, timeout=60)
        again = stub.PrepareTool(call, timeout=60)
    assert proxy.cuts == 1
    assert (first.decision, again.decision) == (
        pb.DECISION_EXECUTE,
        pb.DECISION_IN_PROGRESS,
    )


def test_backup_of_the_shared_store_points_to_the_database_tools(
    config: ServeConfig, pg_url: str, clock: ManualClock, short_tmp: Path
) -> None:
    """`ctl backup` copies LMDB only: on the shared store it answers
    UNIMPLEMENTED, naming pg_dump, and writes nothing."""
    shared = dataclasses.replace(config, store=pg_url)
    target = short_tmp / "backup"
    with (
        running_daemon(shared, clock) as daemon,
        grpc.insecure_channel(daemon.target) as channel,
    ):
        got = expect_refusal(
            lambda: AdminStub(channel).Backup(
                admin_pb2.BackupRequest(path=str(target)), timeout=30
            ),
            grpc.StatusCode.UNIMPLEMENTED,
            "NOT_IMPLEMENTED",
        )
    assert "pg_dump" in got.message
    assert not target.exists()
