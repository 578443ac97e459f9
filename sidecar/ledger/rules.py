"""What each ledger request does to a record, as pure functions (contract §4, §5).

Every rule takes the stored record (or None) and the moment (`Now`) and
returns a `Step`: the record as it must be stored, and the reply, which is
either an `Answer` or a refusal. A refusal can still carry a changed record:
a STARTED call whose lease ran out becomes UNKNOWN durably even when the
request that noticed it is refused.

This module is where the services find the rules; each lives with its own
kind: `sidecar.ledger.steps` (the moment, the reply, settling a lapsed lease,
the decision), `sidecar.ledger.prepare` (PrepareTool) and
`sidecar.ledger.attempts` (StartTool, CommitTool, ReportUnknown, Heartbeat,
and marking a result delivered).
"""

from __future__ import annotations

from sidecar.ledger.attempts import (
    commit,
    delivered,
    heartbeat,
    report_unknown,
    start,
)
from sidecar.ledger.prepare import PrepareSpec, prepare
from sidecar.ledger.steps import (
    AGENT,
    DAEMON,
    Answer,
    Now,
    Step,
    decide,
    enforce,
    holder_restarted,
    settle,
)

__all__ = [
    "AGENT",
    "DAEMON",
    "Answer",
    "Now",
    "PrepareSpec",
    "Step",
    "commit",
    "decide",
    "delivered",
    "enforce",
    "heartbeat",
    "holder_restarted",
    "prepare",
    "report_unknown",
    "settle",
    "start",
]
