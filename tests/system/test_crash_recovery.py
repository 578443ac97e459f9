"""Recovery after kill -9 of the daemon process (contract §6.1, ADR-010 D1, D3).

Calls STARTED at the kill come back UNKNOWN: a side effect is RECONCILE, a
READ / IDEMPOTENT_WRITE is RETRY_NEEDS_POLICY, never EXECUTE; a committed
call is REPLAY_RESULT with its exact bytes. Recovery starts nothing.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc, recovery_pb2_grpc
from effectd.v1 import recovery_pb2 as rpb

from tests.rpc.support import prepare_request, ref
from tests.support.processes import daemon_process

RESULT = b"\x00receipt-42\xff"
EFFECTS = {
    "charge": pb.EFFECT_SIDE_EFFECT,
    "undeclared": pb.EFFECT_UNSPECIFIED,
    "lookup": pb.EFFECT_READ,
    "upsert": pb.EFFECT_IDEMPOTENT_WRITE,
}
WANT = {
    # ADR-010 D3 "started + side-effect: interrupt and require reconciliation";
    # D2: an undeclared effect is a side effect.
    "charge": rpb.RECOVERY_ACTION_RECONCILE,
    "undeclared": rpb.RECOVERY_ACTION_RECONCILE,
    # ADR-010 D3 "retries of read / idempotent-write still need an explicit
    # orchestration policy; crash recovery must not trigger them blindly".
    "lookup": rpb.RECOVERY_ACTION_RETRY_NEEDS_POLICY,
    "upsert": rpb.RECOVERY_ACTION_RETRY_NEEDS_POLICY,
    # ADR-010 D3 "committed + result: complete the transcript".
    "done": rpb.RECOVERY_ACTION_REPLAY_RESULT,
}


def plan_violations(plan: rpb.RecoverResponse) -> list[str]:
    """Items whose action is not the expected one, or that would execute a call
    whose last attempt has an unknown outcome, or replay other bytes."""
    found = []
    for item in plan.items:
        call_id = item.call.ref.call_id
        if item.action != WANT.get(call_id):
            found.append(f"{call_id}: {rpb.RecoveryAction.Name(item.action)}")
        unresolved = item.call.state in (pb.CALL_STATE_STARTED, pb.CALL_STATE_UNKNOWN)
        if unresolved and item.action == rpb.RECOVERY_ACTION_EXECUTE:
            found.append(f"{call_id}: EXECUTE of an unknown outcome")
        if call_id == "done" and item.result.payload.raw != RESULT:
            found.append(f"{call_id}: result {item.result.payload.raw!r}")
    if {i.call.ref.call_id for i in plan.items} != set(WANT):
        found.append("calls missing or extra")
    return found


def test_negative_control_a_plan_that_executes_a_lost_side_effect_is_caught() -> None:
    """The checker above rejects a plan that says EXECUTE for the UNKNOWN side
    effect, or that replays other bytes."""
    items = [
        rpb.RecoveryItem(
            action=action,
            call=pb.ToolCall(ref=ref("run", call_id), state=pb.CALL_STATE_UNKNOWN),
        )
        for call_id, action in WANT.items()
    ]
    items[-1].result.payload.raw = RESULT
    assert plan_violations(rpb.RecoverResponse(items=items)) == []
    items[0].action = rpb.RECOVERY_ACTION_EXECUTE
    items[-1].result.payload.raw = b"other"
    assert len(plan_violations(rpb.RecoverResponse(items=items))) == 3


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_recover_after_kill_9_plans_without_executing(short_tmp: Path) -> None:
    """After kill -9 and a restart, Recover plans every call by its effect and
    state, replays the committed bytes, and hands out no attempt."""
    data = short_tmp / "data"
    with daemon_process(data) as d:
        with grpc.insecure_channel(d.target) as ch:
            ledger = ledger_pb2_grpc.ToolLedgerStub(ch)
            for call_id, effect in EFFECTS.items():
                started = ledger.PrepareTool(
                    prepare_request("run", call_id, effect=effect, start=True),
                    timeout=5,
                )
                assert started.attempt_held
            done = ledger.PrepareTool(
                prepare_request("run", "done", start=True), timeout=5
            )
            ledger.CommitTool(
                pb.CommitToolRequest(
                    ref=ref("run", "done"),
                    attempt=done.call.attempt,
                    result=pb.ToolResult(
                        outcome=pb.OUTCOME_OK, payload=pb.Payload(raw=RESULT)
                    ),
                ),
                timeout=5,
            )
        d.kill9()
    with daemon_process(data) as d, grpc.insecure_channel(d.target) as ch:
        recovery = recovery_pb2_grpc.RecoveryStub(ch)
        plan = recovery.Recover(rpb.RecoverRequest(run_id="run"), timeout=5)
        assert plan_violations(plan) == []
        assert plan.interrupted
        items = {i.call.ref.call_id: i for i in plan.items}
        for call_id in EFFECTS:
            call = items[call_id].call
            assert (call.state, call.attempt) == (pb.CALL_STATE_UNKNOWN, 1)
        ledger = ledger_pb2_grpc.ToolLedgerStub(ch)
        history = ledger.GetToolCall(
            pb.GetToolCallRequest(ref=ref("run", "charge")), timeout=5
        ).call.history
        assert [t.event for t in history] == ["prepare", "start", "restart"]

        acked = recovery.AcknowledgeRecovery(
            rpb.AcknowledgeRecoveryRequest(run_id="run", call_ids=["done"]), timeout=5
        )
        assert acked.calls[0].acknowledged
        again = recovery.Recover(rpb.RecoverRequest(run_id="run"), timeout=5)
        # Only the acknowledged result changes: it was delivered.
        delivered = {"done": rpb.RECOVERY_ACTION_ALREADY_DELIVERED}
        assert [i.action for i in again.items] == [
            delivered.get(i.call.ref.call_id, i.action) for i in plan.items
        ]
        assert d.terminate() == 0
