"""Which calls keep their exact input, and until when, as tables: every new
call keeps it until it is settled (committed, reconciled with a result,
rejected), which drops it unless the policy keeps settled inputs within its
cap; the stored record round-trips it, and records written before it
existed still decode."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from sidecar.ledger import machine, operator_rules, rules
from sidecar.ledger.kept_inputs import settled
from sidecar.ledger.model import (
    APPROVAL_REJECTED,
    Effect,
    Event,
    Payload,
    PayloadKind,
    ToolCall,
)
from sidecar.ledger.operator_rules import ApprovalDecision, ReconcileOrder
from sidecar.ledger.policy import Policy
from sidecar.storage.records import decode_call, encode_call
from tests.ledger.builders import (
    INPUT,
    WALL0,
    awaiting,
    error_result,
    moment,
    ok_result,
    spec,
    started,
    unknown,
)

SE = Effect.SIDE_EFFECT
KEEP = Policy(keep_inputs=True, max_kept_input_bytes=len(INPUT.data))
BIG = Payload(PayloadKind.JSON, json.dumps({"x": "y" * 100}).encode())


@pytest.mark.parametrize("effect", list(Effect))
@pytest.mark.parametrize("approval", [False, True])
@pytest.mark.parametrize("start", [False, True])
@pytest.mark.parametrize("payload", [INPUT, BIG], ids=["small", "big"])
@pytest.mark.parametrize(
    "policy", [None, Policy(), KEEP], ids=["none", "default", "keep"]
)
def test_every_new_call_keeps_its_input(
    effect: Effect, approval: bool, start: bool, payload: Payload, policy: Policy | None
) -> None:
    """Whatever the policy, the effect, the size or the approval: an
    operator reconciling it must know what was sent (issue 25 item 7: fails
    before the fix: only calls awaiting approval, or every call when the
    policy asked, within its cap)."""
    made = rules.prepare(
        None,
        spec(effect, payload=payload, require_approval=approval, start=start),
        moment(),
        policy,
    ).call
    assert made.kept_input == payload


def test_a_repeat_prepare_changes_nothing() -> None:
    call = rules.prepare(None, spec(SE), moment()).call
    assert rules.prepare(call, spec(SE), moment()).call == call


@pytest.mark.parametrize(
    ("kept", "policy", "want"),
    [
        (INPUT, None, None),
        # The default: settling drops it.
        (INPUT, Policy(), None),
        (INPUT, KEEP, INPUT),
        # Past the policy's cap only the fingerprint stays.
        (BIG, KEEP, None),
        # A record written before inputs were kept has none to keep.
        (None, KEEP, None),
    ],
)
def test_what_a_settled_call_keeps(
    kept: Payload | None, policy: Policy | None, want: Payload | None
) -> None:
    call = dataclasses.replace(started(SE), kept_input=kept)
    assert settled(call, policy) == want


@pytest.mark.parametrize(
    ("events", "kept_after"),
    [
        # Open: the operator may still need it if the outcome is lost.
        ([(Event.APPROVE, {})], True),
        ([(Event.APPROVE, {}), (Event.START, {"attempt": 1})], True),
        (
            [
                (Event.APPROVE, {}),
                (Event.START, {"attempt": 1}),
                (Event.REPORT_UNKNOWN, {}),
            ],
            True,
        ),
        (
            [
                (Event.APPROVE, {}),
                (Event.START, {"attempt": 1}),
                (Event.REPORT_UNKNOWN, {}),
                (Event.RECONCILE_NOT_EXECUTED, {}),
            ],
            True,
        ),
        # Settled: the commit, the rejection or the reconciliation drops it.
        ([(Event.REJECT, {"result": error_result(APPROVAL_REJECTED)})], False),
        (
            [
                (Event.APPROVE, {}),
                (Event.START, {"attempt": 1}),
                (Event.COMMIT, {"result": ok_result()}),
            ],
            False,
        ),
        (
            [
                (Event.APPROVE, {}),
                (Event.START, {"attempt": 1}),
                (Event.REPORT_UNKNOWN, {}),
                (Event.RECONCILE_COMMITTED, {"result": ok_result()}),
            ],
            False,
        ),
    ],
)
def test_the_input_is_kept_until_the_call_is_settled(
    events: list[tuple[Event, dict[str, Any]]], kept_after: bool
) -> None:
    call = awaiting(SE)
    for event, changes in events:
        call = machine.apply(call, event, at_ns=WALL0, actor="t", **changes)
    assert (call.kept_input is not None) is kept_after


def _commit(call: ToolCall, policy: Policy | None) -> ToolCall:
    return rules.commit(
        call,
        moment(),
        attempt=1,
        result=ok_result(),
        expected_revision=None,
        acknowledge=True,
        policy=policy,
    ).call


def _reject(call: ToolCall, policy: Policy | None) -> ToolCall:
    decision = ApprovalDecision(
        False, "ann", "no", call.revision, call.input_fingerprint
    )
    return operator_rules.decide_approval(call, moment(), decision, policy).call


def _reconcile(call: ToolCall, policy: Policy | None) -> ToolCall:
    order = ReconcileOrder(call.revision, ok_result(), "ops", "found", "in the PSP")
    return operator_rules.reconcile(call, moment(), order, policy).call


@pytest.mark.parametrize(
    ("open_call", "settle"),
    [
        (lambda: started(SE), _commit),
        (lambda: unknown(SE), _commit),
        (lambda: awaiting(SE), _reject),
        (lambda: unknown(SE), _reconcile),
    ],
    ids=["commit", "late-commit", "reject", "reconcile"],
)
@pytest.mark.parametrize(
    ("policy", "kept"), [(None, False), (Policy(), False), (KEEP, True)]
)
def test_each_way_of_settling_keeps_the_input_only_when_the_policy_says(
    open_call: Any, settle: Any, policy: Policy | None, kept: bool
) -> None:
    """The commit (acknowledged in the same step), the rejection and the
    reconciliation that found the result keep it for the retention window
    when the policy keeps settled inputs; otherwise it goes, as before."""
    done = settle(open_call(), policy)
    assert done.state.name == "COMMITTED"
    assert (done.kept_input == INPUT) is kept
    assert done.input_fingerprint == open_call().input_fingerprint


def test_an_acknowledgement_keeps_what_the_settled_call_kept() -> None:
    done = _commit(started(SE), KEEP)
    assert done.acknowledged
    again = rules.delivered(
        dataclasses.replace(done, acknowledged=False), moment(), "agent"
    )
    assert again.kept_input == INPUT


def test_the_record_round_trips_the_kept_input_and_old_records_decode() -> None:
    """Raw bytes survive the stored form; a record without one is stored as
    before (no key), and a stored record from before decodes with none."""
    raw = Payload(PayloadKind.RAW, b"\x00\xff input")
    call = rules.prepare(None, spec(SE, payload=raw), moment()).call
    assert call.kept_input == raw
    assert decode_call(encode_call(call)) == call
    old = dataclasses.replace(call, kept_input=None)
    stored = json.loads(encode_call(old))
    assert "kept_input" not in stored
    assert decode_call(json.dumps(stored).encode()).kept_input is None


def test_a_reader_of_many_records_does_not_decode_the_input() -> None:
    """Without the history (a recovery plan's read), the input is left out
    too: no such reader shows it, and none writes the record back."""
    call = rules.prepare(None, spec(SE), moment()).call
    assert decode_call(encode_call(call), history=False).kept_input is None
