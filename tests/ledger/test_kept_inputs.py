"""Which calls keep their exact input, and until when, as tables: every
approval keeps it, the policy may keep any within its cap, the commit (or
rejection) drops it; the stored record round-trips it, and records written
before it existed still decode."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sidecar.ledger import machine, rules
from sidecar.ledger.kept_inputs import kept
from sidecar.ledger.model import APPROVAL_REJECTED, Effect, Event, Payload, PayloadKind
from sidecar.ledger.policy import Policy
from sidecar.storage.records import decode_call, encode_call
from tests.ledger.builders import (
    INPUT,
    WALL0,
    error_result,
    moment,
    ok_result,
    spec,
)

SE = Effect.SIDE_EFFECT
KEEP = Policy(keep_inputs=True, max_kept_input_bytes=len(INPUT.data))
BIG = Payload(PayloadKind.JSON, json.dumps({"x": "y" * 100}).encode())


@pytest.mark.parametrize(
    ("payload", "approval", "policy", "want"),
    [
        # An approver must see what they approve: always kept.
        (INPUT, True, None, INPUT),
        (BIG, True, KEEP, BIG),
        (INPUT, False, None, None),
        (INPUT, False, Policy(), None),
        (INPUT, False, KEEP, INPUT),
        # Past the policy's cap only the fingerprint stays.
        (BIG, False, KEEP, None),
    ],
)
def test_which_inputs_are_kept(
    payload: Payload, approval: bool, policy: Policy | None, want: Payload | None
) -> None:
    assert kept(payload, require_approval=approval, policy=policy) == want


def test_a_new_record_keeps_the_input_the_rules_choose() -> None:
    """The prepare that creates the record keeps its input; a repeat changes
    nothing."""
    call = rules.prepare(None, spec(SE, require_approval=True), moment()).call
    assert call.kept_input == INPUT
    assert rules.prepare(None, spec(SE), moment()).call.kept_input is None
    assert rules.prepare(None, spec(SE), moment(), KEEP).call.kept_input == INPUT
    again = rules.prepare(call, spec(SE, require_approval=True), moment()).call
    assert again == call


@pytest.mark.parametrize(
    ("events", "kept_after"),
    [
        # Approved: the operator may still need it if the outcome is lost.
        ([(Event.APPROVE, {})], True),
        # Decided: the commit or the rejection drops it.
        ([(Event.REJECT, {"result": error_result(APPROVAL_REJECTED)})], False),
        ([(Event.APPROVE, {}), (Event.START, {"attempt": 1})], True),
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
                (Event.RECONCILE_NOT_EXECUTED, {}),
            ],
            True,
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
def test_the_input_is_kept_until_the_call_is_committed(
    events: list[tuple[Event, dict[str, Any]]], kept_after: bool
) -> None:
    call = rules.prepare(None, spec(SE, require_approval=True), moment()).call
    for event, changes in events:
        call = machine.apply(call, event, at_ns=WALL0, actor="t", **changes)
    assert (call.kept_input is not None) is kept_after


def test_the_record_round_trips_the_kept_input_and_old_records_decode() -> None:
    """Raw bytes survive the stored form; a record without one is stored as
    before (no key), and a stored record from before decodes with none."""
    raw = Payload(PayloadKind.RAW, b"\x00\xff input")
    call = rules.prepare(
        None, spec(SE, payload=raw, require_approval=True), moment()
    ).call
    assert decode_call(encode_call(call)) == call
    plain = rules.prepare(None, spec(SE), moment()).call
    stored = json.loads(encode_call(plain))
    assert "kept_input" not in stored
    assert decode_call(json.dumps(stored).encode()).kept_input is None
