"""The operator service: approvals, reconciliations and the audit log.

Each decision is made as `LedgerService` makes its own: the record read on a
snapshot, the rule of `operator_rules` run there, and the record saved by
compare-and-swap with its audit entry, in one write transaction
(`Store.save_call`). So a decision is never applied without its audit
entry, nor audited without being applied, and of two operators deciding one
record, the second one's compare fails: it decides again on the first one's
record, and is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sidecar.clock import Clock
from sidecar.errors import EffectdError, NotFound
from sidecar.ledger import audit, operator_rules, paging
from sidecar.ledger.audit import Action
from sidecar.ledger.model import CallRef, Resolution, State, ToolCall
from sidecar.ledger.operator_rules import ApprovalDecision, ReconcileOrder
from sidecar.ledger.policy import FixedPolicy, PolicySource
from sidecar.ledger.quota import Usage
from sidecar.ledger.rules import Answer, Now
from sidecar.ledger.validation import Limits
from sidecar.services import enter_reconciliation as tool_reconciliation
from sidecar.services._common import Decided, decided, moment
from sidecar.storage import keys
from sidecar.storage.api import CallWrite, LedgerReads, Store
from sidecar.storage.scans import Scans

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AuditPage:
    entries: list[audit.Entry]
    next_page_token: str


OPEN_STATES = (State.PREPARED, State.AWAITING_APPROVAL, State.STARTED, State.UNKNOWN)


@dataclass(frozen=True, slots=True)
class NamespaceStats:
    namespace: str
    usage: Usage
    # Open calls by state (the states of `OPEN_STATES`).
    by_state: dict[State, int]


class OperatorService:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        limits: Limits,
        policy: PolicySource | None = None,
        *,
        scans: Scans | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self.limits = limits
        self._policy = policy or FixedPolicy()
        # The audit walk, the statistics and the listings read many rows:
        # off the event loop.
        self._scans = scans or Scans(store)

    def now(self, view: LedgerReads) -> Now:
        return moment(self._clock, self._store, view)

    async def _decided(self, decide: Callable[[LedgerReads, Now], Decided]) -> Answer:
        """The answer of `decide`, its write durable; the audited action it
        wrote, if any, logged at info (once durable, as the audit has it)."""
        last: list[Decided] = []

        def deciding(view: LedgerReads) -> Decided:
            last[:] = [decide(view, self.now(view))]
            return last[0]

        answer = await decided(self._store, self._scans, deciding)
        write = last[0].write if last else None
        if write is not None and write.audit is not None:
            log_action(write.audit, tool=write.new.tool_name)
        return answer

    async def decide_approval(self, ref: CallRef, decision: ApprovalDecision) -> Answer:
        """Approves or rejects; the record and its audit entry are one write."""

        def decide(view: LedgerReads, now: Now) -> Decided:
            old = _load(view, ref)
            # Whether a rejected call keeps its input (`kept_inputs`).
            policy = self._policy.current()
            step = operator_rules.decide_approval(old, now, decision, policy)
            if isinstance(step.reply, EffectdError):
                return Decided(step.reply)
            action = Action.APPROVE if decision.approve else Action.REJECT
            fact = audit.call_fact(
                action,
                old,
                step.call,
                at_ns=now.wall_ns,
                actor=decision.approver,
                reason=decision.reason,
                details={"inputFingerprint": decision.input_fingerprint},
            )
            return Decided(step.reply, CallWrite(old, step.call, audit=fact))

        return await self._decided(decide)

    async def reconcile(self, ref: CallRef, order: ReconcileOrder) -> Answer:
        """Resolves a call of unknown outcome; the record, its evidence and
        the audit entry are one write."""

        def decide(view: LedgerReads, now: Now) -> Decided:
            old = _load(view, ref)
            # The quarantine in force when the write runs (ADR-010 R2
            # reloads): a reload before the write decides it again.
            policy = self._policy.current()
            step = operator_rules.reconcile(old, now, order, policy)
            if isinstance(step.reply, EffectdError):
                return Decided(step.reply)
            committed = order.resolution is Resolution.COMMITTED
            details = {"attempt": str(old.attempt)}
            if order.result is not None:
                details["resultDigest"] = order.result.digest
            if order.confirmed_dead_attempt:
                details["confirmedDeadAttempt"] = str(order.confirmed_dead_attempt)
            fact = audit.call_fact(
                Action.RECONCILE_COMMITTED
                if committed
                else Action.RECONCILE_NOT_EXECUTED,
                old,
                step.call,
                at_ns=now.wall_ns,
                actor=order.operator,
                reason=order.reason,
                evidence=order.evidence,
                details=details,
            )
            source = self._policy
            write = CallWrite(
                old, step.call, audit=fact, holds=lambda: source.current() is policy
            )
            return Decided(step.reply, write)

        return await self._decided(decide)

    async def enter_reconciliation(
        self,
        *,
        tool_name: str,
        namespace: str | None,
        operator: str,
        reason: str,
        batch: int = tool_reconciliation.BATCH,
    ) -> tool_reconciliation.Entered:
        """Makes every open call of `tool_name` in `namespace` (None: every
        namespace) a SIDE_EFFECT for good, each with its audit entry, in
        bounded batches (ADR-010 R2 "enter reconciliation")."""
        done = await tool_reconciliation.enter_reconciliation(
            self._store,
            self.now,
            tool_name=tool_name,
            namespace=namespace,
            operator=operator,
            reason=reason,
            batch=batch,
        )
        log.info(
            "tool %s put into reconciliation in %s by %s: %d open calls made a "
            "SIDE_EFFECT for good, %d were one already: %s",
            tool_name,
            f"namespace {namespace}" if namespace is not None else "every namespace",
            operator,
            sum(done.forced.values()),
            done.already,
            reason or "no reason given",
            extra={
                "action": audit.Action.ENTER_RECONCILIATION.value,
                "namespace": namespace,
                "tool": tool_name,
                "actor": operator,
            },
        )
        return done

    # -- the audit log ---------------------------------------------------------

    async def stats(self, namespace: str | None) -> list[NamespaceStats]:
        """The usage counters and open calls by state of one namespace, or of
        every one (None), from one snapshot. Counting by state reads the
        index entries of open calls only: bounded by the open-call quotas."""

        def count(view: LedgerReads) -> list[NamespaceStats]:
            counters = view.usages()
            if namespace is not None:
                counters = {namespace: counters.get(namespace, Usage())}
            by_state: dict[str, dict[State, int]] = {ns: {} for ns in counters}
            for state in OPEN_STATES:
                for key in view.calls_in_state(state, namespace):
                    ns = keys.namespace_of(key)
                    if ns in by_state:
                        by_state[ns][state] = by_state[ns].get(state, 0) + 1
            return [
                NamespaceStats(ns, counters[ns], by_state[ns])
                for ns in sorted(counters)
            ]

        return await self._scans.read(count)

    async def verify_audit(self) -> audit.Verdict:
        """Walks the whole chain on one snapshot, on a worker thread: it
        reads and hashes every entry."""

        def walk(view: LedgerReads) -> audit.Verdict:
            return audit.verify(view.audit_entries(), view.audit_head())

        return await self._scans.read(walk)

    async def list_audit(
        self,
        *,
        namespace: str,
        newest_first: bool,
        page_size: int,
        page_token: str,
    ) -> AuditPage:
        """Entries in sequence order (or reversed), only of `namespace` unless
        it is empty. Like ListToolCalls, a page may be short when the filter
        skips many entries: the work per page is bounded."""
        prefix = _token_prefix(namespace, newest_first=newest_first)
        after = paging.decode(page_token, prefix)
        resume = None if after is None else int.from_bytes(after[len(prefix) :], "big")
        budget = max(page_size * 10, 1000)

        def scan(view: LedgerReads) -> AuditPage:
            entries: list[audit.Entry] = []
            last = 0
            for examined, (sequence, raw) in enumerate(
                _walk(view, resume, newest_first=newest_first)
            ):
                if len(entries) == page_size or examined == budget:
                    return AuditPage(entries, paging.encode(prefix + _seq(last)))
                last = sequence
                try:
                    entry = audit.decode(raw)
                except audit.MalformedEntry as exc:
                    # Listed by VerifyAudit as the first bad entry; a listing
                    # still shows every readable one.
                    log.warning("audit entry %d cannot be read: %s", sequence, exc)
                    continue
                if not namespace or entry.fact.namespace == namespace:
                    entries.append(entry)
            return AuditPage(entries, "")

        return await self._scans.read(scan)


def _seq(sequence: int) -> bytes:
    return sequence.to_bytes(8, "big")


def _token_prefix(namespace: str, *, newest_first: bool) -> bytes:
    # A token continues only the listing it came from: same order, same filter.
    order = b"<" if newest_first else b">"
    return b"audit\x00" + order + namespace.encode() + b"\x00"


def _walk(
    view: LedgerReads, resume: int | None, *, newest_first: bool
) -> Iterator[tuple[int, bytes]]:
    """Stored entries after `resume` in the listing's order."""
    if not newest_first:
        yield from view.audit_entries(resume or 0)
        return
    # The store scans forward only: walk down from the head by sequence.
    head = view.audit_head()
    top = (0 if head is None else head.sequence) if resume is None else resume - 1
    for sequence in range(top, 0, -1):
        raw = view.audit_entry(sequence)
        if raw is not None:
            yield sequence, raw


def _load(view: LedgerReads, ref: CallRef) -> ToolCall:
    call = view.load_call(ref)
    if call is None:
        raise NotFound(
            f"no tool call {ref.run_id}:{ref.call_id} in namespace {ref.namespace}",
            {"namespace": ref.namespace, "runId": ref.run_id, "callId": ref.call_id},
        )
    return call


_DONE = {
    Action.APPROVE: "approved",
    Action.REJECT: "rejected",
    Action.RECONCILE_COMMITTED: "reconciled as committed",
    Action.RECONCILE_NOT_EXECUTED: "reconciled as not executed",
}


def log_action(fact: audit.Fact, *, tool: str) -> None:
    """An audited decision on one call, as an info line: the audit log keeps
    the whole fact, the daemon's log says that it happened."""
    log.info(
        "call %s/%s/%s (%s) %s by %s: %s",
        fact.namespace,
        fact.run_id,
        fact.call_id,
        tool,
        _DONE.get(fact.action, fact.action.value),
        fact.actor,
        fact.reason or "no reason given",
        extra={
            "action": fact.action.value,
            "namespace": fact.namespace,
            "run": fact.run_id,
            "call": fact.call_id,
            "tool": tool,
            "actor": fact.actor,
        },
    )
