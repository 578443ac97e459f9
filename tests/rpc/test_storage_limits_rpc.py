"""Storage edges through the real server: the longest identities and
checkpoint keys validation accepts are stored and found (never
STORAGE_UNAVAILABLE); a JSON and a raw input are different inputs; store
fill, the data directory's free disk and tombstone bytes in Admin.GetStats,
`effectd ctl stats` and /metrics; the retention settings in the policy
summary."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

import grpc
import pytest
from effectd.v1 import admin_pb2 as apb
from effectd.v1 import admin_pb2_grpc, recovery_pb2_grpc
from effectd.v1 import checkpoints_pb2 as cpb
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import recovery_pb2 as rpb
from effectd.v1.checkpoints_pb2_grpc import CheckpointsStub
from effectd.v1.ledger_pb2_grpc import ToolLedgerStub

from sidecar.cli import main
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.policy_file import parse_policy
from sidecar.rpc.admin import policy_pb
from sidecar.testing import RunningDaemon, running_daemon
from tests.observability.support import scrape
from tests.rpc.support import expect_refusal
from tests.support.postgres import BOTH

NS64 = "n" * 64
RUN = "r" * 256
CALL = "é" * 128


def _prepare(
    stub: ToolLedgerStub, payload: pb.Payload, ns: str = NS64, call: str = CALL
) -> pb.PrepareToolResponse:
    return stub.PrepareTool(
        pb.PrepareToolRequest(
            ref=pb.CallRef(namespace=ns, run_id=RUN, call_id=call),
            tool_name="t" * 256,
            input=payload,
        ),
        timeout=5,
    )


def test_the_longest_identity_is_stored_and_found(ledger_stub: ToolLedgerStub) -> None:
    """A 64-byte namespace with a 256-byte run_id and call_id is prepared,
    got and listed by its run with its readable identity (issue 10 item A1:
    fails before the fix: STORAGE_UNAVAILABLE, "safe to retry", for ever)."""
    made = _prepare(ledger_stub, pb.Payload(json='{"q": 1}'))
    assert made.decision == pb.DECISION_EXECUTE
    ref = pb.CallRef(namespace=NS64, run_id=RUN, call_id=CALL)
    got = ledger_stub.GetToolCall(pb.GetToolCallRequest(ref=ref), timeout=5).call
    assert (got.ref.run_id, got.ref.call_id) == (RUN, CALL)
    listed = ledger_stub.ListToolCalls(
        pb.ListToolCallsRequest(namespace=NS64, run_id=RUN), timeout=5
    )
    assert [c.ref.call_id for c in listed.calls] == [CALL]


def test_the_longest_checkpoint_key_is_stored_and_found(
    checkpoints_stub: CheckpointsStub,
) -> None:
    """A 512-byte checkpoint key in a 64-byte namespace is put, got, listed
    by a 300-byte prefix, and deleted (issue 10 item A1: fails before the
    fix: STORAGE_UNAVAILABLE)."""
    key = "k" * 300 + "é" * 106
    assert len(key.encode()) == 512
    put = checkpoints_stub.Put(
        cpb.PutCheckpointRequest(
            namespace=NS64, key=key, value=b"v", expect_absent=True
        ),
        timeout=5,
    )
    got = checkpoints_stub.Get(
        cpb.GetCheckpointRequest(namespace=NS64, key=key), timeout=5
    ).checkpoint
    assert (got.key, got.value, got.revision) == (key, b"v", put.revision)
    page = checkpoints_stub.List(
        cpb.ListCheckpointsRequest(namespace=NS64, prefix="k" * 300), timeout=5
    )
    assert [cp.key for cp in page.checkpoints] == [key]
    checkpoints_stub.Delete(
        cpb.DeleteCheckpointRequest(
            namespace=NS64, key=key, expected_revision=put.revision
        ),
        timeout=5,
    )


def test_a_raw_input_is_not_the_json_input_of_the_same_bytes(
    ledger_stub: ToolLedgerStub,
) -> None:
    """A call prepared with JSON `1.0`, prepared again with raw `1`, is
    INPUT_MISMATCH (issue 10 item C13: fails before the fix: one
    fingerprint, so the raw repeat got the JSON call's answer)."""
    _prepare(ledger_stub, pb.Payload(json="1.0"), ns="default", call="kind")
    expect_refusal(
        lambda: _prepare(ledger_stub, pb.Payload(raw=b"1"), ns="default", call="kind"),
        grpc.StatusCode.FAILED_PRECONDITION,
        "INPUT_MISMATCH",
    )
    again = _prepare(ledger_stub, pb.Payload(json="1"), ns="default", call="kind")
    assert again.call.revision == 1


def _stats(channel: grpc.Channel) -> apb.GetStatsResponse:
    return admin_pb2_grpc.AdminStub(channel).GetStats(apb.GetStatsRequest(), timeout=5)


# The store's fill is LMDB's (its map): on the shared store too, this runs on LMDB.
@pytest.mark.parametrize("store_kind", ["lmdb"])
def test_stats_report_store_fill_and_tombstone_bytes(
    daemon: RunningDaemon,
    channel: grpc.Channel,
    ledger_stub: ToolLedgerStub,
    clock: ManualClock,
) -> None:
    """GetStats reports the store's bytes in use against its map, and each
    namespace's tombstone bytes apart from its stored bytes (issue 10 items
    G28, A2: fails before the fix: neither was reported, and tombstones
    counted as stored bytes)."""
    before = _stats(channel)
    assert before.HasField("store_fill")
    fill = before.store_fill
    assert fill.map_size_bytes == daemon.daemon.config.map_size
    assert 0 < fill.used_bytes <= fill.high_water_bytes <= fill.map_size_bytes
    started = _prepare(ledger_stub, pb.Payload(json="{}"), ns="default", call="c")
    assert started.decision == pb.DECISION_EXECUTE
    held = ledger_stub.StartTool(
        pb.StartToolRequest(ref=pb.CallRef(run_id=RUN, call_id="c")), timeout=5
    )
    ledger_stub.CommitTool(
        pb.CommitToolRequest(
            ref=pb.CallRef(run_id=RUN, call_id="c"),
            attempt=held.call.attempt,
            result=pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json="1")),
        ),
        timeout=5,
    )
    recovery_pb2_grpc.RecoveryStub(channel).AcknowledgeRecovery(
        rpb.AcknowledgeRecoveryRequest(run_id=RUN, call_ids=["c"]), timeout=5
    )
    clock.advance(8 * 86_400)
    done = asyncio.run_coroutine_threadsafe(
        daemon.daemon.compact_expired(), daemon.loop
    ).result(timeout=30)
    assert done is not None
    assert done.compacted == 1
    [mine] = _stats(channel).namespaces
    assert (mine.namespace, mine.stored_bytes) == ("default", 0)
    assert mine.tombstone_bytes > 0


