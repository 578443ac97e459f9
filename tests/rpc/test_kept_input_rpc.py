"""A call's exact input is kept for whoever must decide on it: GetToolCall
returns it from the first prepare until the call is settled (COMMITTED), and
after that when the policy keeps settled inputs, within its cap; the answers
to the agent's own steps carry it only while an approver must see it; a
record without one (written before) still works; it counts in the
namespace's stored bytes; and an approval stays bound to the fingerprint,
never to the text shown. Each store."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from effectd.v1 import admin_pb2, admin_pb2_grpc, ledger_pb2_grpc, recovery_pb2_grpc
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import recovery_pb2 as rpb

from sidecar.cli import main
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.ledger import fingerprint, operator_rules
from sidecar.ledger.model import CallRef, Payload, PayloadKind, ToolCall
from sidecar.ledger.operator_rules import ApprovalDecision
from sidecar.ledger.policy import Policy
from sidecar.ledger.quota import Quotas
from sidecar.ledger.rules import Now, Step
from sidecar.storage import records
from sidecar.storage.api import WriteView
from sidecar.testing import RunningDaemon, running_daemon
from tests.rpc.support import expect_refusal, prepare_request, ref
from tests.support.postgres import both_stores  # noqa: F401  (each store)

Ledger = ledger_pb2_grpc.ToolLedgerStub
# As sent: spacing and key order are kept, only the fingerprint is canonical.
SENT = '{"to": "bob",  "amount": 5}'


def _get(ledger: Ledger, call_id: str = "call") -> pb.ToolCall:
    return ledger.GetToolCall(
        pb.GetToolCallRequest(ref=ref("run", call_id)), timeout=5
    ).call


def _decide(
    ledger: Ledger, call: pb.ToolCall, *, approve: bool, fp: str | None = None
) -> pb.ToolCall:
    return ledger.DecideApproval(
        pb.DecideApprovalRequest(
            ref=call.ref,
            approve=approve,
            approver="ada",
            reason="read the input",
            expected_revision=call.revision,
            input_fingerprint=fp or call.input_fingerprint,
        ),
        timeout=5,
    ).call


def _stored_bytes(channel: grpc.Channel) -> int:
    stats = admin_pb2_grpc.AdminStub(channel).GetStats(
        admin_pb2.GetStatsRequest(), timeout=5
    )
    return sum(n.stored_bytes for n in stats.namespaces)


def test_an_awaiting_call_keeps_its_exact_input_until_committed(
    ledger_stub: Ledger, channel: grpc.Channel
) -> None:
    """GetToolCall shows the input byte for byte while the call awaits
    approval and after the approval; lists and plans do not carry it; the
    commit drops it, and so does a rejection (issue 10 item 29: fails before
    the fix: only the fingerprint was kept)."""
    request = prepare_request("run", "call", json=SENT, require_approval=True)
    ledger_stub.PrepareTool(request, timeout=5)
    waiting = _get(ledger_stub)
    assert waiting.kept_input.json == SENT
    listed = ledger_stub.ListToolCalls(pb.ListToolCallsRequest(run_id="run"))
    assert not listed.calls[0].HasField("kept_input")
    plan = recovery_pb2_grpc.RecoveryStub(channel).Recover(
        rpb.RecoverRequest(run_id="run"), timeout=5
    )
    assert not plan.items[0].call.HasField("kept_input")

    _decide(ledger_stub, waiting, approve=True)
    assert _get(ledger_stub).kept_input.json == SENT
    started = ledger_stub.StartTool(pb.StartToolRequest(ref=ref()), timeout=5)
    ledger_stub.CommitTool(
        pb.CommitToolRequest(
            ref=ref(),
            attempt=started.call.attempt,
            result=pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json="1")),
        ),
        timeout=5,
    )
    done = _get(ledger_stub)
    assert not done.HasField("kept_input")
    assert done.input_fingerprint == waiting.input_fingerprint

    ledger_stub.PrepareTool(
        prepare_request("run", "no", json=SENT, require_approval=True), timeout=5
    )
    _decide(ledger_stub, _get(ledger_stub, "no"), approve=False)
    assert not _get(ledger_stub, "no").HasField("kept_input")


def _commit(ledger: Ledger, call_id: str, attempt: int) -> pb.ToolCall:
    return ledger.CommitTool(
        pb.CommitToolRequest(
            ref=ref("run", call_id),
            attempt=attempt,
            result=pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json="1")),
        ),
        timeout=5,
    ).call


def _found(ledger: Ledger, revision: int) -> pb.ToolCall:
    """The operator records the result found in the target system."""
    return ledger.Reconcile(
        pb.ReconcileRequest(
            ref=ref(),
            expected_revision=revision,
            result=pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json="1")),
            operator="ops",
            reason="found",
            evidence="in the PSP",
        ),
        timeout=5,
    ).call


def test_an_unknown_side_effect_keeps_its_input_until_settled(
    daemon: RunningDaemon,
    ledger_stub: Ledger,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Under the default policy, a side effect prepared and started without
    approval keeps its input as sent: GetToolCall and `effectd ctl show`
    give it once its outcome is UNKNOWN; the reconciliation that records
    the result found drops it; a call committed by its agent drops it too
    (issue 25 item 7: fails before the fix: only the fingerprint was kept,
    and the operator could not tell what to look for)."""
    held = ledger_stub.PrepareTool(
        prepare_request("run", "call", json=SENT, start=True), timeout=5
    )
    assert held.attempt_held
    ledger_stub.ReportUnknown(
        pb.ReportUnknownRequest(ref=ref(), attempt=1, reason="lost"), timeout=5
    )
    lost = _get(ledger_stub)
    assert lost.state == pb.CALL_STATE_UNKNOWN
    assert lost.kept_input.json == SENT
    capsys.readouterr()
    assert main(["ctl", "--target", daemon.target, "show", "run", "call"]) == 0
    shown = capsys.readouterr().out
    assert SENT in shown
    assert "hashes to the input fingerprint" in shown
    done = _found(ledger_stub, lost.revision)
    assert done.state == pb.CALL_STATE_COMMITTED
    assert not _get(ledger_stub).HasField("kept_input")
    assert done.input_fingerprint == lost.input_fingerprint

    ledger_stub.PrepareTool(
        prepare_request("run", "ok", json=SENT, start=True), timeout=5
    )
    assert _get(ledger_stub, "ok").kept_input.json == SENT
    _commit(ledger_stub, "ok", 1)
    assert not _get(ledger_stub, "ok").HasField("kept_input")


