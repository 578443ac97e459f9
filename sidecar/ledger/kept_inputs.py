"""Which calls keep their exact input, and for how long, as pure functions.

The record identifies its input by fingerprint only; an approver, though,
must see what they approve, and an operator reconciling a call may need what
it was sent. So a call that awaits approval keeps its input as sent (always:
it is bounded by the largest payload a request may carry), and so does every
call when the policy asks for it, up to the policy's size cap. The kept input
counts in the namespace's stored bytes, and is dropped when the call is
COMMITTED (`machine.apply`): its outcome is decided then. An approval stays
bound to the fingerprint (`operator_rules`), never to the text shown.
"""

from __future__ import annotations

from sidecar.ledger.model import Payload
from sidecar.ledger.policy import Policy


def kept(
    input: Payload, *, require_approval: bool, policy: Policy | None
) -> Payload | None:
    """The input a new record keeps, or None."""
    if require_approval:
        return input
    if (
        policy is not None
        and policy.keep_inputs
        and len(input.data) <= policy.max_kept_input_bytes
    ):
        return input
    return None
