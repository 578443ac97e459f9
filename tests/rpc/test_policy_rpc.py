"""Policy reload through the real server (ADR-010 R2, contract §7.3, §10.6): the
Admin RPC ReloadPolicy puts a policy file in force for the next decision
without a restart, writes the change to the audit log, and refuses a
malformed file while the old policy stays in force."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from effectd.v1 import admin_pb2 as apb
from effectd.v1 import (
    admin_pb2_grpc,
    ledger_pb2_grpc,
    recovery_pb2,
    recovery_pb2_grpc,
)
from effectd.v1 import ledger_pb2 as pb

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.testing import RunningDaemon, running_daemon
from tests.rpc.support import expect_refusal, prepare_request, ref, refused

Ledger = ledger_pb2_grpc.ToolLedgerStub
Admin = admin_pb2_grpc.AdminStub
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
TOOL = "search"
FORCED = f'[tools.{TOOL}]\neffect = "side-effect"\n'


@pytest.fixture
def policy_path(short_tmp: Path) -> Path:
    path = short_tmp / "policy.toml"
    path.write_text("[retry]\nmax_attempts = 5\n")
    return path


@pytest.fixture
def policy_daemon(
    short_tmp: Path, policy_path: Path, clock: ManualClock
) -> Iterator[RunningDaemon]:
    config = ServeConfig(data_dir=short_tmp / "data", policy_file=policy_path)
    with running_daemon(config, clock) as running:
        yield running


@pytest.fixture
def stubs(policy_daemon: RunningDaemon) -> Iterator[tuple[Ledger, Admin]]:
    with grpc.insecure_channel(policy_daemon.target) as channel:
        yield Ledger(channel), Admin(channel)


def _reload(admin: Admin, reason: str = "") -> apb.ReloadPolicyResponse:
    return admin.ReloadPolicy(apb.ReloadPolicyRequest(reason=reason), timeout=10)


def _unknown_read(ledger: Ledger, call_id: str) -> pb.ToolCall:
    """A READ call of TOOL whose attempt reported an unknown outcome."""
    answer = ledger.PrepareTool(
        prepare_request(
            "run", call_id, tool_name=TOOL, effect=pb.EFFECT_READ, start=True
        ),
        timeout=5,
    )
    done = ledger.ReportUnknown(
        pb.ReportUnknownRequest(
            ref=ref("run", call_id), attempt=answer.call.attempt, reason="timeout"
        ),
        timeout=5,
    )
    assert done.call.state == pb.CALL_STATE_UNKNOWN
    return done.call


def _retry(ledger: Ledger, call_id: str) -> pb.StartToolResponse:
    return ledger.StartTool(
        pb.StartToolRequest(ref=ref("run", call_id), retry=True), timeout=5
    )


def _decision(ledger: Ledger, call_id: str) -> int:
    again = prepare_request("run", call_id, tool_name=TOOL, effect=pb.EFFECT_READ)
    return ledger.PrepareTool(again, timeout=5).decision


def test_forcing_a_tool_to_side_effect_decides_the_next_call(
    stubs: tuple[Ledger, Admin], policy_path: Path
) -> None:
    """ADR-010 R2: before the reload an unknown READ may be retried; after
    forcing its tool to SIDE_EFFECT in the file and reloading, the same kind
    of call answers RECONCILE and its retry RECONCILIATION_REQUIRED."""
    ledger, admin = stubs
    _unknown_read(ledger, "before")
    _unknown_read(ledger, "after")
    assert _decision(ledger, "before") == pb.DECISION_EXECUTE
    assert _retry(ledger, "before").decision == pb.DECISION_EXECUTE

    policy_path.write_text(FORCED)
    answer = _reload(admin, "duplicate payment found")
    assert list(answer.policy.forced_side_effect_tools) == [TOOL]
    assert "tools.search.effect" in answer.changed

    assert _decision(ledger, "after") == pb.DECISION_RECONCILE
    expect_refusal(
        lambda: _retry(ledger, "after"), PRECONDITION, "RECONCILIATION_REQUIRED"
    )


def test_taking_the_override_out_does_not_reopen_its_calls(
    stubs: tuple[Ledger, Admin], policy_path: Path
) -> None:
    """ADR-010 R2 is sticky: an unknown READ answered RECONCILE while its tool
    was forced to SIDE_EFFECT still answers RECONCILE, and its retry is still
    refused, after the override is taken out of the file and reloaded; the
    record shows the forced effect (issue 10 item 10: fails before the fix:
    EXECUTE, and StartTool(retry) started attempt 2)."""
    ledger, admin = stubs
    _unknown_read(ledger, "call")
    policy_path.write_text(FORCED)
    _reload(admin, "duplicate found")
    assert _decision(ledger, "call") == pb.DECISION_RECONCILE
    policy_path.write_text("[retry]\nmax_attempts = 5\n")
    assert "tools.search.effect" in _reload(admin, "override removed").changed
    assert _decision(ledger, "call") == pb.DECISION_RECONCILE
    got = expect_refusal(
        lambda: _retry(ledger, "call"), PRECONDITION, "RECONCILIATION_REQUIRED"
    )
    assert got.metadata["attempt"] == "1"
    call = ledger.GetToolCall(pb.GetToolCallRequest(ref=ref("run", "call"))).call
    assert (call.effect, call.forced_effect) == (pb.EFFECT_READ, pb.EFFECT_SIDE_EFFECT)
    assert "force_side_effect" in [t.event for t in call.history]


def test_a_recovery_plan_made_under_the_override_holds_the_call(
    stubs: tuple[Ledger, Admin], policy_path: Path, policy_daemon: RunningDaemon
) -> None:
    """Recover under the override plans RECONCILE for the unknown READ and
    records the forced effect: after the override is taken out, the plan and
    the ledger still hold it (issue 10 item 10: fails before the fix:
    RETRY_NEEDS_POLICY, and the retry started)."""
    ledger, admin = stubs
    _unknown_read(ledger, "call")
    policy_path.write_text(FORCED)
    _reload(admin)
    with grpc.insecure_channel(policy_daemon.target) as channel:
        recover = recovery_pb2_grpc.RecoveryStub(channel).Recover
        request = recovery_pb2.RecoverRequest(run_id="run")
        [item] = recover(request, timeout=5).items
        assert item.action == recovery_pb2.RECOVERY_ACTION_RECONCILE
        policy_path.write_text("[retry]\nmax_attempts = 5\n")
        _reload(admin)
        [item] = recover(request, timeout=5).items
        assert item.action == recovery_pb2.RECOVERY_ACTION_RECONCILE
    expect_refusal(
        lambda: _retry(ledger, "call"), PRECONDITION, "RECONCILIATION_REQUIRED"
    )


def test_enter_reconciliation_puts_the_tools_open_calls_in_reconciliation(
    stubs: tuple[Ledger, Admin],
) -> None:
    """Admin.EnterReconciliation makes every open call of the tool a
    SIDE_EFFECT for good, audited, with no override in the policy: its
    unknown READ answers RECONCILE and is never retried; a second run changes
    nothing (issue 10 item 10: fails before the fix: no such action)."""
    ledger, admin = stubs
    _unknown_read(ledger, "a")
    _unknown_read(ledger, "b")
    request = apb.EnterReconciliationRequest(
        tool_name=TOOL, reason="duplicate charge found", operator="olga"
    )
    done = admin.EnterReconciliation(request, timeout=10)
    assert (done.unknown, done.started, done.already_side_effect) == (2, 0, 0)
    assert done.last_audit_sequence == done.first_audit_sequence + 1
    assert _decision(ledger, "a") == pb.DECISION_RECONCILE
    expect_refusal(lambda: _retry(ledger, "b"), PRECONDITION, "RECONCILIATION_REQUIRED")
    entries = admin.ListAudit(apb.ListAuditRequest(), timeout=5).entries
    assert [e.action for e in entries] == [apb.AUDIT_ACTION_ENTER_RECONCILIATION] * 2
    assert {e.actor for e in entries} == {"olga"}
    assert entries[0].details["tool"] == TOOL
    assert admin.VerifyAudit(apb.VerifyAuditRequest(), timeout=5).ok
    again = admin.EnterReconciliation(request, timeout=10)
    assert (again.unknown, again.already_side_effect) == (0, 2)


def test_enter_reconciliation_refuses_bad_input_by_field(
    stubs: tuple[Ledger, Admin],
) -> None:
    """No tool and no reason: INVALID_ARGUMENT naming both fields."""
    _, admin = stubs
    got = refused(
        lambda: admin.EnterReconciliation(apb.EnterReconciliationRequest(), timeout=5)
    )
    assert got.code is grpc.StatusCode.INVALID_ARGUMENT
    assert set(got.fields or ()) == {"tool_name", "reason", "operator"}


def test_the_kill_switch_stops_a_read_retry(
    stubs: tuple[Ledger, Admin], policy_path: Path
) -> None:
    """ADR-010 R2: retry_safe = false turns off the retry of an unknown READ
    at once (RETRY_DISABLED); turning it on again allows it."""
    ledger, admin = stubs
    _unknown_read(ledger, "call")
    policy_path.write_text("[retry]\nretry_safe = false\n")
    answer = _reload(admin)
    assert answer.policy.retry_safe is False
    assert answer.previous.retry_safe is True
    assert "retry.retry_safe" in answer.changed
    expect_refusal(lambda: _retry(ledger, "call"), PRECONDITION, "RETRY_DISABLED")

    policy_path.write_text("[retry]\nretry_safe = true\n")
    _reload(admin)
    assert _retry(ledger, "call").decision == pb.DECISION_EXECUTE


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[retry]\nmax_attempts = 0\n", "retry.max_attempts"),
        ("[retry]\nretry_safe = 1\n", "retry.retry_safe"),
        ('[tools.search]\neffect = "read"\n', "tools.search.effect"),
        ("[retry\n", "not valid TOML"),
        ("[retries]\n", "retries: unknown section"),
    ],
)
def test_a_malformed_file_is_refused_and_the_old_policy_stays(
    stubs: tuple[Ledger, Admin], policy_path: Path, text: str, named: str
) -> None:
    """A file that does not validate is POLICY_INVALID with a message naming
    the setting; the forced effect of the policy in force still decides, and
    no audit entry is written."""
    ledger, admin = stubs
    policy_path.write_text(FORCED)
    good = _reload(admin)
    _unknown_read(ledger, "call")

    policy_path.write_text(text)
    got = expect_refusal(lambda: _reload(admin), PRECONDITION, "POLICY_INVALID")
    assert named in got.message
    assert "stays" in got.message
    assert got.metadata["file"] == str(policy_path)

    assert _decision(ledger, "call") == pb.DECISION_RECONCILE
    expect_refusal(
        lambda: _retry(ledger, "call"), PRECONDITION, "RECONCILIATION_REQUIRED"
    )
    entries = admin.ListAudit(apb.ListAuditRequest(), timeout=5).entries
    assert [e.sequence for e in entries] == [good.audit_sequence]


def test_a_missing_file_is_refused(
    stubs: tuple[Ledger, Admin], policy_path: Path
) -> None:
    """A policy file that disappeared is POLICY_INVALID naming the file."""
    _, admin = stubs
    policy_path.unlink()
    got = expect_refusal(lambda: _reload(admin), PRECONDITION, "POLICY_INVALID")
    assert "cannot be read" in got.message


def test_the_reload_is_in_the_audit_log(
    stubs: tuple[Ledger, Admin], policy_path: Path
) -> None:
    """contract §10.5: the reload is an audit entry of the operator, with its
    reason, the file, and both policies whole as canonical JSON; the chain
    still verifies."""
    _, admin = stubs
    policy_path.write_text(FORCED + "[retry]\nretry_safe = false\n")
    answer = _reload(admin, "incident 42")
    [entry] = admin.ListAudit(apb.ListAuditRequest(), timeout=5).entries
    assert entry.sequence == answer.audit_sequence == 1
    assert entry.action == apb.AUDIT_ACTION_POLICY_RELOAD
    assert (entry.actor, entry.reason) == ("operator", "incident 42")
    assert entry.details["file"] == str(policy_path)
    old = json.loads(entry.details["old"])
    new = json.loads(entry.details["new"])
    assert (old["retry_safe"], old["max_attempts"], old["effect_overrides"]) == (
        True,
        5,
        {},
    )
    assert (new["retry_safe"], new["max_attempts"]) == (False, 3)
    assert new["effect_overrides"] == {TOOL: "side-effect"}
    assert entry.details["changed"].split(",") == list(answer.changed)
    assert set(answer.changed) == {
        "retry.retry_safe",
        "retry.max_attempts",
        "tools.search.effect",
    }
    verdict = admin.VerifyAudit(apb.VerifyAuditRequest(), timeout=5)
    assert (verdict.ok, verdict.entries_checked) == (True, 1)


def test_the_answer_reports_the_policy_in_force(
    stubs: tuple[Ledger, Admin], policy_path: Path
) -> None:
    """ReloadPolicy answers every setting of the policy now in force and the
    one it replaced; an unchanged file reloads with nothing changed."""
    _, admin = stubs
    policy_path.write_text(
        "[retry]\nmax_attempts = 2\n[leases]\ndefault_ms = 1500\n"
        "[retention]\ndays = 3\n[reconcile]\nquarantine_leases = 7\n"
        + FORCED
        + '[tools.pay]\neffect = "side-effect"\n'
        + "[tools.crm]\nidempotency_proven = true\n"
    )
    answer = _reload(admin)
    assert answer.policy == apb.PolicySummary(
        retry_safe=True,
        max_attempts=2,
        default_lease_ms=1500,
        retention_seconds=3 * 86_400,
        forced_side_effect_tools=["pay", TOOL],
        unacknowledged_retention_seconds=30 * 86_400,
        tombstone_seconds=30 * 86_400,
        reconcile_quarantine_leases=7,
        proven_idempotent_tools=["crm"],
        keep_inputs=False,
        max_kept_input_bytes=64 << 10,
    )
    assert answer.previous.max_attempts == 5
    assert answer.file == str(policy_path)
    again = _reload(admin)
    assert list(again.changed) == []
    assert again.policy == again.previous == answer.policy
    assert again.audit_sequence == answer.audit_sequence + 1


def test_a_reloaded_lease_default_applies_to_the_next_start(
    stubs: tuple[Ledger, Admin], policy_path: Path
) -> None:
    """The whole policy decides the next request: a new default lease is the
    lease of the next attempt that asks for none."""
    ledger, admin = stubs
    policy_path.write_text("[leases]\ndefault_ms = 1234\n")
    _reload(admin)
    answer = ledger.PrepareTool(prepare_request("run", "leased", start=True), timeout=5)
    lease = (
        answer.call.lease_expires_at.ToNanoseconds()
        - answer.call.updated_at.ToNanoseconds()
    )
    assert lease == 1234 * 1_000_000


def test_without_a_policy_file_a_reload_is_refused(channel: grpc.Channel) -> None:
    """A daemon started without --policy answers NO_POLICY_FILE."""
    got = expect_refusal(
        lambda: _reload(Admin(channel)), PRECONDITION, "NO_POLICY_FILE"
    )
    assert "--policy" in got.message


def test_a_bad_reason_is_invalid_argument(stubs: tuple[Ledger, Admin]) -> None:
    """The reason is free text with the usual bounds: a control character is
    INVALID_ARGUMENT naming the field."""
    _, admin = stubs
    got = expect_refusal(
        lambda: _reload(admin, "bad\x00reason"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
    )
    assert got.fields == ("reason",)