def test_the_agents_answers_do_not_echo_its_input(ledger_stub: Ledger) -> None:
    """The answers to prepare, start, heartbeat, report and commit carry the
    input only while the call awaits approval (the agent sent it; an
    approval flow shows it): each step would send it back otherwise."""
    prepared = ledger_stub.PrepareTool(
        prepare_request("run", "call", json=SENT), timeout=5
    )
    started = ledger_stub.StartTool(pb.StartToolRequest(ref=ref()), timeout=5)
    beat = ledger_stub.Heartbeat(
        pb.HeartbeatRequest(ref=ref(), attempt=1, lease_ms=60_000), timeout=5
    )
    lost = ledger_stub.ReportUnknown(
        pb.ReportUnknownRequest(ref=ref(), attempt=1, reason="lost"), timeout=5
    )
    committed = _commit(ledger_stub, "call", 1)
    for answer in (prepared.call, started.call, beat.call, lost.call, committed):
        assert not answer.HasField("kept_input"), answer.state
    waiting = ledger_stub.PrepareTool(
        prepare_request("run", "gated", json=SENT, require_approval=True),
        timeout=5,
    )
    assert waiting.call.kept_input.json == SENT


def _forget_kept_input(daemon: RunningDaemon, call_id: str) -> None:
    """The record as a daemon from before every input was kept wrote it."""

    def apply(view: WriteView) -> None:
        old = records.load_call(view, CallRef("default", "run", call_id))
        assert old is not None
        records.save_call(view, old, dataclasses.replace(old, kept_input=None))

    store = daemon.daemon._store
    assert store is not None
    store.submit(apply).result(timeout=10)


