"""The approver's and operator's rules (contract §4.5, §4.6): approve, reject,
reconcile.

Every case is a record reached through the rules themselves and one call of
`operator_rules`, for every state and every effect; refusals must leave the
record exactly as it was (the same object), because the service then writes
nothing and audits nothing.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import pytest

from sidecar.errors import (
    InputMismatch,
    InvalidTransition,
    ReconcileQuarantine,
    RevisionConflict,
    StaleAttempt,
)
from sidecar.ledger import operator_rules, rules
from sidecar.ledger.fingerprint import fingerprint
from sidecar.ledger.model import (
    APPROVAL_REJECTED,
    Approval,
    Decision,
    Effect,
    Event,
    Outcome,
    Reconciliation,
    Resolution,
    State,
    ToolCall,
)
from sidecar.ledger.operator_rules import ApprovalDecision, ReconcileOrder
from sidecar.ledger.policy import Policy
from sidecar.ledger.rules import Answer, Now, Step
from sidecar.storage import records
from tests.ledger.builders import (
    INCARNATION,
    INPUT,
    LEASE_MS,
    LEASE_NS,
    MAX_ATTEMPTS,
    OTHER_INPUT,
    answer,
    awaiting,
    committed,
    later,
    moment,
    ok_result,
    prepared,
    refusal,
    rejected,
    spec,
    started,
    unknown,
)

EFFECTS = list(Effect)
FP = fingerprint(INPUT)
NOW = moment()
AFTER = later(NOW, 1_000_000_000)


def _approved(effect: Effect) -> ToolCall:
    return operator_rules.decide_approval(awaiting(effect), NOW, _decision(1)).call


def _restarted(effect: Effect) -> ToolCall:
    """STARTED under an earlier daemon incarnation: its lease is never live."""
    return started(effect, moment(incarnation=INCARNATION - 1))


# Every state a record can be in, as the rules reach it.
BUILDERS: dict[str, Callable[[Effect], ToolCall]] = {
    "prepared": prepared,
    "awaiting": awaiting,
    "approved": _approved,
    "started": started,
    "started_earlier_incarnation": _restarted,
    "unknown": unknown,
    "committed": committed,
    "rejected": rejected,
}


def _decision(
    revision: int, *, approve: bool = True, fp: str = FP, approver: str = "alice"
) -> ApprovalDecision:
    return ApprovalDecision(
        approve=approve,
        approver=approver,
        reason="looks right",
        expected_revision=revision,
        input_fingerprint=fp,
    )


def _order(
    revision: int, *, found: bool, operator: str = "olga", dead: int = 0
) -> ReconcileOrder:
    """`dead`: the operator confirms that this attempt is dead."""
    return ReconcileOrder(
        expected_revision=revision,
        result=ok_result(b'{"charged": true}') if found else None,
        operator=operator,
        reason="checked the payment provider",
        evidence="provider txn 42 " + ("exists" if found else "absent"),
        confirmed_dead_attempt=dead,
    )


def _approve(call: ToolCall, approve: bool = True) -> Step:
    return operator_rules.decide_approval(
        call, AFTER, _decision(call.revision, approve=approve)
    )


# -- approve and reject, every state x effect ----------------------------------

# state -> what approve / reject lead to; None: refused INVALID_TRANSITION.
APPROVAL_TABLE: list[tuple[str, State | None, State | None]] = [
    ("awaiting", State.PREPARED, State.COMMITTED),  # ADR-010 D3 approve / reject
    ("prepared", None, None),  # contract §4.5: only AWAITING_APPROVAL is decided
    ("approved", None, None),  # contract §4.5: an approval is given once
    ("started", None, None),  # contract §4.5
    ("started_earlier_incarnation", None, None),  # contract §4.5
    ("unknown", None, None),  # contract §4.5
    ("committed", None, None),  # ADR-010 D1: committed stays committed
    ("rejected", None, None),  # ADR-010 D3: a rejection is final
]


@pytest.mark.parametrize("effect", EFFECTS)
@pytest.mark.parametrize(("state", "approve_to", "reject_to"), APPROVAL_TABLE)
@pytest.mark.parametrize("approve", [True, False])
def test_approval_table(
    effect: Effect,
    state: str,
    approve_to: State | None,
    reject_to: State | None,
    approve: bool,
) -> None:
    """An approver's decision moves only AWAITING_APPROVAL, whatever the effect;
    in any other state it is INVALID_TRANSITION and the record is untouched."""
    call = BUILDERS[state](effect)
    step = _approve(call, approve)
    expected = approve_to if approve else reject_to
    if expected is None:
        refusal(step, InvalidTransition)
        assert step.call is call
        return
    got = answer(step)
    assert step.call.state is expected
    assert step.call.revision == call.revision + 1
    assert got.decision is (Decision.EXECUTE if approve else Decision.REJECTED)


@pytest.mark.parametrize("effect", EFFECTS)
def test_approve_binds_the_approval_to_what_was_seen(effect: Effect) -> None:
    """Approve stores who, when, why, the fingerprint and the revision it was
    given for, and records the transition by the approver (contract §4.5)."""
    call = awaiting(effect)
    step = _approve(call)
    assert step.call.approval == Approval(
        approved=True,
        approver="alice",
        reason="looks right",
        at_ns=AFTER.wall_ns,
        input_fingerprint=FP,
        revision=call.revision,
    )
    last = step.call.history[-1]
    assert (last.event, last.actor, last.reason) == (
        Event.APPROVE,
        "alice",
        "looks right",
    )
    assert (last.from_state, last.to_state) == (State.AWAITING_APPROVAL, State.PREPARED)
    assert step.call.result is None
    assert step.call.attempt == 0


@pytest.mark.parametrize("effect", EFFECTS)
def test_reject_commits_the_error_result(effect: Effect) -> None:
    """Reject commits an ERROR result with APPROVAL_REJECTED, which the agent
    gets as decision REJECTED (ADR-010 D3)."""
    step = _approve(awaiting(effect), approve=False)
    call = step.call
    assert call.rejected
    assert call.result is not None
    assert (call.result.outcome, call.result.error_code) == (
        Outcome.ERROR,
        APPROVAL_REJECTED,
    )
    assert "alice" in call.result.error_message
    assert call.result.digest.startswith("sha256:")
    assert call.approval is not None
    assert not call.approval.approved
    assert rules.decide(call) is Decision.REJECTED


@pytest.mark.parametrize("effect", EFFECTS)
@pytest.mark.parametrize("seen", [0, 2, 9])
def test_approval_at_another_revision_is_refused(effect: Effect, seen: int) -> None:
    """An approval given for another revision is REVISION_CONFLICT carrying
    the current revision, and changes nothing (contract §4.5: bound to the revision)."""
    call = awaiting(effect)
    step = operator_rules.decide_approval(call, AFTER, _decision(seen))
    error = refusal(step, RevisionConflict)
    assert error.current_revision == call.revision == 1
    assert step.call is call


@pytest.mark.parametrize("effect", EFFECTS)
@pytest.mark.parametrize("approve", [True, False])
def test_approval_of_another_input_is_refused(effect: Effect, approve: bool) -> None:
    """An approval given for another input fingerprint is INPUT_MISMATCH, and
    changes nothing (contract §4.5: bound to the input fingerprint)."""
    call = awaiting(effect)
    other = fingerprint(OTHER_INPUT)
    step = operator_rules.decide_approval(
        call, AFTER, _decision(1, approve=approve, fp=other)
    )
    error = refusal(step, InputMismatch)
    assert error.metadata["inputFingerprint"] == FP
    assert step.call is call


@pytest.mark.parametrize("effect", EFFECTS)
def test_other_input_after_approval_is_refused(effect: Effect) -> None:
    """After approval, a prepare with other input is INPUT_MISMATCH and the
    approved record stays as it was; the same input answers EXECUTE (contract §3.3)."""
    approved = _approved(effect)
    other = rules.prepare(
        approved, spec(effect, payload=OTHER_INPUT, require_approval=True), AFTER
    )
    refusal(other, InputMismatch)
    assert other.call is approved
    same = rules.prepare(approved, spec(effect, require_approval=True), AFTER)
    assert answer(same).decision is Decision.EXECUTE


@pytest.mark.parametrize("effect", EFFECTS)
def test_an_approved_call_starts_once(effect: Effect) -> None:
    """Approve leads to PREPARED; the next start is attempt 1 (contract §4.5)."""
    step = rules.start(
        _approved(effect),
        AFTER,
        lease_ms=LEASE_MS,
        retry=False,
        policy=Policy(max_attempts=MAX_ATTEMPTS),
        expected_revision=None,
    )
    assert answer(step).decision is Decision.EXECUTE
    assert (step.call.state, step.call.attempt) == (State.STARTED, 1)


# -- reconcile, every state x effect x resolution --------------------------------

# (state, found the result?) -> state after; None: refused INVALID_TRANSITION.
RECONCILE_TABLE: list[tuple[str, bool, State | None]] = [
    ("unknown", True, State.COMMITTED),  # contract §4.6 reconcile: result found
    ("unknown", False, State.PREPARED),  # contract §4.6 reconcile: never executed
    ("started", True, State.COMMITTED),  # contract §4.6: STARTED can be reconciled
    # ADR-010 D1: a live attempt may still execute; "never ran" is unverifiable.
    ("started", False, None),
    ("started_earlier_incarnation", True, State.COMMITTED),  # ADR-010 D3
    ("started_earlier_incarnation", False, State.PREPARED),  # ADR-010 D3
    ("prepared", True, None),  # contract §4.6: nothing to reconcile
    ("prepared", False, None),  # contract §4.6
    ("awaiting", True, None),  # contract §4.6: approvals decide it
    ("awaiting", False, None),  # contract §4.6
    ("approved", True, None),  # contract §4.6
    ("committed", True, None),  # ADR-010 D1: a committed result stands
    ("committed", False, None),  # ADR-010 D1
    ("rejected", False, None),  # ADR-010 D3
]


@pytest.mark.parametrize("effect", EFFECTS)
@pytest.mark.parametrize(("state", "found", "to"), RECONCILE_TABLE)
def test_reconcile_table(
    effect: Effect, state: str, found: bool, to: State | None
) -> None:
    """Reconcile resolves only STARTED or UNKNOWN, for every effect; any other
    state is INVALID_TRANSITION and the record is untouched."""
    call = BUILDERS[state](effect)
    order = _order(call.revision, found=found, dead=call.attempt)
    step = operator_rules.reconcile(call, AFTER, order)
    if to is None:
        refusal(step, InvalidTransition)
        assert step.call is call
        return
    got = answer(step)
    assert step.call.state is to
    assert step.call.lease is None
    assert step.call.attempt == call.attempt
    expected = Decision.RETURN_RESULT if found else Decision.EXECUTE
    assert got.decision is expected
    last = step.call.history[-1]
    assert last.event is (
        Event.RECONCILE_COMMITTED if found else Event.RECONCILE_NOT_EXECUTED
    )
    assert (last.actor, last.to_state) == ("olga", to)


@pytest.mark.parametrize("effect", EFFECTS)
@pytest.mark.parametrize("found", [True, False])
def test_reconcile_keeps_the_evidence(effect: Effect, found: bool) -> None:
    """The reconciliation, with its evidence, the state and the revision it
    resolved, is kept on the record (ADR-010 R3)."""
    call = unknown(effect)
    order = _order(call.revision, found=found, dead=1)
    step = operator_rules.reconcile(call, AFTER, order)
    assert step.call.reconciliations == (
        Reconciliation(
            resolution=Resolution.COMMITTED if found else Resolution.NOT_EXECUTED,
            operator="olga",
            reason=order.reason,
            evidence=order.evidence,
            at_ns=AFTER.wall_ns,
            from_state=State.UNKNOWN,
            revision=call.revision,
            attempt=1,
        ),
    )
    assert step.call.result == (order.result if found else None)


@pytest.mark.parametrize("effect", EFFECTS)
@pytest.mark.parametrize("found", [True, False])
@pytest.mark.parametrize("delta", [-1, 1])
def test_reconcile_at_another_revision_is_refused(
    effect: Effect, found: bool, delta: int
) -> None:
    """Reconcile is compare-and-swap: another revision than the record's is
    REVISION_CONFLICT with the current revision, and nothing changes."""
    call = unknown(effect)
    step = operator_rules.reconcile(
        call, AFTER, _order(call.revision + delta, found=found)
    )
    assert refusal(step, RevisionConflict).current_revision == call.revision
    assert step.call is call


@pytest.mark.parametrize("effect", EFFECTS)
def test_two_operators_cannot_both_resolve(effect: Effect) -> None:
    """The second of two reconciliations at the same revision is refused
    (contract §4.6: applied by CAS)."""
    call = unknown(effect)
    first = operator_rules.reconcile(call, AFTER, _order(call.revision, found=True))
    second = operator_rules.reconcile(
        first.call, AFTER, _order(call.revision, found=False, operator="oscar")
    )
    refusal(second, RevisionConflict)
    assert second.call is first.call
    assert len(first.call.reconciliations) == 1


@pytest.mark.parametrize("effect", EFFECTS)
def test_an_expired_lease_is_settled_before_reconcile(effect: Effect) -> None:
    """A STARTED call whose lease ran out is resolved at the revision the
    operator saw; its history shows the expiry, then the reconciliation."""
    call = started(effect)
    expired = later(NOW, LEASE_NS)
    order = _order(call.revision, found=False, dead=1)
    step = operator_rules.reconcile(call, expired, order)
    assert step.call.state is State.PREPARED
    assert [t.event for t in step.call.history[-2:]] == [
        Event.EXPIRE,
        Event.RECONCILE_NOT_EXECUTED,
    ]
    assert step.call.revision == call.revision + 2
    assert step.call.reconciliations[0].from_state is State.STARTED


@pytest.mark.parametrize("effect", EFFECTS)
def test_not_executed_then_start_is_the_next_attempt(effect: Effect) -> None:
    """After "never executed", a new start is attempt + 1 with the same
    idempotency key (ADR-010 D2, R4)."""
    call = unknown(effect)
    resolved = operator_rules.reconcile(
        call, AFTER, _order(call.revision, found=False, dead=1)
    ).call
    step = rules.start(
        resolved,
        AFTER,
        lease_ms=LEASE_MS,
        retry=False,
        policy=Policy(max_attempts=MAX_ATTEMPTS),
        expected_revision=resolved.revision,
    )
    assert answer(step).decision is Decision.EXECUTE
    assert step.call.attempt == call.attempt + 1 == 2
    assert step.call.idempotency_key == call.idempotency_key == "run-1:call-1"


@pytest.mark.parametrize("effect", EFFECTS)
def test_reconciliations_accumulate(effect: Effect) -> None:
    """A call reconciled twice keeps both reconciliations, oldest first."""
    now: Now = AFTER
    call = unknown(effect)
    order = _order(call.revision, found=False, dead=1)
    call = operator_rules.reconcile(call, now, order).call
    call = rules.start(
        call,
        now,
        lease_ms=LEASE_MS,
        retry=False,
        policy=Policy(max_attempts=MAX_ATTEMPTS),
        expected_revision=None,
    ).call
    call = rules.report_unknown(call, now, attempt=2, reason="timeout").call
    call = operator_rules.reconcile(call, now, _order(call.revision, found=True)).call
    assert [r.resolution for r in call.reconciliations] == [
        Resolution.NOT_EXECUTED,
        Resolution.COMMITTED,
    ]
    assert [r.attempt for r in call.reconciliations] == [1, 2]
    assert call.state is State.COMMITTED


def test_rejection_result_is_deterministic() -> None:
    """The rejection's error result, and so its digest, depends only on the
    approver and the reason."""
    a = operator_rules.rejection_result("alice", "no")
    assert a == operator_rules.rejection_result("alice", "no")
    assert a.digest != operator_rules.rejection_result("bob", "no").digest


# -- the stored form ---------------------------------------------------------------


@pytest.mark.parametrize("found", [True, False])
def test_approval_and_reconciliations_are_stored(found: bool) -> None:
    """A record with an approval and reconciliations reads back equal."""
    call = _approved(Effect.SIDE_EFFECT)
    call = rules.start(
        call,
        AFTER,
        lease_ms=LEASE_MS,
        retry=False,
        policy=Policy(max_attempts=MAX_ATTEMPTS),
        expected_revision=None,
    ).call
    call = rules.report_unknown(call, AFTER, attempt=1, reason="timeout").call
    call = operator_rules.reconcile(
        call, AFTER, _order(call.revision, found=found, dead=1)
    ).call
    assert records.decode_call(records.encode_call(call)) == call


def test_records_stored_before_approvals_existed_stay_readable() -> None:
    """A stored record without the approval and reconciliation keys reads as
    having neither (old records stay readable)."""
    call = unknown(Effect.SIDE_EFFECT)
    doc = json.loads(records.encode_call(call))
    del doc["approval_decision"], doc["reconciliations"]
    old = records.decode_call(json.dumps(doc).encode())
    assert (old.approval, old.reconciliations) == (None, ())
    assert old == call


# -- the reconcile quarantine (ADR-010 D1, R3) -----------------------------------

QUARANTINE_NS = Policy().reconcile_quarantine_leases * LEASE_NS


def _reported(effect: Effect) -> ToolCall:
    """UNKNOWN at NOW: attempt 1 reported that it cannot tell."""
    return unknown(effect, NOW)


def _expired(effect: Effect) -> ToolCall:
    """UNKNOWN since NOW + lease: noticed the moment the lease ran out."""
    call = started(effect, NOW)
    return rules.settle(call, later(NOW, LEASE_NS))


def _restarted_unknown(effect: Effect) -> ToolCall:
    """UNKNOWN since NOW: found at the start of a later incarnation at once."""
    call = started(effect, moment(incarnation=INCARNATION - 1))
    return rules.settle(call, NOW)


# How the call became UNKNOWN -> (the call, since when its outcome is unknown).
BECAME_UNKNOWN: dict[str, tuple[Callable[[Effect], ToolCall], int]] = {
    "reported": (_reported, NOW.wall_ns),
    "expired": (_expired, NOW.wall_ns + LEASE_NS),
    "restarted": (_restarted_unknown, NOW.wall_ns),
}


def _at(wall_ns: int) -> Now:
    return later(NOW, wall_ns - NOW.wall_ns)


@pytest.mark.parametrize("effect", EFFECTS)
@pytest.mark.parametrize("how", BECAME_UNKNOWN)
def test_never_executed_waits_out_the_quarantine(effect: Effect, how: str) -> None:
    """ "Never executed" is refused, changing nothing and saying how long is
    left, until the call has been UNKNOWN for the quarantine (a multiple of its
    lease); from then on it is accepted (issue 10 item 8: fails before the fix:
    it was accepted the instant the call became UNKNOWN)."""
    build, since = BECAME_UNKNOWN[how]
    call = build(effect)
    assert call.state is State.UNKNOWN
    assert call.outcome_unknown_since_ns == since
    order = _order(call.revision, found=False)
    early = _at(since + QUARANTINE_NS - 1_000_000_000)
    step = operator_rules.reconcile(call, early, order)
    refused = refusal(step, ReconcileQuarantine)
    assert step.call is call
    assert refused.metadata == {
        "attempt": "1",
        "quarantineMs": str(QUARANTINE_NS // 1_000_000),
        "remainingMs": "1000",
    }
    assert "1.0 s left" in refused.message
    assert "confirmed_dead_attempt = 1" in refused.message
    done = operator_rules.reconcile(call, _at(since + QUARANTINE_NS), order)
    assert done.call.state is State.PREPARED


@pytest.mark.parametrize("effect", EFFECTS)
def test_the_quarantine_counts_from_the_end_of_the_lease(effect: Effect) -> None:
    """A STARTED call whose lease ran out long before anyone looked is
    quarantined from the lease's end, not from the moment it is noticed."""
    call = started(effect, NOW)
    cleared = later(NOW, LEASE_NS + QUARANTINE_NS)
    step = operator_rules.reconcile(call, cleared, _order(call.revision, found=False))
    assert answer(step).call.state is State.PREPARED


