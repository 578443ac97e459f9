"""The wall clock jumps forward and back on the injected clock (issue 15 item
6): leases and rate limits are judged on the monotonic clock, so a jump of
the wall clock neither ends a live lease (no premature settlement, no
RECONCILE for a call that is running) nor refills a rate limit; approvals do
not expire; retention (a wall-clock window, contract §4.7) compacts nothing while
the clock is behind the commit, and a tombstone still refuses a
re-execution (RESULT_COMPACTED); no answer carries a negative duration, and
nothing is answered INTERNAL. Each has its control: the monotonic clock
moved past the lease does settle it, past the window does compact, one
second of it does refill.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import recovery_pb2 as rcpb
from effectd.v1 import retry_pb2 as rpb
from effectd.v1.ledger_pb2_grpc import ToolLedgerStub
from effectd.v1.recovery_pb2_grpc import RecoveryStub
from effectd.v1.retry_pb2_grpc import RetryPolicyStub
from google.protobuf.timestamp_pb2 import Timestamp

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.ledger.quota import Quotas
from sidecar.testing import RunningDaemon, running_daemon
from tests.rpc.support import expect_refusal, prepare_request, ref

DAY = 86_400
JUMPS = [DAY, -DAY, 400 * DAY, -400 * DAY]


class JumpingClock(ManualClock):
    """A manual clock whose wall time can jump alone, as a system clock set
    by hand or by NTP does; its monotonic time never goes back."""

    def jump_wall(self, seconds: float) -> None:
        with self._changed:
            self._wall += int(seconds * 1e9)


@dataclasses.dataclass
class Daemon:
    running: RunningDaemon
    clock: JumpingClock
    ledger: ToolLedgerStub
    channel: grpc.Channel

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.running.loop).result(30)

    def sweep(self) -> None:
        self.run(self.running.daemon.sweep_leases())

    def state(self, call_id: str) -> int:
        got = self.ledger.GetToolCall(
            pb.GetToolCallRequest(ref=ref("run", call_id)), timeout=30
        )
        return int(got.call.state)


@pytest.fixture
def jumping(config: ServeConfig) -> Iterator[Daemon]:
    clock = JumpingClock()
    with (
        running_daemon(config, clock) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        yield Daemon(running, clock, ToolLedgerStub(channel), channel)


def started(d: Daemon, call_id: str, lease_ms: int = 60_000) -> pb.ToolCall:
    answer = d.ledger.PrepareTool(
        prepare_request("run", call_id, start=True, lease_ms=lease_ms), timeout=30
    )
    assert answer.decision == pb.DECISION_EXECUTE
    return answer.call


@pytest.mark.parametrize("jump", JUMPS)
def test_a_wall_jump_neither_ends_nor_stretches_a_lease(
    jumping: Daemon, jump: int
) -> None:
    """A call STARTED with a 60 s lease, the wall clock jumped: after a
    lease sweep it is still STARTED, a repeat is IN_PROGRESS (never
    RECONCILE or EXECUTE), its heartbeat and commit are taken. Control: the
    monotonic clock moved past the lease settles another call UNKNOWN, and
    a repeat of it is RECONCILE."""
    call = started(jumping, "held")
    other = started(jumping, "lapses")
    jumping.clock.jump_wall(jump)
    jumping.sweep()
    assert jumping.state("held") == pb.CALL_STATE_STARTED
    again = jumping.ledger.PrepareTool(prepare_request("run", "held"), timeout=30)
    assert again.decision == pb.DECISION_IN_PROGRESS
    jumping.clock.advance(30)
    beat = jumping.ledger.Heartbeat(
        pb.HeartbeatRequest(
            ref=ref("run", "held"), attempt=call.attempt, lease_ms=60_000
        ),
        timeout=30,
    )
    assert beat.call.state == pb.CALL_STATE_STARTED
    # Control: 45 s more is past the other call's lease, not the renewed one.
    jumping.clock.advance(45)
    jumping.sweep()
    assert jumping.state("lapses") == pb.CALL_STATE_UNKNOWN
    assert other.attempt == 1
    repeat = jumping.ledger.PrepareTool(prepare_request("run", "lapses"), timeout=30)
    assert repeat.decision == pb.DECISION_RECONCILE
    assert jumping.state("held") == pb.CALL_STATE_STARTED
    done = jumping.ledger.CommitTool(
        pb.CommitToolRequest(
            ref=ref("run", "held"),
            attempt=call.attempt,
            result=pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json="1")),
        ),
        timeout=30,
    )
    assert done.call.state == pb.CALL_STATE_COMMITTED


@pytest.mark.parametrize("jump", JUMPS)
def test_an_approval_does_not_expire_with_the_wall_clock(
    jumping: Daemon, jump: int
) -> None:
    """A call awaiting approval stays so through a wall jump and a day of the
    monotonic clock, and its approval is taken afterwards."""
    made = jumping.ledger.PrepareTool(
        prepare_request("run", "ask", require_approval=True), timeout=30
    ).call
    jumping.clock.jump_wall(jump)
    jumping.clock.advance(DAY)
    jumping.sweep()
    assert jumping.state("ask") == pb.CALL_STATE_AWAITING_APPROVAL
    decided = jumping.ledger.DecideApproval(
        pb.DecideApprovalRequest(
            ref=ref("run", "ask"),
            approve=True,
            approver="ann",
            reason="checked",
            expected_revision=made.revision,
            input_fingerprint=made.input_fingerprint,
        ),
        timeout=30,
    )
    assert decided.call.state == pb.CALL_STATE_PREPARED


def _committed_and_acknowledged(d: Daemon, call_id: str) -> None:
    call = started(d, call_id)
    d.ledger.CommitTool(
        pb.CommitToolRequest(
            ref=ref("run", call_id),
            attempt=call.attempt,
            result=pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json="7")),
        ),
        timeout=30,
    )
    RecoveryStub(d.channel).AcknowledgeRecovery(
        rcpb.AcknowledgeRecoveryRequest(run_id="run", call_ids=[call_id]), timeout=30
    )


def test_retention_waits_for_the_wall_clock_and_a_tombstone_still_refuses(
    jumping: Daemon,
) -> None:
    """A committed, acknowledged call: with the wall clock 30 days behind,
    then 6 days after its commit, a compaction pass compacts nothing and its
    result is returned; 8 days after (the control), it is compacted, and a
    repeat is never EXECUTE."""
    _committed_and_acknowledged(jumping, "kept")

    def compacted() -> int:
        done = jumping.run(jumping.running.daemon.compact_expired())
        return int(done.compacted)

    jumping.clock.jump_wall(-30 * DAY)
    assert compacted() == 0
    jumping.clock.jump_wall(36 * DAY)
    assert compacted() == 0
    repeat = jumping.ledger.PrepareTool(prepare_request("run", "kept"), timeout=30)
    assert repeat.decision == pb.DECISION_RETURN_RESULT
    assert repeat.call.result.payload.json == "7"
    jumping.clock.jump_wall(2 * DAY)
    assert compacted() == 1
    expect_refusal(
        lambda: jumping.ledger.PrepareTool(prepare_request("run", "kept"), timeout=30),
        grpc.StatusCode.FAILED_PRECONDITION,
        "RESULT_COMPACTED",
    )


def test_retry_deadlines_follow_the_wall_clock_without_negative_backoff(
    jumping: Daemon,
) -> None:
    """DecideRetry with a deadline a minute ahead: allowed with a backoff of
    zero or more; the wall clock jumped past it, denied; jumped back before
    it, allowed again."""
    stub = RetryPolicyStub(jumping.channel)
    deadline = Timestamp()
    deadline.FromNanoseconds(jumping.clock.wall_ns() + 60 * 10**9)

    def decide() -> rpb.DecideRetryResponse:
        answer: rpb.DecideRetryResponse = stub.DecideRetry(
            rpb.DecideRetryRequest(
                facts=rpb.RetryFacts(
                    effect=pb.EFFECT_READ, state=pb.CALL_STATE_UNKNOWN
                ),
                context=rpb.RETRY_CONTEXT_TOOL,
                error=rpb.AttemptError(kind=rpb.FAILURE_KIND_TIMEOUT),
                attempts_used=1,
                deadline=deadline,
            ),
            timeout=30,
        )
        return answer

    first = decide()
    assert first.allow
    jumping.clock.jump_wall(DAY)
    late = decide()
    assert not late.allow
    jumping.clock.jump_wall(-2 * DAY)
    again = decide()
    assert again.allow
    assert again.backoff_ms >= 0


def test_a_wall_jump_does_not_refill_a_rate_limit(short_tmp: Path) -> None:
    """One request a second, burst one: the second is RATE_LIMITED; a day
    of the wall clock does not refill the bucket; one second of the
    monotonic clock (the control) does."""
    config = ServeConfig(
        data_dir=short_tmp / "data",
        quotas=Quotas(requests_per_second=1, burst=1),
        settle_interval_seconds=1e9,
        retention_interval_seconds=1e9,
    )
    clock = JumpingClock()
    get = pb.GetToolCallRequest(ref=ref("run", "none"))
    with (
        running_daemon(config, clock) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        stub = ToolLedgerStub(channel)

        def once() -> None:
            stub.GetToolCall(get, timeout=30)

        expect_refusal(once, grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
        expect_refusal(once, grpc.StatusCode.RESOURCE_EXHAUSTED, "RATE_LIMITED")
        for jump in JUMPS:
            clock.jump_wall(jump)
            expect_refusal(once, grpc.StatusCode.RESOURCE_EXHAUSTED, "RATE_LIMITED")
        clock.advance(1)
        expect_refusal(once, grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
