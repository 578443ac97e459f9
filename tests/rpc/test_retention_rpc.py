"""Retention through the real server (contract §4.7 last row, ADR-010 R3): a
committed, acknowledged call is compacted to a tombstone after the window, at
start and periodically, on the manual clock; the tombstone refuses a late
duplicate; an unacknowledged call only after its longer window, and nothing
unresolved ever."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Coroutine
from typing import Any, TypeVar

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc, recovery_pb2_grpc
from effectd.v1 import recovery_pb2 as rpb

from sidecar.cli import parser
from sidecar.clock import ManualClock
from sidecar.config import ConfigError, ServeConfig
from sidecar.services.retention import PassResult, RetentionService
from sidecar.settings import load
from sidecar.testing import RunningDaemon, running_daemon
from tests.rpc.support import assert_serving, expect_refusal, prepare_request, ref
from tests.support.postgres import both_stores  # noqa: F401  (each store)

Ledger = ledger_pb2_grpc.ToolLedgerStub
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
DAY = 86_400.0
# The default policy keeps acknowledged calls for 7 days.
PAST_THE_WINDOW = 7 * DAY + 1
RESULT = '{"sent": true}'
T = TypeVar("T")


def _run(daemon: RunningDaemon, coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run_coroutine_threadsafe(coro, daemon.loop).result(timeout=30)


def _compact(daemon: RunningDaemon) -> PassResult:
    done = _run(daemon, daemon.daemon.compact_expired())
    assert done is not None
    return done


def _committed(ledger: Ledger, call_id: str = "call") -> pb.ToolCall:
    answer = ledger.PrepareTool(prepare_request("run", call_id, start=True))
    done = ledger.CommitTool(
        pb.CommitToolRequest(
            ref=ref("run", call_id),
            attempt=answer.call.attempt,
            result=pb.ToolResult(
                outcome=pb.OUTCOME_OK, payload=pb.Payload(json=RESULT)
            ),
        ),
        timeout=5,
    )
    return done.call


def _acknowledge(channel: grpc.Channel, call_id: str = "call") -> None:
    recovery_pb2_grpc.RecoveryStub(channel).AcknowledgeRecovery(
        rpb.AcknowledgeRecoveryRequest(run_id="run", call_ids=[call_id]), timeout=5
    )


def _get(ledger: Ledger, call_id: str = "call") -> pb.ToolCall:
    return ledger.GetToolCall(
        pb.GetToolCallRequest(ref=ref("run", call_id)), timeout=5
    ).call


def _present(ledger: Ledger) -> bool:
    try:
        _get(ledger)
    except grpc.RpcError:
        return False
    return True


def test_before_the_window_a_duplicate_prepare_returns_the_result(
    daemon: RunningDaemon,
    channel: grpc.Channel,
    ledger_stub: Ledger,
    clock: ManualClock,
) -> None:
    """Six days after the acknowledgement a pass keeps the call: a repeat
    prepare answers RETURN_RESULT with the stored result."""
    _committed(ledger_stub)
    _acknowledge(channel)
    clock.advance(6 * DAY)
    assert _compact(daemon).compacted == 0
    again = ledger_stub.PrepareTool(prepare_request("run", "call"), timeout=5)
    assert again.decision == pb.DECISION_RETURN_RESULT
    assert again.call.result.payload.json == RESULT


def test_after_the_window_a_duplicate_prepare_is_refused_not_executed(
    daemon: RunningDaemon,
    channel: grpc.Channel,
    ledger_stub: Ledger,
    clock: ManualClock,
) -> None:
    """Past the window the call is a tombstone: a repeat prepare (with or
    without start) is RESULT_COMPACTED, never EXECUTE; another input is
    INPUT_MISMATCH; the refusal names the outcome and digest kept."""
    call = _committed(ledger_stub)
    _acknowledge(channel)
    clock.advance(PAST_THE_WINDOW)
    assert _compact(daemon).compacted == 1
    for request in (prepare_request(), prepare_request(start=True)):
        got = expect_refusal(
            functools.partial(ledger_stub.PrepareTool, request, timeout=5),
            PRECONDITION,
            "RESULT_COMPACTED",
        )
        assert got.metadata["compacted"] == "true"
        assert got.metadata["outcome"] == "OK"
        assert got.metadata["resultDigest"] == call.result.digest
    expect_refusal(
        lambda: ledger_stub.PrepareTool(
            prepare_request("run", "call", json='{"other": 1}'), timeout=5
        ),
        PRECONDITION,
        "INPUT_MISMATCH",
    )


def test_a_compacted_call_is_not_found_saying_so(
    daemon: RunningDaemon,
    channel: grpc.Channel,
    ledger_stub: Ledger,
    clock: ManualClock,
) -> None:
    """GetToolCall, StartTool and CommitTool of a compacted call answer
    NOT_FOUND with metadata saying it was compacted; listings skip it."""
    _committed(ledger_stub)
    _acknowledge(channel)
    clock.advance(PAST_THE_WINDOW)
    _compact(daemon)
    got = expect_refusal(
        lambda: _get(ledger_stub), grpc.StatusCode.NOT_FOUND, "NOT_FOUND"
    )
    assert got.metadata["compacted"] == "true"
    assert "compacted" in got.message
    got = expect_refusal(
        lambda: ledger_stub.StartTool(
            pb.StartToolRequest(ref=ref("run", "call"), retry=True), timeout=5
        ),
        grpc.StatusCode.NOT_FOUND,
        "NOT_FOUND",
    )
    assert got.metadata["compacted"] == "true"
    listed = ledger_stub.ListToolCalls(pb.ListToolCallsRequest(run_id="run"), timeout=5)
    assert list(listed.calls) == []


def test_an_unacknowledged_call_waits_and_an_unresolved_one_stays(
    daemon: RunningDaemon,
    ledger_stub: Ledger,
    clock: ManualClock,
) -> None:
    """ADR-010 R3, contract §4.7: past the window (7 days) the unacknowledged
    committed call still answers RETURN_RESULT; past its own (30 days) it is
    a tombstone that refuses a duplicate; a year later the unknown side
    effect still answers RECONCILE."""
    _committed(ledger_stub, "unacked")
    unknown = ledger_stub.PrepareTool(prepare_request("run", "lost", start=True))
    ledger_stub.ReportUnknown(
        pb.ReportUnknownRequest(
            ref=ref("run", "lost"), attempt=unknown.call.attempt, reason="timeout"
        ),
        timeout=5,
    )
    clock.advance(29 * DAY)
    done = _compact(daemon)
    assert (done.examined, done.compacted) == (1, 0)
    again = ledger_stub.PrepareTool(prepare_request("run", "unacked"), timeout=5)
    assert again.decision == pb.DECISION_RETURN_RESULT
    clock.advance(336 * DAY)
    done = _compact(daemon)
    assert (done.examined, done.compacted) == (1, 1)
    refused = expect_refusal(
        lambda: ledger_stub.PrepareTool(prepare_request("run", "unacked"), timeout=5),
        PRECONDITION,
        "RESULT_COMPACTED",
    )
    assert refused.metadata["acknowledged"] == "false"
    lost = ledger_stub.PrepareTool(prepare_request("run", "lost"), timeout=5)
    assert lost.decision == pb.DECISION_RECONCILE


def test_the_daemon_compacts_periodically_on_its_clock(
    config: ServeConfig, clock: ManualClock
) -> None:
    """The daemon's own task compacts a call once the injected clock has
    passed the window and an interval, without any request asking for it;
    past the window but not yet the interval, the call is still there (fails
    before the fix: the task slept on real time, so moving the clock never
    woke it)."""
    interval = PAST_THE_WINDOW + DAY
    fast = dataclasses.replace(config, retention_interval_seconds=interval)
    with (
        running_daemon(fast, clock) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        ledger = Ledger(channel)
        _committed(ledger)
        _acknowledge(channel)
        running.wait_for_periodic_tasks()
        clock.advance(PAST_THE_WINDOW)  # past the window, not yet the interval
        running.wait_for_periodic_tasks()
        assert _get(ledger).state == pb.CALL_STATE_COMMITTED
        clock.advance(DAY)
        # The task woke, ran its pass (committed), and sleeps again.
        running.wait_for_periodic_tasks()
        got = expect_refusal(
            lambda: _get(ledger), grpc.StatusCode.NOT_FOUND, "NOT_FOUND"
        )
        assert got.metadata["compacted"] == "true"


def test_the_daemon_compacts_at_start(config: ServeConfig, clock: ManualClock) -> None:
    """A daemon started after the window has passed compacts before it
    serves its first request."""
    with (
        running_daemon(config, clock) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        _committed(Ledger(channel))
        _acknowledge(channel)
    clock.advance(PAST_THE_WINDOW)
    with (
        running_daemon(config, clock) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        expect_refusal(
            lambda: Ledger(channel).PrepareTool(prepare_request(), timeout=5),
            PRECONDITION,
            "RESULT_COMPACTED",
        )


def test_stop_cancels_the_retention_task(
    config: ServeConfig, clock: ManualClock
) -> None:
    """After a graceful stop no retention task is left on the daemon's loop."""

    async def names() -> set[str]:
        return {t.get_name() for t in asyncio.all_tasks()}

    with running_daemon(config, clock) as running:
        assert "effectd-retention" in _run(running, names())
        _run(running, running.daemon.stop())
        assert "effectd-retention" not in _run(running, names())


def test_the_interval_must_be_positive(config: ServeConfig) -> None:
    """A zero interval would spin: refused at configuration, naming it."""
    with pytest.raises(ConfigError, match="retention-interval"):
        dataclasses.replace(config, retention_interval_seconds=0).validate()


def test_a_failing_pass_is_logged_and_the_daemon_serves(
    config: ServeConfig,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A compaction pass that fails (at start or later) is logged, compacts
    nothing and never stops the daemon."""

    async def broken(self: RetentionService) -> PassResult:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(RetentionService, "compact", broken)
    with (
        running_daemon(config, clock) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        assert _run(running, running.daemon.compact_expired()) is None
        assert_serving(channel)
    failures = [r for r in caplog.records if "compaction pass failed" in r.message]
    assert len(failures) == 2


def test_the_interval_is_a_serve_flag() -> None:
    """`effectd serve --retention-interval SECONDS` reaches the parser."""
    args = parser().parse_args(["serve", "--retention-interval", "2.5"])
    assert load(args, {}).config.retention_interval_seconds == 2.5
