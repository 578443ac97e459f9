"""Translation of the operator's orders (DecideApproval, Reconcile,
EnterReconciliation) into domain values. Each is recorded as its actor:
with authentication on, the caller's token, which a request may repeat but
never contradict (`Caller.operator`)."""

from __future__ import annotations

import re

from effectd.v1 import ledger_pb2 as pb

from sidecar.ledger.model import Result
from sidecar.ledger.operator_rules import ApprovalDecision, ReconcileOrder
from sidecar.ledger.validation import Limits, Violations
from sidecar.rpc.caller import Caller
from sidecar.rpc.convert import result

_FINGERPRINT = re.compile(r"sha256:[0-9a-f]{64}")


def _operator_text(
    v: Violations,
    caller: Caller,
    limits: Limits,
    actor: tuple[str, str],
    reason: str,
) -> str:
    """Validates the actor and reason of an operator action; returns the
    actor to record: with authentication on, the credential's name."""
    name = caller.operator(v, actor[0], actor[1])
    if name == actor[1]:
        v.text_id(actor[0], actor[1], limits.max_id_bytes)
    if not reason:
        v.add("reason", "is required")
    v.text("reason", reason, limits.max_text_bytes)
    return name


def approval_decision(
    v: Violations, caller: Caller, req: pb.DecideApprovalRequest, limits: Limits
) -> ApprovalDecision:
    approver = _operator_text(v, caller, limits, ("approver", req.approver), req.reason)
    if req.expected_revision == 0:
        v.add("expected_revision", "is required: the revision the approver saw")
    if not _FINGERPRINT.fullmatch(req.input_fingerprint):
        v.add("input_fingerprint", "must be the call's sha256:<64 hex> fingerprint")
    return ApprovalDecision(
        approve=req.approve,
        approver=approver,
        reason=req.reason,
        expected_revision=req.expected_revision,
        input_fingerprint=req.input_fingerprint,
    )


def operator_action(
    v: Violations, caller: Caller, limits: Limits, operator: str, reason: str
) -> str:
    """The actor of an operator action (with authentication on, the
    credential's name), its reason validated."""
    return _operator_text(v, caller, limits, ("operator", operator), reason)


def reconcile_order(
    v: Violations, caller: Caller, req: pb.ReconcileRequest, limits: Limits
) -> ReconcileOrder:
    operator = _operator_text(v, caller, limits, ("operator", req.operator), req.reason)
    if req.expected_revision == 0:
        v.add("expected_revision", "is required: the revision the operator saw")
    if not req.evidence:
        v.add("evidence", "is required: what was found in the target system")
    v.text("evidence", req.evidence, limits.max_text_bytes)
    which = req.WhichOneof("resolution")
    found: Result | None = None
    if which is None:
        v.add("resolution", "is required: set result or not_executed")
    elif which == "not_executed" and not req.not_executed:
        v.add("not_executed", "must be true when set")
    elif which == "result":
        found = result(v, req.result, limits)
    return ReconcileOrder(
        expected_revision=req.expected_revision,
        result=found,
        operator=operator,
        reason=req.reason,
        evidence=req.evidence,
        confirmed_dead_attempt=req.confirmed_dead_attempt,
    )
