"""The ledger service: applies the rules of `ledger.rules` to stored records.

Each request on one call reads the record on a snapshot, runs the rule with
the moment it read it, and, when the call changes, saves the new record by
compare-and-swap (`Store.save_call`): only while the stored record is still
the one decided on (for a new call: while the store holds no record and no
tombstone of it), else it reads and decides again (`_common.decided`). So
read, decision and write are one atomic step on the record, a repeat that
changes nothing (the duplicate of a committed call) is answered from the
snapshot alone, and a reply is released only after the commit.

Quotas (`ledger.quota`) refuse only a prepare that creates a record; every
request that finishes or records work already done (StartTool, CommitTool,
ReportUnknown, Heartbeat, and the operator's and recovery's writes) is never
refused by a quota: a tool that ran must always be able to record its result,
and committing is what frees a namespace's open-call quota.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sidecar.clock import Clock
from sidecar.errors import (
    EffectdError,
    NotFound,
    QuotaExceeded,
    UnsupportedKeyScheme,
)
from sidecar.ledger import paging, retention, rules
from sidecar.ledger.model import CallRef, Result, State, ToolCall
from sidecar.ledger.policy import Policy, PolicySource
from sidecar.ledger.quota import Quotas
from sidecar.ledger.rules import Answer, Now, PrepareSpec, Step
from sidecar.ledger.validation import Limits
from sidecar.services._common import Decided, committed, decided, moment
from sidecar.services.prepares import in_scheme, prepare_one, with_lease
from sidecar.services.recent_calls import RecentCalls, made, stepped
from sidecar.storage import keys
from sidecar.storage.api import CallWrite, LedgerReads, LedgerWrites, Store
from sidecar.storage.scans import Scans


@dataclass(frozen=True, slots=True)
class Page:
    calls: list[ToolCall]
    next_page_token: str
    # The namespaces the listing covers, in key order.
    namespaces: tuple[str, ...] = ()


class LedgerService:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        limits: Limits,
        policy: PolicySource,
        *,
        quotas: Quotas | None = None,
        scans: Scans | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self.limits = limits
        self._policy = policy
        self._quotas = quotas or Quotas()
        # The records this daemon saved last, kept on a store whose saves
        # are statements: there a read before a save is a round trip the save
        # does not need (`_on_recent`).
        self._recent = RecentCalls()
        # Listings read many rows: off the event loop; point reads too, on a
        # store whose reads may wait.
        self._scans = scans or Scans(store)

    def now(self, view: LedgerReads) -> Now:
        return moment(self._clock, self._store, view)

    def policy(self) -> Policy:
        """The policy in force now."""
        return self._policy.current()

    def _remembers(self) -> Callable[[ToolCall], None] | None:
        return self._recent.remember if self._store.saves_by_statement else None

    async def _decided(self, decide: Callable[[LedgerReads], Decided]) -> Answer:
        return await decided(self._store, self._scans, decide, saved=self._remembers())

    async def _changed(
        self, ref: CallRef, rule: Callable[[ToolCall, Now, Policy], Step]
    ) -> Answer:
        """`rule`'s step on the call's record, a change nearly every time
        (`decided`'s `writes`); first on the record this daemon saved last,
        if it holds it (`RecentCalls`)."""
        if self._store.saves_by_statement:
            answer = await stepped(
                self._store,
                self._recent,
                ref,
                lambda old, view: self._step(old, view, rule),
            )
            if answer is not None:
                return answer
        mutation = self._mutation(ref, rule)
        return await decided(
            self._store,
            self._scans,
            mutation,
            writes=True,
            saved=self._remembers(),
        )

    def _mutation(
        self, ref: CallRef, rule: Callable[[ToolCall, Now, Policy], Step]
    ) -> Callable[[LedgerReads], Decided]:
        def decide(view: LedgerReads) -> Decided:
            old, tomb = view.find_call(ref)
            if old is None:
                return Decided(_not_found(ref, tomb))
            return self._step(old, view, rule)

        return decide

    def _step(
        self,
        old: ToolCall,
        view: LedgerReads,
        rule: Callable[[ToolCall, Now, Policy], Step],
    ) -> Decided:
        policy = self._policy.current()
        step = rule(old, self.now(view), policy)
        if step.call.revision == old.revision:
            return Decided(step.reply)
        return Decided(step.reply, self._saving(old, step.call, policy))

    async def prepare(self, spec: PrepareSpec) -> Answer:
        """A new call saved with no read before it on a store whose saves
        are statements (`recent_calls.made`: the insert is the compare);
        else, and for a call stored, decided on a read."""

        def decide(view: LedgerReads) -> Decided:
            return self._prepare_decision(view, spec)

        if self._store.saves_by_statement:
            answer = await made(self._store, self._recent, spec.ref, decide)
            if answer is not None:
                return answer
        return await self._decided(decide)

    def _prepare_decision(self, view: LedgerReads, asked: PrepareSpec) -> Decided:
        """A repeat that changes nothing (the duplicate of a committed call, a
        call in progress under a live lease, a refusal, a compacted call) is
        answered from the snapshot; a new call is saved within its
        namespace's quotas."""
        policy = self._policy.current()
        spec = with_lease(asked, policy)
        old, tomb = view.find_call(spec.ref)
        if tomb is not None:
            # contract §4.7: the tombstone still refuses a re-execution.
            return Decided(
                retention.duplicate_prepare(
                    tomb, in_scheme(spec, tomb.fingerprint_scheme)
                )
            )
        if old is not None:
            spec = in_scheme(spec, old.fingerprint_scheme)
        step = rules.prepare(old, spec, self.now(view), policy)
        if old is not None and step.call.revision == old.revision:
            return Decided(step.reply)
        return Decided(step.reply, self._saving(old, step.call, policy))

    def _saving(self, old: ToolCall | None, new: ToolCall, policy: Policy) -> CallWrite:
        """The write of `new`, decided under `policy`: a reload that took
        effect before the write decides it again (its audit entry comes
        first); a new call within the namespace's quotas."""
        source = self._policy
        return CallWrite(
            old,
            new,
            self._quotas if old is None else None,
            holds=lambda: source.current() is policy,
        )

    async def prepare_many(self, specs: Sequence[PrepareSpec]) -> list[Answer]:
        """All in one transaction; one refusal and nothing is written."""

        def apply(view: LedgerWrites) -> list[Answer]:
            now = self.now(view)
            policy = self._policy.current()
            answers = []
            for index, asked in enumerate(specs):
                spec = with_lease(asked, policy)
                try:
                    reply = prepare_one(view, spec, now, policy, self._quotas)
                except QuotaExceeded as exc:
                    exc.metadata["index"] = str(index)
                    raise
                if isinstance(reply, EffectdError):
                    reply.metadata["index"] = str(index)
                    raise reply
                answers.append(reply)
            return answers

        return await committed(self._store, apply)

    async def start(
        self,
        ref: CallRef,
        *,
        lease_ms: int,
        retry: bool,
        expected_revision: int | None,
        actor: str = rules.AGENT,
    ) -> Answer:
        return await self._changed(
            ref,
            lambda call, now, policy: rules.start(
                call,
                now,
                lease_ms=lease_ms or policy.default_lease_ms,
                retry=retry,
                expected_revision=expected_revision,
                policy=policy,
                actor=actor,
            ),
        )

    async def commit(
        self,
        ref: CallRef,
        *,
        attempt: int,
        result: Result,
        expected_revision: int | None,
        actor: str = rules.AGENT,
        acknowledge: bool = False,
    ) -> Answer:
        return await self._changed(
            ref,
            lambda call, now, policy: rules.commit(
                call,
                now,
                attempt=attempt,
                result=result,
                expected_revision=expected_revision,
                actor=actor,
                acknowledge=acknowledge,
                policy=policy,
            ),
        )

    async def report_unknown(
        self, ref: CallRef, *, attempt: int, reason: str, actor: str = rules.AGENT
    ) -> Answer:
        return await self._changed(
            ref,
            lambda call, now, policy: rules.report_unknown(
                call,
                now,
                attempt=attempt,
                reason=reason,
                policy=policy,
                actor=actor,
            ),
        )

    async def heartbeat(
        self, ref: CallRef, *, attempt: int, lease_ms: int, actor: str = rules.AGENT
    ) -> Answer:
        return await self._changed(
            ref,
            lambda call, now, policy: rules.heartbeat(
                call,
                now,
                attempt=attempt,
                lease_ms=lease_ms or policy.default_lease_ms,
                actor=actor,
            ),
        )

    async def get(self, ref: CallRef) -> ToolCall:
        """The record; NOT_FOUND, with metadata saying so, for a call that
        was compacted after the retention window (contract §4.7)."""

        def load(view: LedgerReads) -> ToolCall:
            call, tomb = view.find_call(ref)
            if call is None:
                raise _not_found(ref, tomb)
            return call

        return await self._scans.point_read(load)

    async def list(
        self,
        namespaces: frozenset[str] | None,
        *,
        run_id: str,
        states: frozenset[State],
        page_size: int,
        page_token: str,
    ) -> Page:
        """Calls of `namespaces` (None: every namespace the store holds) in
        key order, namespace after namespace; a page may hold fewer than
        `page_size` calls when a state filter skips many records (the scan
        per page is bounded). A page token continues only inside the same
        namespaces (`paging.decode_across`)."""

        def prefix(namespace: str) -> bytes:
            if run_id:
                return keys.run_prefix(namespace, run_id)
            return keys.namespace_prefix(namespace)

        resume = paging.decode_across(page_token, prefix, namespaces)
        budget = max(page_size * 10, 1000)

        def scan(view: LedgerReads) -> Page:
            # Key order is namespace order: no namespace character sorts
            # before the NUL that ends it.
            searched = tuple(
                sorted(view.usages() if namespaces is None else namespaces)
            )
            todo = list(searched)
            after = None
            if resume is not None:
                first, after = resume
                todo = [first, *(n for n in searched if n > first)]
            calls: list[ToolCall] = []
            last = b""
            examined = 0
            for i, namespace in enumerate(todo):
                for key, call in view.calls(
                    prefix(namespace), after=after if i == 0 else None
                ):
                    if len(calls) == page_size or examined == budget:
                        return Page(calls, paging.encode(last), searched)
                    examined += 1
                    last = key
                    if isinstance(call, UnsupportedKeyScheme):
                        raise call
                    if not states or call.state in states:
                        calls.append(call)
            return Page(calls, "", searched)

        return await self._scans.read(scan)

    async def settle_earlier_incarnations(self) -> int:
        """At start: every STARTED record whose holder restarted becomes
        UNKNOWN, so a side effect there answers RECONCILE (ADR-010 D3). On an
        exclusive store that is every earlier incarnation; on a shared one,
        the earlier incarnations of this daemon (`ownership.register` ended
        them) and of any other daemon that restarted: a live daemon's calls
        are never settled here, and a lapsed one's are left to the
        lease sweep."""

        def apply(view: LedgerWrites) -> int:
            now = self.now(view)
            settled = 0
            keys = list(view.calls_in_state(State.STARTED))
            for key in keys:
                try:
                    old = view.load_call_at(key)
                except UnsupportedKeyScheme:
                    continue  # a newer daemon's call: refused whenever touched
                if old is None or not rules.holder_restarted(old, now):
                    continue
                view.write_call(old, rules.settle(old, now))
                settled += 1
            return settled

        return await committed(self._store, apply)


def _not_found(ref: CallRef, tomb: retention.Tombstone | None = None) -> NotFound:
    meta = {"namespace": ref.namespace, "runId": ref.run_id, "callId": ref.call_id}
    message = f"no tool call {ref.run_id}:{ref.call_id} in namespace {ref.namespace}"
    if tomb is not None:
        meta.update(retention.metadata(tomb))
        message = (
            f"tool call {ref.run_id}:{ref.call_id} in namespace {ref.namespace} "
            "was committed and compacted after the retention window"
        )
    return NotFound(message, meta)
