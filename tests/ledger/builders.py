"""Records in every state, built through the rules themselves, for the ledger tests.

A record reached by the rules is more honest than one assembled field by field:
the tests then see exactly what the rules store. Only what `sidecar.ledger.rules`
cannot do yet (an approver's decision) goes through `machine.apply` directly.
"""

from __future__ import annotations

from typing import TypeVar

from sidecar.errors import EffectdError
from sidecar.ledger import machine, rules
from sidecar.ledger.fingerprint import fingerprint, result_digest
from sidecar.ledger.model import (
    APPROVAL_REJECTED,
    CallRef,
    Effect,
    Event,
    Outcome,
    Payload,
    PayloadKind,
    Result,
    ToolCall,
)
from sidecar.ledger.rules import Answer, Now, PrepareSpec, Step

REF = CallRef("default", "run-1", "call-1")
TOOL = "send_email"
INPUT = Payload(PayloadKind.JSON, b'{"to": "a@example.com", "body": "hi"}')
OTHER_INPUT = Payload(PayloadKind.JSON, b'{"to": "b@example.com", "body": "hi"}')
LEASE_MS = 30_000
LEASE_NS = LEASE_MS * 1_000_000
MAX_ATTEMPTS = 3
WALL0 = 1_700_000_000_000_000_000
MONO0 = 5_000_000_000
INCARNATION = 7

E = TypeVar("E", bound=EffectdError)


def moment(
    monotonic_ns: int = MONO0, incarnation: int = INCARNATION, wall_ns: int = WALL0
) -> Now:
    """A `Now` of the current daemon incarnation unless told otherwise."""
    return Now(wall_ns=wall_ns, monotonic_ns=monotonic_ns, incarnation=incarnation)


def later(now: Now, ns: int) -> Now:
    """`now` moved forward by `ns` on both clocks, same incarnation."""
    return Now(now.wall_ns + ns, now.monotonic_ns + ns, now.incarnation)


def spec(
    effect: Effect,
    *,
    payload: Payload = INPUT,
    tool_name: str = TOOL,
    require_approval: bool = False,
    start: bool = False,
    lease_ms: int = LEASE_MS,
) -> PrepareSpec:
    return PrepareSpec(
        ref=REF,
        tool_name=tool_name,
        effect=effect,
        input=payload,
        fingerprint=fingerprint(payload),
        require_approval=require_approval,
        start=start,
        lease_ms=lease_ms,
    )


def ok_result(body: bytes = b'{"id": 1}') -> Result:
    payload = Payload(PayloadKind.JSON, body)
    return Result(
        Outcome.OK, payload, "", "", result_digest(Outcome.OK, payload, "", "")
    )


def error_result(code: str, message: str = "it failed") -> Result:
    return Result(
        Outcome.ERROR,
        None,
        code,
        message,
        result_digest(Outcome.ERROR, None, code, message),
    )


def answer(step: Step) -> Answer:
    """The step's reply, which the test expects to be an answer, not a refusal."""
    assert isinstance(step.reply, Answer), step.reply
    return step.reply


def refusal(step: Step, kind: type[E]) -> E:
    """The step's reply, which the test expects to be a refusal of class `kind`."""
    assert isinstance(step.reply, kind), step.reply
    return step.reply


def prepared(effect: Effect, now: Now | None = None) -> ToolCall:
    return rules.prepare(None, spec(effect), now or moment()).call


def awaiting(effect: Effect, now: Now | None = None) -> ToolCall:
    return rules.prepare(
        None, spec(effect, require_approval=True), now or moment()
    ).call


def started(effect: Effect, now: Now | None = None) -> ToolCall:
    """STARTED with a live lease granted at `now`, attempt 1."""
    return rules.prepare(None, spec(effect, start=True), now or moment()).call


def unknown(effect: Effect, now: Now | None = None) -> ToolCall:
    """UNKNOWN after attempt 1 reported that it cannot tell whether the tool ran."""
    now = now or moment()
    call = started(effect, now)
    return rules.report_unknown(call, now, attempt=1, reason="connection lost").call


def committed(effect: Effect, result: Result | None = None) -> ToolCall:
    now = moment()
    step = rules.commit(
        started(effect, now),
        now,
        attempt=1,
        result=result or ok_result(),
        expected_revision=None,
    )
    return step.call


def rejected(effect: Effect) -> ToolCall:
    """COMMITTED by an approver's rejection (contract §4.5 reject)."""
    return machine.apply(
        awaiting(effect),
        Event.REJECT,
        at_ns=WALL0,
        actor="approver",
        reason="no",
        result=error_result(APPROVAL_REJECTED, "rejected by approver"),
    )