@pytest.mark.parametrize("lease_ms", [1_000, 600_000])
def test_the_quarantine_is_a_multiple_of_the_attempts_lease(lease_ms: int) -> None:
    """The quarantine is `reconcile.quarantine_leases` times the lease the
    attempt asked for (an agent that needs long leases gets a long quarantine)."""
    policy = Policy(reconcile_quarantine_leases=5)
    begun = rules.prepare(
        None, spec(Effect.SIDE_EFFECT, start=True, lease_ms=lease_ms), NOW
    )
    call = rules.report_unknown(begun.call, NOW, attempt=1, reason="timeout").call
    assert call.lease_ms == lease_ms
    quarantine = 5 * lease_ms * 1_000_000
    order = _order(call.revision, found=False)
    early = operator_rules.reconcile(call, later(NOW, quarantine - 1), order, policy)
    refusal(early, ReconcileQuarantine)
    done = operator_rules.reconcile(call, later(NOW, quarantine), order, policy)
    assert answer(done).call.state is State.PREPARED


@pytest.mark.parametrize("effect", EFFECTS)
def test_the_dead_attempt_confirmation_skips_the_quarantine(effect: Effect) -> None:
    """The operator's word that the call's attempt is dead records "never
    executed" at once; a confirmation of another attempt is STALE_ATTEMPT, and
    none outweighs a live lease (the holder heartbeats: it is not dead)."""
    call = unknown(effect, NOW)
    step = operator_rules.reconcile(
        call, AFTER, _order(call.revision, found=False, dead=1)
    )
    assert answer(step).call.state is State.PREPARED
    other = operator_rules.reconcile(
        call, AFTER, _order(call.revision, found=False, dead=2)
    )
    assert refusal(other, StaleAttempt).metadata == {"currentAttempt": "1"}
    assert other.call is call
    live = started(effect, NOW)
    held = operator_rules.reconcile(
        live, AFTER, _order(live.revision, found=False, dead=1)
    )
    refusal(held, InvalidTransition)


