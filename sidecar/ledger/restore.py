"""What restoring a backup does to the ledger, as pure functions.

A backup is an earlier state of the ledger. Whatever happened after it is
gone from the copy: a call PREPARED in the backup may have been started and
committed since, a call awaiting approval may have been approved and run, a
STARTED one may have finished. Answering from the copy as if nothing had
happened would say EXECUTE again (ADR-010 D1, R3). So a restore turns every
call that is not COMMITTED into UNKNOWN, with a history entry: a side effect
then answers RECONCILE until an operator finds in the target system what
happened; a READ or IDEMPOTENT_WRITE runs again only as an explicit retry
with the same idempotency key. The store keeps a `Marker` saying it was
restored, and the restore is an audit entry.

What no restore can know: calls recorded only after the backup are not in
it, so their repeated prepare records them anew and answers EXECUTE; results,
acknowledgements, approvals and audit entries written after the backup are
lost. `docs/operations.md` says what an operator does about each.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from sidecar.ledger import audit, machine
from sidecar.ledger.model import Event, State, ToolCall

REASON = "restored from a backup: what happened since the backup is unknown"
# The checkpoint revision counter jumps by this much, so that no revision
# issued after the backup is issued again for another value.
CHECKPOINT_REVISION_GAP = 1 << 32
# States a restore turns into UNKNOWN (UNKNOWN calls stay as they are).
OPEN_STATES = (State.PREPARED, State.AWAITING_APPROVAL, State.STARTED)


@dataclass(frozen=True, slots=True)
class Marker:
    """How a store was restored; kept in the store and shown by stats."""

    at_ns: int
    actor: str
    reason: str
    # The backup directory restored from, as the operator named it.
    backup: str
    # The incarnation the backup was taken under: calls started under it or
    # an earlier one may have run after the copy was made.
    backup_incarnation: int
    # Calls this restore turned UNKNOWN.
    made_unknown: int
    # Restores of this store, this one included.
    count: int
    # The audit entry of this restore.
    audit_sequence: int = 0


def restored(call: ToolCall, *, at_ns: int, actor: str) -> ToolCall:
    """`call` as a restored store must hold it: UNKNOWN unless COMMITTED."""
    if call.state not in OPEN_STATES:
        return call
    return machine.apply(
        call,
        Event.RESTORE,
        at_ns=at_ns,
        actor=actor,
        reason=REASON,
        lease=None,
        # Unknown from the restore on (the reconcile quarantine counts from
        # here); when it really became unknown, the backup cannot tell.
        unknown_since_ns=at_ns,
    )


def encode(marker: Marker) -> bytes:
    return json.dumps(asdict(marker), sort_keys=True).encode()


def decode(raw: bytes) -> Marker:
    return Marker(**json.loads(raw))


def fact(marker: Marker) -> audit.Fact:
    """The audit fact of the restore; it names no record."""
    return audit.Fact(
        at_ns=marker.at_ns,
        actor=marker.actor,
        action=audit.Action.RESTORE,
        namespace="",
        run_id="",
        call_id="",
        revision_before=0,
        revision_after=0,
        state_before=None,
        state_after=None,
        reason=marker.reason,
        evidence="",
        details={
            "backup": marker.backup,
            "backupIncarnation": str(marker.backup_incarnation),
            "madeUnknown": str(marker.made_unknown),
            "restores": str(marker.count),
        },
    )
