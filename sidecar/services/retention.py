"""The compaction pass: applies `ledger.retention` to the stored calls.

A pass walks the by-state index of COMMITTED records in key order, a bounded
batch per write transaction, and replaces every record that is due by its
tombstone; then it deletes the tombstones past their lifetime, oldest first,
in bounded batches too. Each batch reads the clock when the writer runs it,
so a record acknowledged or changed meanwhile is judged as it is now. The
daemon runs a pass at start and then periodically (`sidecar.server`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sidecar.clock import Clock
from sidecar.ledger import retention
from sidecar.ledger.model import State
from sidecar.ledger.policy import Policy, PolicySource
from sidecar.services._common import committed
from sidecar.storage import records, tombstones
from sidecar.storage.api import Store, Table, WriteView

DEFAULT_BATCH = 256


@dataclass(frozen=True, slots=True)
class PassResult:
    """What one compaction pass did."""

    examined: int
    compacted: int
    transactions: int
    # Tombstones deleted after their lifetime.
    expired: int = 0


@dataclass(frozen=True, slots=True)
class _Batch:
    examined: int
    compacted: int
    # The last index key examined; None when the index is done.
    resume: bytes | None


class RetentionService:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        policy: PolicySource,
        *,
        batch: int = DEFAULT_BATCH,
    ) -> None:
        if batch < 1:
            raise ValueError("batch: must be at least 1")
        self._store = store
        self._clock = clock
        self._policy = policy
        self._batch = batch

    def _compact_batch(
        self, view: WriteView, *, policy: Policy, after: bytes | None
    ) -> _Batch:
        now_ns = self._clock.wall_ns()
        prefix = records.state_prefix(State.COMMITTED)
        keys = []
        for key, _ in view.scan(Table.CALL_STATES, prefix, after=after):
            keys.append(key)
            if len(keys) == self._batch:
                break
        compacted = 0
        for key in keys:
            call = records.load_call_at(view, key[len(prefix) :])
            if call is not None and retention.is_due(call, policy, now_ns):
                tombstones.compact(view, call, retention.tombstone(call, now_ns))
                compacted += 1
        resume = keys[-1] if len(keys) == self._batch else None
        return _Batch(len(keys), compacted, resume)

    def _expire_batch(self, view: WriteView, *, policy: Policy) -> tuple[int, bool]:
        before = retention.tombstones_expire_before(policy, self._clock.wall_ns())
        return tombstones.expire(view, before, self._batch)

    async def compact(self) -> PassResult:
        """One pass over every COMMITTED record, then over the tombstones
        past their lifetime, under the policy in force when the pass began."""
        policy = self._policy.current()
        after: bytes | None = None
        examined = compacted = transactions = expired = 0
        while True:
            batch = await committed(
                self._store,
                functools.partial(self._compact_batch, policy=policy, after=after),
            )
            examined += batch.examined
            compacted += batch.compacted
            transactions += 1
            if batch.resume is None:
                break
            after = batch.resume
        more = True
        while more:
            deleted, more = await committed(
                self._store, functools.partial(self._expire_batch, policy=policy)
            )
            expired += deleted
            transactions += 1
        return PassResult(examined, compacted, transactions, expired)