@pytest.mark.parametrize("effect", EFFECTS)
def test_a_result_found_is_recorded_at_once(effect: Effect) -> None:
    """The quarantine guards only "never executed": a result found in the
    target system commits the call at once."""
    call = unknown(effect, NOW)
    step = operator_rules.reconcile(call, AFTER, _order(call.revision, found=True))
    assert answer(step).call.state is State.COMMITTED


def test_an_unknown_record_stored_before_it_kept_the_moment_uses_its_history() -> None:
    """A record stored without `unknown_since` is quarantined from its
    transition to UNKNOWN in the history (old records stay safe)."""
    call = unknown(Effect.SIDE_EFFECT, NOW)
    doc = json.loads(records.encode_call(call))
    del doc["unknown_since"], doc["lease_ms"]
    old = records.decode_call(json.dumps(doc).encode())
    assert (old.unknown_since_ns, old.lease_ms) == (0, 0)
    assert old.outcome_unknown_since_ns == NOW.wall_ns
    order = _order(old.revision, found=False)
    refusal(operator_rules.reconcile(old, AFTER, order), ReconcileQuarantine)
    cleared = later(NOW, QUARANTINE_NS)
    assert operator_rules.reconcile(old, cleared, order).call.state is State.PREPARED


Reconciler = Callable[[ToolCall, Now, ReconcileOrder], Step]


