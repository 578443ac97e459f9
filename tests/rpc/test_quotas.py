"""Per-namespace quotas end to end, through a real daemon and the Python client:
a namespace at its open-call or byte quota gets RESOURCE_EXHAUSTED /
QUOTA_EXCEEDED with a RetryInfo and nothing is written, another namespace
keeps being served, work already done can always be recorded (and counts:
results that take a namespace past its byte quota stop its new calls until
retention frees them, and the stats show by how much), and the counters
survive a restart."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from effectd.v1 import admin_pb2 as apb
from effectd.v1 import admin_pb2_grpc, ledger_pb2_grpc
from effectd.v1 import ledger_pb2 as pb

from effectd_client import Client, Decision, EffectdError, NotFound, QuotaExceeded
from sidecar.cli import main
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.ledger.quota import Quotas
from sidecar.testing import RunningDaemon, running_daemon
from tests.rpc.support import prepare_request
from tests.support.postgres import both_stores  # noqa: F401  (each store)

OPEN_CALLS = 3


@pytest.fixture
def quota_config(config: ServeConfig) -> ServeConfig:
    return dataclasses.replace(
        config, quotas=Quotas(open_calls=OPEN_CALLS, stored_bytes=64 << 10)
    )


@pytest.fixture
def served(quota_config: ServeConfig, clock: ManualClock) -> Iterator[RunningDaemon]:
    with running_daemon(quota_config, clock) as running:
        yield running


@pytest.fixture
def connect(served: RunningDaemon) -> Iterator[Callable[[str], Client]]:
    """Clients of one namespace each, closed at the end."""
    opened: list[Client] = []

    def open_client(namespace: str) -> Client:
        opened.append(Client(served.target, namespace=namespace))
        return opened[-1]

    yield open_client
    for c in opened:
        c.close()


def refused(fn: Callable[[], object]) -> QuotaExceeded:
    with pytest.raises(QuotaExceeded) as info:
        fn()
    return info.value


def fill(c: Client, count: int = OPEN_CALLS, *, start: bool = True) -> None:
    for i in range(count):
        c.prepare_tool("run", f"call-{i}", "send", {"i": i}, start=start)


def absent(c: Client, call_id: str) -> bool:
    try:
        c.get_tool_call("run", call_id)
    except NotFound:
        return True
    return False


def test_a_namespace_at_its_open_call_quota_is_refused_and_another_served(
    connect: Callable[[str], Client],
) -> None:
    """A's prepare past 3 open calls is RESOURCE_EXHAUSTED / QUOTA_EXCEEDED with
    the quota, its limit and a RetryInfo, and records nothing; B is served."""
    a, b = connect("tenant-a"), connect("tenant-b")
    fill(a)
    got = refused(lambda: a.prepare_tool("run", "one-more", "send", {}))
    assert got.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert got.reason == "QUOTA_EXCEEDED"
    assert got.metadata == {
        "quota": "open_calls",
        "limit": str(OPEN_CALLS),
        "namespace": "tenant-a",
    }
    assert got.retry_delay == 1.0
    assert absent(a, "one-more")
    fill(b)
    assert b.get_tool_call("run", "call-2").state.name == "STARTED"


def test_a_repeated_prepare_at_quota_is_answered(
    connect: Callable[[str], Client],
) -> None:
    """At its quota a namespace still gets the answer for a call it already
    has: a repeated prepare creates nothing."""
    a = connect("tenant-a")
    fill(a, start=False)
    again = a.prepare_tool("run", "call-0", "send", {"i": 0}, start=True)
    assert again.decision is Decision.EXECUTE


def test_work_already_done_is_recorded_at_quota_and_frees_a_slot(
    connect: Callable[[str], Client],
) -> None:
    """At its quota, A can still heartbeat, report UNKNOWN and commit; the
    commit frees one slot, and only one."""
    a = connect("tenant-a")
    fill(a)
    a.heartbeat("run", "call-0", 1)
    a.report_unknown("run", "call-1", 1, "connection lost")
    a.commit_tool("run", "call-2", 1, {"ok": True})
    a.prepare_tool("run", "call-3", "send", {}, start=True)
    refused(lambda: a.prepare_tool("run", "call-4", "send", {}))
    a.commit_tool("run", "call-3", 1, {"ok": True})
    a.prepare_tool("run", "call-4", "send", {})


def test_a_batch_past_the_quota_writes_nothing(
    served: RunningDaemon, connect: Callable[[str], Client]
) -> None:
    """PrepareTools with two new calls and one free slot is refused at the
    second, with its index, and neither call is recorded."""
    a = connect("tenant-a")
    fill(a, OPEN_CALLS - 1)
    batch = pb.PrepareToolsRequest(
        calls=[
            prepare_request("run", "new-1", namespace="tenant-a", start=True),
            prepare_request("run", "new-2", namespace="tenant-a", start=True),
        ]
    )
    with grpc.insecure_channel(served.target) as channel:
        stub = ledger_pb2_grpc.ToolLedgerStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.PrepareTools(batch, timeout=10)
    got = EffectdError.from_rpc_error(info.value)
    assert isinstance(got, QuotaExceeded)
    assert (got.metadata["quota"], got.metadata["index"]) == ("open_calls", "1")
    assert got.retry_delay == 1.0
    assert absent(a, "new-1")
    assert absent(a, "new-2")


@pytest.fixture
def byte_config(config: ServeConfig) -> ServeConfig:
    return dataclasses.replace(config, quotas=Quotas(stored_bytes=4096))


def test_checkpoints_past_the_byte_quota_are_refused(
    byte_config: ServeConfig, clock: ManualClock
) -> None:
    """A Put that would grow A past 4096 bytes is refused and not stored;
    shrinking and deleting are always allowed; B is unaffected; a prepare is
    refused too when A's checkpoints already fill its bytes."""
    with (
        running_daemon(byte_config, clock) as running,
        Client(running.target, namespace="tenant-a") as a,
        Client(running.target, namespace="tenant-b") as b,
    ):
        first = a.put_checkpoint("small", b"x" * 1000)
        got = refused(lambda: a.put_checkpoint("big", b"x" * 4000))
        assert got.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert got.metadata == {
            "quota": "stored_bytes",
            "limit": "4096",
            "namespace": "tenant-a",
        }
        assert got.retry_delay == 1.0
        assert a.get_checkpoint("big") is None
        b.put_checkpoint("big", b"x" * 4000)

        grown = a.put_checkpoint("small", b"x" * 3900, expected_revision=first)
        refused(lambda: a.prepare_tool("run", "call", "send", {}))
        shrunk = a.put_checkpoint("small", b"x" * 10, expected_revision=grown)
        a.delete_checkpoint("small", shrunk)
        a.prepare_tool("run", "call", "send", {})


