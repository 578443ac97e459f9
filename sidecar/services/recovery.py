"""The recovery service: applies `ledger.recovery` to the stored calls of a run.

A plan is made a page at a time, in call key order. A page is read on a
snapshot, on a worker thread (`storage.scans`), which never holds up the
writer. Only the calls of the page that recovery changes (a STARTED call
found stale becomes UNKNOWN; a call of a tool the policy forces to
SIDE_EFFECT records it) go through the writer, in one transaction bounded
by the page, which judges each of them again as it is then. So the plan an
agent gets is the durable state: a STARTED call found stale is UNKNOWN on
disk before the plan that says RECONCILE is released, and the writer is
never held for the size of the run. Nothing here starts or executes a call.

A page continues after the key of the previous page's last call (the page
token, `ledger.paging`), which must lie in the run's own key range: a
token of another run or namespace is refused. Paging is stable under
concurrent writes: every call that exists for the whole paging is in
exactly one page; a call added meanwhile is in a later page if its key
sorts after the page being read, and in none otherwise.

A COMMITTED record's item never changes by recovery (nothing settles or
enforces on it), so `recover_rows` answers it from its plan row
(`storage.plan_rows`), undecoded: the action and effect decided from the
row's head by the same rules, the rest the row's stored summary, which the
gRPC boundary answers as it is. Every other record is decoded and planned
as `recover_page` does; a record without a row is too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sidecar.clock import Clock
from sidecar.errors import EffectdError, NotFound, UnsupportedKeyScheme
from sidecar.ledger import paging, recovery, rules
from sidecar.ledger.model import CallRef, Effect, ToolCall
from sidecar.ledger.policy import Policy, PolicySource
from sidecar.ledger.rules import Now
from sidecar.ledger.validation import Limits
from sidecar.services._common import bulk_committed, committed, moment
from sidecar.storage import keys, plan_rows
from sidecar.storage.api import LedgerReads, LedgerWrites, Store
from sidecar.storage.scans import Scans


@dataclass(frozen=True, slots=True)
class Recovered:
    plan: recovery.Plan
    # STARTED calls this recovery turned UNKNOWN.
    settled: int
    # The token of the next page; "" when the run has no more calls.
    next_page_token: str = ""


class StoredItem(NamedTuple):
    """A plan item answered from a COMMITTED record's plan row."""

    action: recovery.RecoveryAction
    effect: Effect
    # The record without its history, in the wire form of its answer.
    summary: bytes
    # The result and the idempotency key as they lie in `summary`: each its
    # length, then its bytes.
    result: bytes
    idempotency_key: bytes


@dataclass(frozen=True, slots=True)
class RecoveredRows:
    """A page of a plan, each item planned or stored, in key order."""

    items: list[recovery.PlanItem | StoredItem]
    interrupted: bool
    settled: int
    next_page_token: str


@dataclass(frozen=True, slots=True)
class _Read:
    # (record key, record or its plan row) of the page, in key order.
    rows: list[tuple[bytes, ToolCall | bytes]]
    # The last key of the page when the run has more calls.
    more_after: bytes | None
    # The keys of the rows recovery would change, judged on the same snapshot.
    changing: list[bytes]


def _read_page(
    view: LedgerReads,
    *,
    prefix: bytes,
    after: bytes | None,
    size: int,
    stored: bool,
    now: Callable[[LedgerReads], Now],
    policy: Policy,
) -> _Read:
    rows: list[tuple[bytes, ToolCall | bytes]] = []
    more_after = None
    # The plan shows no history; a call that recovery changes is read
    # again, whole, by the write.
    for key, shown in view.plan(prefix, after=after, rows=stored):
        if len(rows) == size:
            more_after = rows[-1][0]
            break
        if isinstance(shown, UnsupportedKeyScheme):
            raise shown
        rows.append((key, shown))
    at = now(view)
    # A plan row is a COMMITTED record's, which recovery never changes.
    changing = [
        key
        for key, call in rows
        if not isinstance(call, bytes)
        and _recovered(call, at, policy)[0].revision != call.revision
    ]
    return _Read(rows, more_after, changing)


def _recovered(call: ToolCall, now: Now, policy: Policy) -> tuple[ToolCall, bool]:
    """`call` after recovery, and whether recovery settled it."""
    settled = rules.settle(call, now)
    # ADR-010 R2: a plan made under a forced effect holds the call.
    return rules.enforce(settled, policy, now), settled.revision != call.revision