def _skips_quarantine(call: ToolCall, now: Now, order: ReconcileOrder) -> Step:
    """BROKEN on purpose: "never executed" the instant the lease ran out."""
    confirmed = dataclasses.replace(order, confirmed_dead_attempt=call.attempt)
    return operator_rules.reconcile(call, now, confirmed)


def zombie_runs_twice(effect: Effect, reconcile: Reconciler) -> list[str]:
    """The zombie scenario: attempt 1 stops heartbeating but keeps running;
    an operator looks at the target system right after its lease ran out and
    finds nothing yet. Returns why the call could run twice or lose the
    zombie's result ([] when it cannot)."""
    call = started(effect, NOW)
    expired = later(NOW, LEASE_NS + 1)
    step = reconcile(call, expired, _order(call.revision, found=False))
    problems = []
    if isinstance(step.reply, Answer) and step.call.state is State.PREPARED:
        again = rules.start(
            step.call,
            expired,
            lease_ms=LEASE_MS,
            retry=False,
            policy=Policy(),
            expected_revision=None,
        )
        if isinstance(again.reply, Answer) and again.reply.attempt_held:
            problems.append(f"attempt {again.call.attempt} started beside attempt 1")
        call = again.call
    else:
        call = step.call
    late = rules.commit(
        call, later(expired, 1), attempt=1, result=ok_result(), expected_revision=None
    )
    if not isinstance(late.reply, Answer):
        problems.append(f"attempt 1's result lost: {late.reply.reason}")
    return problems


@pytest.mark.parametrize("effect", EFFECTS)
def test_a_zombie_attempt_neither_runs_twice_nor_loses_its_result(
    effect: Effect,
) -> None:
    """With the quarantine, the attempt that stopped heartbeating can still
    commit its result, and no second attempt starts beside it (issue 10 item
    8: fails before the fix: attempt 2 started and attempt 1's result was
    STALE_ATTEMPT)."""
    assert zombie_runs_twice(effect, operator_rules.reconcile) == []


@pytest.mark.parametrize("effect", EFFECTS)
def test_negative_control_a_reconcile_without_quarantine_is_caught(
    effect: Effect,
) -> None:
    """The scenario's checker catches a reconcile that skips the quarantine."""
    found = zombie_runs_twice(effect, _skips_quarantine)
    assert found == [
        "attempt 2 started beside attempt 1",
        "attempt 1's result lost: STALE_ATTEMPT",
    ]
