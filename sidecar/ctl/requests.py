"""The operator's requests, built once for `effectd ctl` and the console:
an approval decision bound to what the person saw, and a reconciliation.
Both answer the whole record, which the people's faces show as it is."""

from __future__ import annotations

import json
from typing import Any

from effectd.v1 import ledger_pb2 as pb


def decide_request(
    ref: pb.CallRef,
    *,
    approve: bool,
    approver: str,
    reason: str,
    revision: int,
    fingerprint: str,
) -> pb.DecideApprovalRequest:
    """A decision bound to the revision and input fingerprint the person saw:
    the daemon refuses it if the call changed since."""
    return pb.DecideApprovalRequest(
        ref=ref,
        approve=approve,
        approver=approver,
        reason=reason,
        expected_revision=revision,
        input_fingerprint=fingerprint,
    )


def reconcile_request(
    ref: pb.CallRef,
    *,
    revision: int,
    operator: str,
    reason: str,
    evidence: str,
    result: Any = None,
    not_executed: bool = False,
    confirmed_dead_attempt: int = 0,
) -> pb.ReconcileRequest:
    """What the target system shows: `result` found (as JSON), or that the
    call never executed."""
    request = pb.ReconcileRequest(
        ref=ref,
        expected_revision=revision,
        operator=operator,
        reason=reason,
        evidence=evidence,
        confirmed_dead_attempt=confirmed_dead_attempt,
    )
    if not_executed:
        request.not_executed = True
    else:
        request.result.CopyFrom(
            pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json=_json(result)))
        )
    return request


def _json(value: Any) -> str:
    """A result as the Python client sends it: compact, keys in the order
    given, text unescaped; the same result found is stored in the same bytes
    whichever tool recorded it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
