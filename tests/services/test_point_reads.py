"""A point read on the PostgreSQL store waits off the event loop: while one
request's read waits on the database, the daemon still answers the others.

The database holds the read: the test locks the store's table (ACCESS
EXCLUSIVE, which a read's snapshot waits for) and lets it go once the other
request has had its chance, so the order of events is decided by the test,
never by timing. Each point read of the services is held in turn: GetToolCall,
a repeated PrepareTool (answered from a read), DecideRetry of a recorded call
and a checkpoint Get. The negative control reads the PostgreSQL store on the
loop (`OnLoopPostgresStore`, broken on purpose, as the daemon did before):
then the health check is not answered while the read waits, and times out."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import psycopg
import pytest
from effectd.v1 import checkpoints_pb2 as cpb
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import retry_pb2 as ypb
from effectd.v1.checkpoints_pb2_grpc import CheckpointsStub
from effectd.v1.ledger_pb2_grpc import ToolLedgerStub
from effectd.v1.retry_pb2_grpc import RetryPolicyStub
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.rpc import summaries
from sidecar.seams import Seams
from sidecar.server import Daemon
from sidecar.storage.api import Store
from sidecar.storage.postgres.options import PostgresOptions
from sidecar.storage.postgres.store import PostgresStore
from sidecar.testing import running_daemon
from tests.rpc.support import prepare_request, ref

# A bound on every wait; reached only when the code under test is broken.
WAIT = 60.0
# How long the control's health check waits for an answer that cannot come
# while the loop waits on the held read (the read waits for as long as the
# test holds the lock, up to the store's statement timeout of 10 s).
CONTROL_WAIT = 2.0

_WAITING_READS = """
    SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
    WHERE l.relation IN ('effectd_calls'::regclass, 'effectd_checkpoints'::regclass)
      AND NOT l.granted
      AND a.application_name = ANY(%s)
"""


@pytest.fixture
def store_kind() -> str:
    return "postgres"


class OnLoopPostgresStore(PostgresStore):
    """BROKEN on purpose: says its reads never wait, so the services read it
    inline on the event loop, as the daemon did before."""

    reads_wait = False


class OnLoopDaemon(Daemon):
    def open_store(self) -> Store:
        assert self.config.store is not None
        return OnLoopPostgresStore(
            self.config.store, PostgresOptions(summarize=summaries.summarize)
        )


@contextmanager
def _table_locked(url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """The store's tables of calls and checkpoints locked against every read
    until exit."""
    with psycopg.connect(url) as conn:
        conn.execute(
            "LOCK TABLE effectd_calls, effectd_checkpoints IN ACCESS EXCLUSIVE MODE"
        )
        try:
            yield conn
        finally:
            conn.rollback()


def _wait_for_held_read(url: str) -> None:
    """Returns once a read of the daemon's read pools (snapshots, point
    reads) waits for the lock."""
    app = PostgresOptions().application_name
    name = [app + "/reads", app + "/points"]
    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            row = conn.execute(_WAITING_READS, (name,)).fetchone()
            if row is not None and row[0]:
                return
            time.sleep(0.01)
    raise AssertionError("no read ever waited for the lock")


Held = Callable[[grpc.Channel], "grpc.Future[Any]"]


def _get_tool_call(channel: grpc.Channel) -> grpc.Future[Any]:
    return ToolLedgerStub(channel).GetToolCall.future(
        pb.GetToolCallRequest(ref=ref("run", "c1")), timeout=WAIT
    )


def _repeated_prepare(channel: grpc.Channel) -> grpc.Future[Any]:
    return ToolLedgerStub(channel).PrepareTool.future(
        prepare_request("run", "c1"), timeout=WAIT
    )


def _decide_retry(channel: grpc.Channel) -> grpc.Future[Any]:
    return RetryPolicyStub(channel).DecideRetry.future(
        ypb.DecideRetryRequest(call=ref("run", "c1"), context=ypb.RETRY_CONTEXT_TOOL),
        timeout=WAIT,
    )


def _get_checkpoint(channel: grpc.Channel) -> grpc.Future[Any]:
    return CheckpointsStub(channel).Get.future(
        cpb.GetCheckpointRequest(key="k"), timeout=WAIT
    )


def _health(channel: grpc.Channel, timeout: float) -> object:
    return health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=""), timeout=timeout
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("held", "on_loop"),
    [
        (_get_tool_call, False),
        (_repeated_prepare, False),
        (_decide_retry, False),
        (_get_checkpoint, False),
        (_get_tool_call, True),
    ],
    ids=[
        "GetToolCall",
        "PrepareTool-repeat",
        "DecideRetry",
        "Checkpoints.Get",
        "control-on-loop",
    ],
)
def test_a_read_waiting_on_the_database_holds_up_only_its_own_request(
    config: ServeConfig, held: Held, on_loop: bool
) -> None:
    """While a point read waits on the database, a health check is answered
    (the held request is not); read on the loop (the control), it is not."""
    assert config.store is not None
    daemon = (OnLoopDaemon if on_loop else Daemon)(config, Seams(clock=ManualClock()))
    with (
        running_daemon(config, daemon=daemon) as d,
        grpc.insecure_channel(d.target) as channel,
    ):
        ToolLedgerStub(channel).PrepareTool(prepare_request("run", "c1"), timeout=WAIT)
        CheckpointsStub(channel).Put(
            cpb.PutCheckpointRequest(key="k", value=b"v", expect_absent=True),
            timeout=WAIT,
        )
        with _table_locked(config.store):
            waiting = held(channel)
            _wait_for_held_read(config.store)
            if on_loop:
                with pytest.raises(grpc.RpcError) as stalled:
                    _health(channel, CONTROL_WAIT)
                assert stalled.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            else:
                _health(channel, WAIT)
            assert not waiting.done()
        waiting.result()  # answered once the read could run
