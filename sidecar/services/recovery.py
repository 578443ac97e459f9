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
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sidecar.clock import Clock
from sidecar.errors import EffectdError, NotFound
from sidecar.ledger import paging, recovery, rules
from sidecar.ledger.model import CallRef, ToolCall
from sidecar.ledger.policy import Policy, PolicySource
from sidecar.ledger.rules import Now
from sidecar.ledger.validation import Limits
from sidecar.services._common import committed, moment
from sidecar.storage import records
from sidecar.storage.api import ReadView, Store, Table, WriteView
from sidecar.storage.scans import Scans


@dataclass(frozen=True, slots=True)
class Recovered:
    plan: recovery.Plan
    # STARTED calls this recovery turned UNKNOWN.
    settled: int
    # The token of the next page; "" when the run has no more calls.
    next_page_token: str = ""


@dataclass(frozen=True, slots=True)
class _Read:
    # (record key, record) of the page, in key order.
    rows: list[tuple[bytes, ToolCall]]
    # The last key of the page when the run has more calls.
    more_after: bytes | None
    # The keys of the rows recovery would change, judged on the same snapshot.
    changing: list[bytes]


def _read_page(
    view: ReadView,
    *,
    prefix: bytes,
    after: bytes | None,
    size: int,
    now: Callable[[ReadView], Now],
    policy: Policy,
) -> _Read:
    rows: list[tuple[bytes, ToolCall]] = []
    more_after = None
    for key, raw in view.scan(Table.CALLS, prefix, after=after):
        if len(rows) == size:
            more_after = rows[-1][0]
            break
        # The plan shows no history; a call that recovery changes is read
        # again, whole, by the write.
        rows.append((key, records.decode_call(raw, history=False)))
    at = now(view)
    changing = [
        key
        for key, call in rows
        if _recovered(call, at, policy)[0].revision != call.revision
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

    def now(self, view: ReadView) -> Now:
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
        the token names, after stale STARTED calls became UNKNOWN.

        Raises:
            InvalidArgument: the token is not one of this run's plan.
        """
        prefix = records.run_prefix(namespace, run_id)
        after = paging.decode(page_token, prefix)
        policy = self._policy.current()
        read = await self._scans.read(
            functools.partial(
                _read_page,
                prefix=prefix,
                after=after,
                size=page_size,
                now=self.now,
                policy=policy,
            )
        )
        calls = dict(read.rows)
        settled = 0
        if read.changing:

            def apply(view: WriteView) -> tuple[dict[bytes, ToolCall], int, Policy]:
                # In the write transaction: a reload that took effect, and
                # each record as it is now, decide.
                now = self.now(view)
                policy = self._policy.current()
                changed: dict[bytes, ToolCall] = {}
                settled = 0
                for key, seen in read.rows:
                    if _recovered(seen, now, policy)[0].revision == seen.revision:
                        continue
                    old = records.load_call_at(view, key)
                    if old is None:
                        continue
                    new, was_settled = _recovered(old, now, policy)
                    if new.revision != old.revision:
                        records.save_call(view, old, new)
                        settled += was_settled
                    changed[key] = new
                return changed, settled, policy

            changed, settled, policy = await committed(self._store, apply)
            calls.update(changed)
        # Under the policy the page was judged by, as recovery recorded it.
        plan = recovery.plan(calls.values(), policy)
        token = "" if read.more_after is None else paging.encode(read.more_after)
        return Recovered(plan, settled, token)

    async def acknowledge(
        self, namespace: str, run_id: str, call_ids: Sequence[str]
    ) -> list[ToolCall]:
        """Marks committed calls as delivered; all of them or none."""

        def apply(view: WriteView) -> list[ToolCall]:
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


def _acknowledge(view: WriteView, ref: CallRef, now: Now) -> ToolCall:
    old = records.load_call(view, ref)
    if old is None:
        raise NotFound(
            f"no tool call {ref.run_id}:{ref.call_id} in namespace {ref.namespace}",
            {"namespace": ref.namespace, "runId": ref.run_id, "callId": ref.call_id},
        )
    new = rules.delivered(old, now)
    if new.revision != old.revision:
        records.save_call(view, old, new)
    return new
