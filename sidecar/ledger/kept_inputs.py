"""Which calls keep their exact input, and for how long, as pure functions.

The record identifies its input by fingerprint only; an approver, though,
must see what they approve, and an operator reconciling a call whose outcome
is unknown must see what it was sent (which e-mail, which charge) to look
for it in the target system. So every call keeps its input as sent, from
the prepare that creates it until it is settled (COMMITTED: by its commit,
a reconciliation that found its result, or a rejection). An input is
bounded by the largest payload a request may carry, and counts in the
namespace's stored bytes. Settling drops it (`machine.apply`) unless the
policy keeps the inputs of settled calls too (`[inputs] keep_all`, up to
its size cap, `settled`): then it goes with the rest of the record when
retention compacts it to a tombstone. An approval stays bound to the
fingerprint (`operator_rules`), never to the text shown. A record written
before every input was kept has none while it is open.
"""

from __future__ import annotations

from sidecar.ledger.model import Payload, ToolCall
from sidecar.ledger.policy import Policy


def settled(call: ToolCall, policy: Policy | None) -> Payload | None:
    """The input `call` keeps once it is settled: None unless `policy` keeps
    the inputs of settled calls and this one is within its cap."""
    kept = call.kept_input
    if kept is None or policy is None or not policy.keep_inputs:
        return None
    return kept if len(kept.data) <= policy.max_kept_input_bytes else None