def test_a_record_written_without_its_input_still_works(
    daemon: RunningDaemon, ledger_stub: Ledger
) -> None:
    """An UNKNOWN call stored without its input (by an older daemon) is
    shown without one, reconciled, and answered as before."""
    ledger_stub.PrepareTool(
        prepare_request("run", "call", json=SENT, start=True), timeout=5
    )
    ledger_stub.ReportUnknown(
        pb.ReportUnknownRequest(ref=ref(), attempt=1, reason="lost"), timeout=5
    )
    _forget_kept_input(daemon, "call")
    lost = _get(ledger_stub)
    assert not lost.HasField("kept_input")
    again = ledger_stub.PrepareTool(prepare_request("run", "call", json=SENT))
    assert again.decision == pb.DECISION_RECONCILE
    done = _found(ledger_stub, lost.revision)
    assert done.state == pb.CALL_STATE_COMMITTED
    replay = ledger_stub.PrepareTool(prepare_request("run", "call", json=SENT))
    assert replay.decision == pb.DECISION_RETURN_RESULT


@contextmanager
def _daemon(config: ServeConfig, clock: ManualClock) -> Iterator[grpc.Channel]:
    with (
        running_daemon(config, clock) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        yield channel


def test_the_policy_keeps_settled_inputs_within_its_cap(
    config: ServeConfig, clock: ManualClock, tmp_path: Path
) -> None:
    """With `inputs.keep_all`, a committed (and acknowledged) call keeps an
    input of at most `inputs.max_bytes`; a bigger one, kept while the call
    was open, keeps only its fingerprint once committed."""
    policy = tmp_path / "policy.toml"
    policy.write_text("[inputs]\nkeep_all = true\nmax_bytes = 40\n")
    big = json.dumps({"text": "x" * 64})
    with _daemon(dataclasses.replace(config, policy_file=policy), clock) as channel:
        ledger = Ledger(channel)
        for call_id, text in [("small", SENT), ("big", big)]:
            ledger.PrepareTool(
                prepare_request("run", call_id, json=text, start=True), timeout=5
            )
            assert _get(ledger, call_id).kept_input.json == text
            ledger.CommitTool(
                pb.CommitToolRequest(
                    ref=ref("run", call_id),
                    attempt=1,
                    result=pb.ToolResult(
                        outcome=pb.OUTCOME_OK, payload=pb.Payload(json="1")
                    ),
                    acknowledge=True,
                ),
                timeout=5,
            )
        small = _get(ledger, "small")
        assert (small.state, small.acknowledged) == (pb.CALL_STATE_COMMITTED, True)
        assert small.kept_input.json == SENT
        assert not _get(ledger, "big").HasField("kept_input")


def test_the_kept_input_counts_in_the_stored_bytes(
    config: ServeConfig, clock: ManualClock
) -> None:
    """A call's 4 KiB input counts in its namespace's bytes while the call
    is open (and is refused past the quota); settling it gives the bytes
    back."""
    text = json.dumps({"body": "y" * 4096})
    with _daemon(config, clock) as channel:
        ledger = Ledger(channel)
        empty = _stored_bytes(channel)
        ledger.PrepareTool(prepare_request("run", "small", json=SENT), timeout=5)
        small = _stored_bytes(channel) - empty
        ledger.PrepareTool(
            prepare_request("run", "big", json=text, start=True), timeout=5
        )
        big = _stored_bytes(channel) - empty - small
        assert big - small >= 4096
        before = _stored_bytes(channel)
        _commit(ledger, "big", 1)
        assert before - _stored_bytes(channel) >= 4096
    tight = dataclasses.replace(
        config,
        data_dir=config.data_dir.with_name("tight"),
        quotas=Quotas(stored_bytes=2048),
    )
    with _daemon(tight, clock) as channel:
        ledger = Ledger(channel)
        ledger.PrepareTool(
            prepare_request("run", "small", namespace="tight", json=SENT), timeout=5
        )
        expect_refusal(
            lambda: ledger.PrepareTool(
                prepare_request("run", "big", namespace="tight", json=text),
                timeout=5,
            ),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "QUOTA_EXCEEDED",
        )


# --- the approval is bound to the fingerprint, not to the text shown --------

SHOWN = '{"to": "mallory", "amount": 5000}'


def _replace_kept_input(daemon: RunningDaemon, text: str) -> None:
    """What the approver is shown no longer matches the input (a corrupted
    or tampered copy): stored directly, as no request can do it."""

    def apply(view: WriteView) -> None:
        old = records.load_call(view, CallRef("default", "run", "call"))
        assert old is not None
        new = dataclasses.replace(
            old, kept_input=Payload(PayloadKind.JSON, text.encode())
        )
        records.save_call(view, old, new)

    store = daemon.daemon._store
    assert store is not None
    store.submit(apply).result(timeout=10)


def binding_violations(daemon: RunningDaemon, ledger: Ledger) -> list[str]:
    """Ways in which an approval followed the shown text instead of the
    fingerprint of the input the agent sent."""
    ledger.PrepareTool(
        prepare_request("run", "call", json=SENT, require_approval=True), timeout=5
    )
    _replace_kept_input(daemon, SHOWN)
    waiting = _get(ledger)
    shown = waiting.kept_input.json
    found = []
    if shown != SHOWN:
        found.append("the tampered copy was not the one shown")
    shown_fp = fingerprint.fingerprint(Payload(PayloadKind.JSON, shown.encode()))
    try:
        _decide(ledger, waiting, approve=True, fp=shown_fp)
        found.append("approved with the fingerprint of the shown text")
    except grpc.RpcError as exc:
        if exc.code() is not grpc.StatusCode.FAILED_PRECONDITION:
            found.append(f"refused with {exc.code()}")
    if _get(ledger).state != pb.CALL_STATE_AWAITING_APPROVAL:
        return [*found, "the call left AWAITING_APPROVAL"]
    # The approval of the fingerprint applies to the input the agent sent.
    _decide(ledger, _get(ledger), approve=True)
    again = ledger.PrepareTool(
        prepare_request("run", "call", json=SENT, require_approval=True, start=True),
        timeout=5,
    )
    if not again.attempt_held:
        found.append("the agent's own input was not approved")
    return found


def test_the_approval_is_bound_to_the_fingerprint_not_to_the_shown_text(
    daemon: RunningDaemon, ledger_stub: Ledger
) -> None:
    """An approval sent with the fingerprint of the text shown is refused when
    that text is not the input; the fingerprint's approval lets the agent's
    own input run. (Issue 10 item 29: showing the input must not loosen the
    binding; the negative control below is the loosened variant.)"""
    assert binding_violations(daemon, ledger_stub) == []


def test_negative_control_an_approval_bound_to_the_shown_text_is_caught(
    daemon: RunningDaemon, ledger_stub: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broken on purpose: the daemon accepts the fingerprint of its kept copy
    as the call's; the check above must catch it."""
    real: Callable[[ToolCall, Now, ApprovalDecision, Policy | None], Step] = (
        operator_rules.decide_approval
    )

    def trusts_the_copy(
        call: ToolCall, now: Now, decision: ApprovalDecision, policy: Policy | None
    ) -> Step:
        if call.kept_input is not None and decision.input_fingerprint == (
            fingerprint.fingerprint(call.kept_input)
        ):
            decision = dataclasses.replace(
                decision, input_fingerprint=call.input_fingerprint
            )
        return real(call, now, decision, policy)

    monkeypatch.setattr(operator_rules, "decide_approval", trusts_the_copy)
    assert "approved with the fingerprint of the shown text" in binding_violations(
        daemon, ledger_stub
    )


def test_a_call_made_to_await_approval_by_a_repeat_keeps_its_input(
    daemon: RunningDaemon, ledger_stub: Ledger
) -> None:
    """A call prepared without approval and stored without its input (by a
    daemon from before every input was kept), then required to wait for an
    approval by a repeat prepare, keeps the repeat's input as sent, so that
    the approver sees what they approve. Fails before the fix: only a call
    created awaiting approval kept its input (found by the model-based
    torture test, issue 15)."""
    ledger_stub.PrepareTool(prepare_request(json=SENT), timeout=5)
    _forget_kept_input(daemon, "call")
    assert not _get(ledger_stub).HasField("kept_input")
    again = ledger_stub.PrepareTool(
        prepare_request(json=SENT, require_approval=True), timeout=5
    )
    assert again.decision == pb.DECISION_AWAIT_APPROVAL
    assert again.call.kept_input.json == SENT
    assert _get(ledger_stub).kept_input.json == SENT
