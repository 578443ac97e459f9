"""The transitions of the failpoint table (`tests/torture/test_failpoints.py`):
how each is set up, made, and seen after a restart.

A transition is one mutating RPC on one record (or checkpoint). `setup`
brings the record to the state the transition leaves; `act` makes the
transition, the request a client sends and sends again after a crash;
`seen` reduces the record to a short text ("absent", "PREPARED by
prepare", "COMMITTED by commit result=..."), `answered` what `act` answered
("ok COMMITTED", "refused RECONCILIATION_REQUIRED", "EXECUTE held STARTED").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc

from effectd_client import Client, EffectdError, NotFound, Prepared, ToolCall
from effectd_client._recording import RecordingRetry

RUN = "run-fp"
CALL = "call-1"
KEY = "cp-1"
RESULT = b"\x00receipt-7\xff"
VALUE = b"checkpoint-bytes"
# One try: a request cut by the crash is not sent again by the client itself.
ONCE = RecordingRetry(attempts=1)

Answer = object


@dataclass(frozen=True, slots=True)
class Transition:
    """One row group of the table.

    Attributes:
        name: the transition, as the table's rows name it.
        method: the RPC that makes it (the failpoint is scoped to it).
        setup: brings the record to the state before the transition; every
            write it makes is of another RPC than `method`.
        act: the transition's request.
        seen: the record now, as a short text.
    """

    name: str
    method: str
    setup: Callable[[Client], None]
    act: Callable[[Client], Answer]
    seen: Callable[[Client], str]


def _prepare(c: Client, *, start: bool = False, approval: bool = False) -> Prepared:
    return c.prepare_tool(
        RUN, CALL, "charge_card", {"cents": 5}, start=start, require_approval=approval
    )


def _nothing(c: Client) -> None:
    return None


def _started(c: Client) -> None:
    assert _prepare(c, start=True).attempt_held


def _prepared(c: Client) -> None:
    _prepare(c)


def _awaiting(c: Client) -> None:
    _prepare(c, approval=True)


def _unknown(c: Client) -> None:
    _started(c)
    c.report_unknown(RUN, CALL, 1, "the tool timed out", retry=ONCE)


def call_seen(c: Client) -> str:
    try:
        call = c.get_tool_call(RUN, CALL)
    except NotFound:
        return "absent"
    # The last event of its history names the transition that left it so:
    # UNKNOWN by "restart" is not UNKNOWN by "report_unknown".
    seen = f"{call.state.name} by {call.history[-1]}"
    if call.result is None:
        return seen
    return f"{seen} result={call.result.raw!r}"


def checkpoint_seen(c: Client) -> str:
    found = c.get_checkpoint(KEY)
    if found is None:
        return "absent"
    return f"revision={found.revision} value={found.value!r}"


def _approve(c: Client) -> ToolCall:
    call = c.get_tool_call(RUN, CALL)
    # The approval a person gave before the crash: bound to the revision it
    # saw, which is the record's first.
    return c.decide_approval(
        RUN,
        CALL,
        approve=True,
        approver="ann",
        reason="looks right",
        expected_revision=1,
        input_fingerprint=call.input_fingerprint,
    )


def _reconcile(c: Client) -> ToolCall:
    # The operator saw the call UNKNOWN at its revision after setup (3:
    # prepared and started, then reported unknown).
    return c.reconcile(
        RUN,
        CALL,
        expected_revision=3,
        operator="olga",
        reason="found the charge",
        evidence="ledger entry 991",
        result=RESULT,
    )


TRANSITIONS = (
    Transition(
        "prepare",
        "PrepareTool",
        _nothing,
        _prepare,
        call_seen,
    ),
    Transition(
        "prepare+start",
        "PrepareTool",
        _nothing,
        lambda c: _prepare(c, start=True),
        call_seen,
    ),
    Transition(
        "start", "StartTool", _prepared, lambda c: c.start_tool(RUN, CALL), call_seen
    ),
    Transition(
        "commit",
        "CommitTool",
        _started,
        lambda c: c.commit_tool(RUN, CALL, 1, RESULT, retry=ONCE),
        call_seen,
    ),
    Transition(
        "mark unknown",
        "ReportUnknown",
        _started,
        lambda c: c.report_unknown(RUN, CALL, 1, "the tool timed out", retry=ONCE),
        call_seen,
    ),
    Transition("approve", "DecideApproval", _awaiting, _approve, call_seen),
    Transition("reconcile", "Reconcile", _unknown, _reconcile, call_seen),
    Transition(
        "checkpoint put",
        "Put",
        _nothing,
        lambda c: c.put_checkpoint(KEY, VALUE),
        checkpoint_seen,
    ),
)
BY_NAME = {t.name: t for t in TRANSITIONS}


def answered(act: Callable[[Client], Answer], c: Client) -> str:
    """What `act` answers, as a short text: the decision of a prepare or
    start, the state of a call, the revision of a checkpoint, or the reason
    of a refusal."""
    try:
        got = act(c)
    except EffectdError as exc:
        if exc.code is grpc.StatusCode.UNAVAILABLE and not exc.reason:
            # No answer of the daemon's: the connection (or the session
            # stream, which says mayHaveBeenApplied) ended first.
            return "cut"
        return f"refused {exc.reason}"
    if isinstance(got, Prepared):
        held = " held" if got.attempt_held else ""
        return f"{got.decision.name}{held} {got.call.state.name}"
    if isinstance(got, ToolCall):
        return f"ok {got.state.name}"
    return f"ok revision={got}"