BYTE_QUOTA = 8192
RESULT = {"text": "r" * 6000}


def _over_quota(running: RunningDaemon) -> dict[str, tuple[int, int]]:
    """GetStats: (stored bytes, bytes over the quota) by namespace."""
    with grpc.insecure_channel(running.target) as channel:
        stats = admin_pb2_grpc.AdminStub(channel).GetStats(
            apb.GetStatsRequest(), timeout=10
        )
    return {
        n.namespace: (n.stored_bytes, n.stored_bytes_over_quota)
        for n in stats.namespaces
    }


def test_results_past_the_byte_quota_are_recorded_and_stop_new_calls(
    config: ServeConfig, clock: ManualClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three calls admitted under A's 8192-byte quota commit 6000-byte
    results: every commit is recorded and counted, A's next new prepare is
    refused QUOTA_EXCEEDED on stored_bytes while a repeat of a call it has is
    answered and B is served, GetStats and `effectd ctl stats` show A over
    its quota and by how much; once retention compacts the results, A is
    served again (issue 25 item 17: fails before the fix: nothing showed
    which namespace was over, or by how much)."""
    quotas = Quotas(stored_bytes=BYTE_QUOTA)
    with (
        running_daemon(dataclasses.replace(config, quotas=quotas), clock) as running,
        Client(running.target, namespace="tenant-a") as a,
        Client(running.target, namespace="tenant-b") as b,
    ):
        fill(a)
        for i in range(OPEN_CALLS):
            done = a.commit_tool("run", f"call-{i}", 1, RESULT, acknowledge=True)
            assert done.state.name == "COMMITTED"
        stored, over = _over_quota(running)["tenant-a"]
        assert stored > OPEN_CALLS * 6000
        assert over == stored - BYTE_QUOTA
        got = refused(lambda: a.prepare_tool("run", "next", "send", {}))
        assert got.reason == "QUOTA_EXCEEDED"
        assert got.metadata == {
            "quota": "stored_bytes",
            "limit": str(BYTE_QUOTA),
            "namespace": "tenant-a",
        }
        assert absent(a, "next")
        again = a.prepare_tool("run", "call-0", "send", {"i": 0})
        assert again.decision is Decision.RETURN_RESULT
        b.prepare_tool("run", "call-0", "send", {}, start=True)
        assert _over_quota(running)["tenant-b"][1] == 0
        capsys.readouterr()
        assert main(["ctl", "--target", running.target, "stats"]) == 0
        out = capsys.readouterr().out
        assert f"over quota: tenant-a stores {stored} bytes, {over} past" in out
        assert "over quota: tenant-b" not in out

        clock.advance(8 * 86_400)
        compacted = asyncio.run_coroutine_threadsafe(
            running.daemon.compact_expired(), running.loop
        ).result(timeout=30)
        assert compacted is not None
        assert compacted.compacted == OPEN_CALLS
        assert _over_quota(running).get("tenant-a", (0, 0))[1] == 0
        a.prepare_tool("run", "next", "send", {})


def test_the_counters_survive_a_restart(short_tmp: Path, clock: ManualClock) -> None:
    """After a restart over the same data directory, a namespace at its quota
    is still at it, and a commit made then frees a slot."""
    config = ServeConfig(
        data_dir=short_tmp / "data", init=True, quotas=Quotas(open_calls=2)
    )
    with (
        running_daemon(config, clock) as running,
        Client(running.target, namespace="tenant-a") as a,
    ):
        fill(a, 2, start=False)
    with (
        running_daemon(config, clock) as running,
        Client(running.target, namespace="tenant-a") as a,
    ):
        refused(lambda: a.prepare_tool("run", "call-2", "send", {}))
        started = a.start_tool("run", "call-0")
        a.commit_tool("run", "call-0", started.call.attempt, {"ok": True})
        a.prepare_tool("run", "call-2", "send", {})
        refused(lambda: a.prepare_tool("run", "call-3", "send", {}))
