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

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from sidecar.clock import Clock
from sidecar.errors import (
    EffectdError,
    NotFound,
    QuotaExceeded,
    UnsupportedKeyScheme,
)
from sidecar.ledger import fingerprint, paging, quota, retention, rules
from sidecar.ledger.model import FINGERPRINT_V2, CallRef, Result, State, ToolCall
from sidecar.ledger.policy import Policy, PolicySource
from sidecar.ledger.quota import Quotas
from sidecar.ledger.rules import Answer, Now, PrepareSpec, Step
from sidecar.ledger.validation import Limits
from sidecar.services._common import Decided, committed, decided, moment
from sidecar.storage import calls, records, tombstones, usage
from sidecar.storage.api import (
    CallWrite,
    Conflict,
    ReadView,
    Store,
    Table,
    WriteView,
)
from sidecar.storage.scans import Scans

# Records `RecentCalls` keeps: the calls in flight at one daemon.
RECENT_CALLS = 4096


class RecentCalls:
    """The records this daemon saved last, by call, at most `size` (the
    oldest forgotten first): what the next step of a call in flight (a
    commit after its start, a heartbeat) is decided on without reading it
    again. Never an answer by itself: a decision on one is saved by
    compare-and-swap, which fails when another write came between."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._calls: dict[CallRef, ToolCall] = {}

    def __len__(self) -> int:
        return len(self._calls)

    def get(self, ref: CallRef) -> ToolCall | None:
        return self._calls.get(ref)

    def remember(self, call: ToolCall) -> None:
        calls = self._calls
        calls.pop(call.ref, None)
        calls[call.ref] = call
        if len(calls) > self._size:
            del calls[next(iter(calls))]

    def forget(self, ref: CallRef) -> None:
        self._calls.pop(ref, None)


class _Unread(Exception):
    """A rule decided on a remembered record read the store."""


class _NoReads:
    """The view of a decision on a remembered record: nothing to read."""

    def get(self, table: Table, key: bytes) -> bytes | None:
        raise _Unread(table)

    def scan(
        self, table: Table, prefix: bytes, *, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        raise _Unread(table)


_NO_READS = _NoReads()


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
        self._recent = RecentCalls(RECENT_CALLS)
        # Listings read many rows: off the event loop; point reads too, on a
        # store whose reads may wait.
        self._scans = scans or Scans(store)

    def now(self, view: ReadView) -> Now:
        return moment(self._clock, self._store, view)

    def policy(self) -> Policy:
        """The policy in force now."""
        return self._policy.current()

    def _remembers(self) -> Callable[[ToolCall], None] | None:
        return self._recent.remember if self._store.saves_by_statement else None

    async def _decided(self, decide: Callable[[ReadView], Decided]) -> Answer:
        return await decided(self._store, self._scans, decide, saved=self._remembers())

    async def _changed(
        self, ref: CallRef, rule: Callable[[ToolCall, Now, Policy], Step]
    ) -> Answer:
        """`rule`'s step on the call's record, a change nearly every time
        (`decided`'s `writes`); first on the record this daemon saved last,
        if it holds it (`RecentCalls`)."""
        answer = await self._on_recent(ref, rule)
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

    async def _on_recent(
        self, ref: CallRef, rule: Callable[[ToolCall, Now, Policy], Step]
    ) -> Answer | None:
        """`rule`'s step decided on the record this daemon saved last, with
        no read, and saved by compare-and-swap: the compare proves the
        record still the one decided on. None when that cannot be: no such
        record, a step that changes nothing (its answer needs the stored
        record, read), a rule that reads the store (another daemon's
        lease), or a compare lost."""
        old = self._recent.get(ref) if self._store.saves_by_statement else None
        if old is None:
            return None
        policy = self._policy.current()
        try:
            step = rule(old, self.now(_NO_READS), policy)
        except _Unread:
            return None
        if step.call.revision == old.revision:
            return None
        try:
            await self._store.save_call(self._saving(old, step.call, policy))
        except Conflict:
            self._recent.forget(ref)
            return None
        self._recent.remember(step.call)
        if isinstance(step.reply, EffectdError):
            raise step.reply
        return step.reply

    def _mutation(
        self, ref: CallRef, rule: Callable[[ToolCall, Now, Policy], Step]
    ) -> Callable[[ReadView], Decided]:
        def decide(view: ReadView) -> Decided:
            old, tomb = calls.find(view, ref)
            if old is None:
                return Decided(_not_found(ref, tomb))
            policy = self._policy.current()
            step = rule(old, self.now(view), policy)
            if step.call.revision == old.revision:
                return Decided(step.reply)
            return Decided(step.reply, self._saving(old, step.call, policy))

        return decide

    async def prepare(self, spec: PrepareSpec) -> Answer:
        return await self._decided(lambda view: self._prepare_decision(view, spec))

    def _prepare_decision(self, view: ReadView, asked: PrepareSpec) -> Decided:
        """A repeat that changes nothing (the duplicate of a committed call, a
        call in progress under a live lease, a refusal, a compacted call) is
        answered from the snapshot; a new call is saved within its
        namespace's quotas."""
        policy = self._policy.current()
        spec = _with_lease(asked, policy)
        old, tomb = calls.find(view, spec.ref)
        if tomb is not None:
            # contract §4.7: the tombstone still refuses a re-execution.
            return Decided(
                retention.duplicate_prepare(
                    tomb, _in_scheme(spec, tomb.fingerprint_scheme)
                )
            )
        if old is not None:
            spec = _in_scheme(spec, old.fingerprint_scheme)
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

        def apply(view: WriteView) -> list[Answer]:
            now = self.now(view)
            policy = self._policy.current()
            answers = []
            for index, asked in enumerate(specs):
                spec = _with_lease(asked, policy)
                try:
                    reply = _prepare_one(view, spec, now, policy, self._quotas)
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

        def load(view: ReadView) -> ToolCall:
            call = records.load_call(view, ref)
            if call is None:
                raise _not_found(ref, tombstones.load(view, ref))
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
                return records.run_prefix(namespace, run_id)
            return records.namespace_prefix(namespace)

        resume = paging.decode_across(page_token, prefix, namespaces)
        budget = max(page_size * 10, 1000)

        def scan(view: ReadView) -> Page:
            # Key order is namespace order: no namespace character sorts
            # before the NUL that ends it.
            searched = tuple(
                sorted(usage.stored(view) if namespaces is None else namespaces)
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
                for key, raw in view.scan(
                    Table.CALLS, prefix(namespace), after=after if i == 0 else None
                ):
                    if len(calls) == page_size or examined == budget:
                        return Page(calls, paging.encode(last), searched)
                    examined += 1
                    last = key
                    call = records.decode_call(raw)
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

        def apply(view: WriteView) -> int:
            now = self.now(view)
            settled = 0
            keys = [
                k
                for k, _ in view.scan(
                    Table.CALL_STATES, records.state_prefix(State.STARTED)
                )
            ]
            for key in keys:
                try:
                    old = records.load_call_at(view, key[1:])
                except UnsupportedKeyScheme:
                    continue  # a newer daemon's call: refused whenever touched
                if old is None or not rules.holder_restarted(old, now):
                    continue
                records.save_call(view, old, rules.settle(old, now))
                settled += 1
            return settled

        return await committed(self._store, apply)


def _with_lease(spec: PrepareSpec, policy: Policy) -> PrepareSpec:
    """`spec` with the policy's default lease when it asks for none."""
    if spec.lease_ms:
        return spec
    return dataclasses.replace(spec, lease_ms=policy.default_lease_ms)


def _prepare_one(
    view: WriteView, spec: PrepareSpec, now: Now, policy: Policy, quotas: Quotas
) -> Answer | EffectdError:
    """The answer of one prepare.

    Raises:
        QuotaExceeded: the prepare would create a record past the namespace's
            open-call or stored-byte quota; raised (not returned), so the
            write function leaves nothing behind. A repeated prepare of an
            existing record is always answered.
    """
    old = records.load_call(view, spec.ref)
    if old is None:
        tomb = tombstones.load(view, spec.ref)
        if tomb is not None:
            # contract §4.7: the tombstone still refuses a re-execution.
            return retention.duplicate_prepare(
                tomb, _in_scheme(spec, tomb.fingerprint_scheme)
            )
    else:
        spec = _in_scheme(spec, old.fingerprint_scheme)
    step = rules.prepare(old, spec, now, policy)
    if old is None and not quotas.limits_storage:
        records.save_call(view, old, step.call)
    elif old is None:
        namespace = spec.ref.namespace
        before = usage.load(view, namespace)
        records.save_call(view, old, step.call)
        # Measured after the save: the stored size is the encoded record's.
        refusal = quota.refuse_growth(
            namespace, before, usage.load(view, namespace), quotas
        )
        if refusal is not None:
            raise refusal
    elif step.call.revision != old.revision:
        records.save_call(view, old, step.call)
    return step.reply


def _in_scheme(spec: PrepareSpec, scheme: int) -> PrepareSpec:
    """`spec` with its input fingerprinted in `scheme`, to be compared with a
    stored call whose fingerprint is of that scheme (one stored before the
    input's kind was hashed keeps comparing with inputs of its own kind)."""
    if scheme == FINGERPRINT_V2:
        return spec
    return dataclasses.replace(spec, fingerprint=fingerprint.of(spec.input, scheme))


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
