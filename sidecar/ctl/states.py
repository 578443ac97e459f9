"""The state a person reads, derived in this one place for `effectd ctl`
and the console. On the wire a call an approver rejected is COMMITTED, with
the error result APPROVAL_REJECTED (contract §4.5), and stays so in the JSON's
`state`; for a person it is REJECTED: it never ran, and nobody may run it.
Every state shown in a table, a record, a history, a plan or the audit log
goes through here."""

from __future__ import annotations

from effectd.v1 import admin_pb2 as apb
from effectd.v1 import ledger_pb2 as pb

from sidecar.ledger.channel_results import CALL_TOOL_RESULT_EXAMPLE
from sidecar.ledger.model import APPROVAL_REJECTED

REJECTED = "REJECTED"
# The history's name of an approver's rejection (`ledger.model.Event.REJECT`).
_REJECT_EVENT = "reject"


def state_name(value: pb.CallState.ValueType) -> str:
    """A state on the wire by its name without the prefix, "-" for none."""
    if value == pb.CALL_STATE_UNSPECIFIED:
        return "-"
    return pb.CallState.Name(value).removeprefix("CALL_STATE_")


def rejected(call: pb.ToolCall) -> bool:
    """Committed by an approver's rejection (contract §4.5)."""
    return (
        call.state == pb.CALL_STATE_COMMITTED
        and call.HasField("result")
        and call.result.outcome == pb.OUTCOME_ERROR
        and call.result.error_code == APPROVAL_REJECTED
    )


def display_state(call: pb.ToolCall) -> str:
    """The call's state as a person reads it."""
    return REJECTED if rejected(call) else state_name(call.state)


def transition_to(t: pb.Transition) -> str:
    """The state a change of the history led to, as a person reads it."""
    if t.event == _REJECT_EVENT and t.to_state == pb.CALL_STATE_COMMITTED:
        return REJECTED
    return state_name(t.to_state)


def audit_after(e: apb.AuditEntry) -> str:
    """The state an audited action left its call in, as a person reads it."""
    if e.action == apb.AUDIT_ACTION_REJECT and e.state_after == pb.CALL_STATE_COMMITTED:
        return REJECTED
    return state_name(e.state_after)


def result_example(call: pb.ToolCall) -> str | None:
    """An example of the result found for `call`, where its channel decides
    its shape (an MCP call's CallToolResult): None where any JSON value is a
    result."""
    if call.channel != pb.CALL_CHANNEL_MCP:
        return None
    return CALL_TOOL_RESULT_EXAMPLE