class RecoveryService:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        limits: Limits,
        policy: PolicySource,
        *,
        scans: Scans | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self.limits = limits
        self._policy = policy
        self._scans = scans or Scans(store)

    def now(self, view: LedgerReads) -> Now:
        return moment(self._clock, self._store, view)

    async def recover(self, namespace: str, run_id: str) -> Recovered:
        """The whole plan of a run, made page by page (each page its own
        bounded write, if any); `next_page_token` is always ""."""
        items: list[recovery.PlanItem] = []
        settled = 0
        token = ""
        while True:
            page = await self.recover_page(
                namespace,
                run_id,
                page_size=self.limits.max_page_size,
                page_token=token,
            )
            items.extend(page.plan.items)
            settled += page.settled
            token = page.next_page_token
            if not token:
                return Recovered(recovery.Plan(tuple(items)), settled)

    async def recover_page(
        self, namespace: str, run_id: str, *, page_size: int, page_token: str
    ) -> Recovered:
        """The plan of at most `page_size` calls of a run, after the call
        the token names, after stale STARTED calls became UNKNOWN; every
        record decoded.

        Raises:
            InvalidArgument: the token is not one of this run's plan.
        """
        rows, settled, policy, token = await self._page(
            namespace, run_id, page_size, page_token, stored=False
        )
        calls = [row for _, row in rows if not isinstance(row, bytes)]
        return Recovered(recovery.plan(calls, policy), settled, token)

    async def recover_rows(
        self, namespace: str, run_id: str, *, page_size: int, page_token: str
    ) -> RecoveredRows:
        """`recover_page`, with each COMMITTED record that has a plan row
        answered from it (`StoredItem`) instead of decoded and planned."""
        rows, settled, policy, token = await self._page(
            namespace, run_id, page_size, page_token, stored=True
        )
        items: list[recovery.PlanItem | StoredItem] = []
        interrupted = False
        # The rules, applied once per distinct row head rather than per row:
        # a run's calls share a few tools and flags.
        actions = [
            recovery.committed_action(
                acknowledged=bool(flags & plan_rows.ACKNOWLEDGED),
                rejected=bool(flags & plan_rows.REJECTED),
            )
            for flags in range(plan_rows.ACKNOWLEDGED + plan_rows.REJECTED + 1)
        ]
        effects: dict[tuple[str, int], Effect] = {}
        for _, row in rows:
            if not isinstance(row, bytes):
                effect = policy.effect_for(row)
                action = recovery.action(row, effect)
                interrupted = interrupted or action in recovery.INTERRUPTING
                items.append(recovery.PlanItem(row, action, effect))
                continue
            flags, code, tool, summary, result, key = plan_rows.parts(row)
            known = effects.get((tool, code))
            if known is None:
                known = policy.effect_of(tool, plan_rows.effect_of_code(code))
                effects[tool, code] = known
            # A COMMITTED record never interrupts the run.
            items.append(StoredItem(actions[flags], known, summary, result, key))
        return RecoveredRows(items, interrupted, settled, token)

    async def _page(
        self,
        namespace: str,
        run_id: str,
        page_size: int,
        page_token: str,
        *,
        stored: bool,
    ) -> tuple[list[tuple[bytes, ToolCall | bytes]], int, Policy, str]:
        """The rows of a page after recovery (records, or plan rows when
        `stored`), how many it settled, the policy it was judged by, and the
        next page's token."""
        prefix = keys.run_prefix(namespace, run_id)
        after = paging.decode(page_token, prefix)
        policy = self._policy.current()
        read = await self._scans.read(
            functools.partial(
                _read_page,
                prefix=prefix,
                after=after,
                size=page_size,
                stored=stored,
                now=self.now,
                policy=policy,
            )
        )
        rows = read.rows
        settled = 0
        if read.changing:

            def apply(view: LedgerWrites) -> tuple[dict[bytes, ToolCall], int, Policy]:
                # In the write transaction: a reload that took effect, and
                # each record as it is now, decide.
                now = self.now(view)
                policy = self._policy.current()
                changed: dict[bytes, ToolCall] = {}
                settled = 0
                for key, seen in read.rows:
                    if isinstance(seen, bytes) or (
                        _recovered(seen, now, policy)[0].revision == seen.revision
                    ):
                        continue
                    old = view.load_call_at(key)
                    if old is None:
                        continue
                    new, was_settled = _recovered(old, now, policy)
                    if new.revision != old.revision:
                        view.write_call(old, new)
                        settled += was_settled
                    changed[key] = new
                return changed, settled, policy

            changed, settled, policy = await bulk_committed(self._store, apply)
            rows = [(key, changed.get(key, row)) for key, row in rows]
        # Under the policy the page was judged by, as recovery recorded it.
        token = "" if read.more_after is None else paging.encode(read.more_after)
        return rows, settled, policy, token

    async def acknowledge(
        self, namespace: str, run_id: str, call_ids: Sequence[str]
    ) -> list[ToolCall]:
        """Marks committed calls as delivered; all of them or none."""

        def apply(view: LedgerWrites) -> list[ToolCall]:
            now = self.now(view)
            done = []
            for index, call_id in enumerate(call_ids):
                try:
                    done.append(
                        _acknowledge(view, CallRef(namespace, run_id, call_id), now)
                    )
                except EffectdError as exc:
                    exc.metadata["index"] = str(index)
                    raise
            return done

        return await committed(self._store, apply)


def _acknowledge(view: LedgerWrites, ref: CallRef, now: Now) -> ToolCall:
    old = view.load_call(ref)
    if old is None:
        raise NotFound(
            f"no tool call {ref.run_id}:{ref.call_id} in namespace {ref.namespace}",
            {"namespace": ref.namespace, "runId": ref.run_id, "callId": ref.call_id},
        )
    new = rules.delivered(old, now)
    if new.revision != old.revision:
        view.write_call(old, new)
    return new
