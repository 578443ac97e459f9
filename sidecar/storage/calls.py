"""The compare-and-swap of one call record (`api.CallWrite`), on a write view:
the write of every request on one call (PrepareTool, StartTool, CommitTool,
Heartbeat, ReportUnknown, and an operator's approval or reconciliation, with
its audit entry).

The service reads the record on a snapshot and decides with the pure rules
(`ledger.rules`); the store then saves the new record only if the stored one
is still the one decided on, else nothing is written and `api.Conflict` is
raised, and the service reads and decides again. Deciding off the writer
keeps the write transaction to what must be atomic: the compare, the record
with its index entries (`records.save_call`), the audit entry the rule
writes with it, and, for a new call, the namespace's quota, checked against
its usage as the write finds it.
"""

from __future__ import annotations

from sidecar.ledger import quota
from sidecar.storage.api import CallWrite, Conflict, LedgerWrites


def compare_and_save(view: LedgerWrites, write: CallWrite) -> None:
    """Saves `write.new` if its compare holds.

    Raises:
        Conflict: the stored record is not `write.old` (by revision), or, for
            a new call, a record or a tombstone of it is stored, or what the
            decision assumed no longer holds.
        QuotaExceeded: a new call past its namespace's quotas; nothing is
            written.
    """
    ref = write.new.ref
    if write.holds is not None and not write.holds():
        raise Conflict("what the decision assumed changed before its write")
    if write.old is None:
        stored, tomb = view.find_call(ref)
        if stored is not None or tomb is not None:
            raise Conflict(f"tool call {ref.run_id}:{ref.call_id} exists now")
    else:
        stored = view.load_call(ref)
        if stored is None or stored.revision != write.old.revision:
            raise Conflict(
                f"tool call {ref.run_id}:{ref.call_id} changed since it was read"
            )
    limits = write.quotas
    if write.old is not None or limits is None or not limits.limits_storage:
        view.write_call(stored, write.new)
    else:
        before = view.usage(ref.namespace)
        view.write_call(None, write.new)
        # Measured after the save: the stored size is the encoded record's.
        refusal = quota.refuse_growth(
            ref.namespace, before, view.usage(ref.namespace), limits
        )
        if refusal is not None:
            # Raised inside the write function: nothing of it is kept.
            raise refusal
    if write.audit is not None:
        view.append_audit(write.audit)
