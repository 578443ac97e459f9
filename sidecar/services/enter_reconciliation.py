"""Putting every open call of a tool into reconciliation (ADR-010 R2, contract §7.3).

When a tool is found to duplicate its effect, the operator makes every open
call of it (PREPARED, AWAITING_APPROVAL, STARTED, UNKNOWN) a SIDE_EFFECT for
good (`operator_rules.enter_reconciliation`): those whose outcome is unknown
answer RECONCILE until an operator reconciles them, whatever the policy says
later, and none is ever retried. Each changed record and its audit entry are
written in one transaction, in bounded batches, so a tool with many open
calls never holds the writer for long; the walk goes over the records in key
order (not over the by-state index, which a call leaves when it changes
state), so no call that was open when it began is missed. It is idempotent:
a call already a SIDE_EFFECT is counted, not changed, so an interrupted walk
is finished by running it again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sidecar.errors import UnsupportedKeyScheme
from sidecar.ledger import audit, operator_rules
from sidecar.ledger.audit import Action
from sidecar.ledger.model import State, ToolCall
from sidecar.ledger.rules import Now
from sidecar.services._common import committed
from sidecar.storage import keys
from sidecar.storage.api import LedgerReads, LedgerWrites, Store

# Changed calls per transaction (each with its audit entry, about 0.7 ms a
# call with fsync on: the writer is held for about 0.1 s), and records
# examined per transaction.
BATCH = 128
SCAN_BUDGET = 4096


@dataclass(slots=True)
class Entered:
    """What putting a tool's open calls into reconciliation did."""

    tool_name: str
    # Open calls made a SIDE_EFFECT now, by the state they are in.
    forced: dict[State, int] = field(default_factory=dict)
    # Open calls that were a SIDE_EFFECT already (declared or forced).
    already: int = 0
    # Records of the scope examined (every tool, committed ones included).
    examined: int = 0
    # Records of a key scheme this daemon does not know (a newer daemon's):
    # left as they are, as every request leaves them (ADR-010 R4).
    skipped: int = 0
    batches: int = 0
    # The audit entries written, one per call forced; 0 when none.
    first_audit_sequence: int = 0
    last_audit_sequence: int = 0

    @property
    def forced_total(self) -> int:
        return sum(self.forced.values())


@dataclass(frozen=True, slots=True)
class _Batch:
    forced: list[tuple[State, int]]
    already: int
    examined: int
    skipped: int
    # Where the next batch starts; None when the walk is done.
    next_key: bytes | None


def _batch(
    view: LedgerWrites,
    now: Now,
    *,
    prefix: bytes,
    after: bytes | None,
    tool_name: str,
    operator: str,
    reason: str,
    batch: int,
    budget: int,
) -> _Batch:
    # Chosen first, changed after: the walk reads the records as they were.
    chosen: list[ToolCall] = []
    examined = skipped = 0
    last = b""
    next_key: bytes | None = None
    for key, call in view.calls(prefix, after=after):
        if len(chosen) == batch or examined == budget:
            next_key = last
            break
        examined += 1
        last = key
        if isinstance(call, UnsupportedKeyScheme):
            skipped += 1
            continue
        if call.tool_name == tool_name and call.state is not State.COMMITTED:
            chosen.append(call)
    forced: list[tuple[State, int]] = []
    already = 0
    for call in chosen:
        step = operator_rules.enter_reconciliation(call, now, operator, reason)
        if step.call is call:
            already += 1
            continue
        view.write_call(call, step.call)
        entry = view.append_audit(
            audit.call_fact(
                Action.ENTER_RECONCILIATION,
                call,
                step.call,
                at_ns=now.wall_ns,
                actor=operator,
                reason=reason,
                details={"tool": tool_name, "declaredEffect": call.effect.value},
            ),
        )
        forced.append((call.state, entry.sequence))
    return _Batch(forced, already, examined, skipped, next_key)


async def enter_reconciliation(
    store: Store,
    now: Callable[[LedgerReads], Now],
    *,
    tool_name: str,
    namespace: str | None,
    operator: str,
    reason: str,
    batch: int = BATCH,
    budget: int = SCAN_BUDGET,
) -> Entered:
    """Makes every open call of `tool_name` in `namespace` (None: every
    namespace) a SIDE_EFFECT for good, audited; see the module docstring."""
    prefix = b"" if namespace is None else keys.namespace_prefix(namespace)
    done = Entered(tool_name)
    after: bytes | None = None
    while True:
        start = after

        def apply(view: LedgerWrites, start: bytes | None = start) -> _Batch:
            return _batch(
                view,
                now(view),
                prefix=prefix,
                after=start,
                tool_name=tool_name,
                operator=operator,
                reason=reason,
                batch=batch,
                budget=budget,
            )

        got = await committed(store, apply)
        done.batches += 1
        done.examined += got.examined
        done.already += got.already
        done.skipped += got.skipped
        for state, sequence in got.forced:
            done.forced[state] = done.forced.get(state, 0) + 1
            done.first_audit_sequence = done.first_audit_sequence or sequence
            done.last_audit_sequence = sequence
        if got.next_key is None:
            return done
        after = got.next_key