def test_ctl_stats_and_metrics_show_store_fill(
    short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`effectd ctl stats` prints the store's fill, and /metrics has the
    gauges to alert on (issue 10 item G28: fails before the fix: no fill)."""
    config = ServeConfig(
        data_dir=short_tmp / "data",
        init=True,
        metrics_listen="127.0.0.1:0",
        map_size=64 << 20,
    )
    with running_daemon(config) as running:
        capsys.readouterr()
        assert main(["ctl", "--target", running.target, "stats"]) == 0
        out = capsys.readouterr().out
        assert f"of {64 << 20} bytes used" in out
        address = running.daemon.metrics_address
        assert address is not None
        got = scrape(address)
    assert got.value("effectd_store_map_size_bytes") == 64 << 20
    used = got.value("effectd_store_used_bytes")
    assert used is not None
    assert 0 < used <= (got.value("effectd_store_high_water_bytes") or 0)


@pytest.mark.parametrize("store_kind", BOTH)
def test_stats_and_metrics_show_the_data_directorys_free_disk(
    config: ServeConfig, store_kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """GetStats, `effectd ctl stats` and /metrics show the free and total
    bytes of the data directory's filesystem, and whether the store is on it
    (LMDB) or not (PostgreSQL) (issue 25 item 9: fails before the fix: a
    full disk refused every write with STORAGE_FULL while nothing showed
    the disk)."""
    config = dataclasses.replace(config, metrics_listen="127.0.0.1:0")
    with running_daemon(config) as running:
        with grpc.insecure_channel(running.target) as channel:
            disk = _stats(channel).data_directory
        capsys.readouterr()
        assert main(["ctl", "--target", running.target, "stats"]) == 0
        out = capsys.readouterr().out
        address = running.daemon.metrics_address
        assert address is not None
        got = scrape(address)
    st = os.statvfs(config.data_dir)
    total = st.f_blocks * st.f_frsize
    on_lmdb = store_kind == "lmdb"
    assert (disk.path, disk.holds_store) == (str(config.data_dir), on_lmdb)
    assert disk.total_bytes == total
    assert 0 < disk.free_bytes <= total
    assert f"data directory {config.data_dir}: " in out
    assert f" of {total} bytes free" in out
    assert ("it holds the store" in out) is on_lmdb
    assert ("watch the database server's disk" in out) is not on_lmdb
    assert got.value("effectd_data_dir_size_bytes") == total
    assert 0 < (got.value("effectd_data_dir_free_bytes") or 0) <= total


def test_ctl_stats_warns_when_the_map_can_outgrow_the_disk(
    short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a map larger than the disk, `effectd ctl stats` says that writes
    will fail when the disk fills, long before the map does (issue 25 item
    9); with a map the disk holds, it does not."""
    st = os.statvfs(short_tmp)
    outs = []
    for map_size in (2 * st.f_blocks * st.f_frsize, 64 << 20):
        data = short_tmp / f"data-{map_size}"
        config = ServeConfig(data_dir=data, init=True, map_size=map_size)
        with running_daemon(config) as running:
            capsys.readouterr()
            assert main(["ctl", "--target", running.target, "stats"]) == 0
            outs.append(capsys.readouterr().out)
    too_big, fits = outs
    assert "writes fail with STORAGE_FULL when it is full" in too_big
    assert "STORAGE_FULL" not in fits


def test_the_policy_summary_has_the_retention_windows() -> None:
    """A reload's answer carries the unacknowledged window and the tombstone
    lifetime, as set in the policy file."""
    policy = parse_policy(
        "[retention]\ndays = 2\nunacknowledged_days = 9\ntombstone_days = 40\n"
    )
    summary = policy_pb(policy)
    assert (
        summary.retention_seconds,
        summary.unacknowledged_retention_seconds,
        summary.tombstone_seconds,
    ) == (2 * 86_400, 9 * 86_400, 40 * 86_400)
