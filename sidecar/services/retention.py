"""The compaction pass: applies `ledger.retention` to the stored calls.

A pass walks the retention index (`storage.retention_times`: COMMITTED
records by acknowledgement and last change) on read snapshots (which never
hold up the writer), a bounded chunk per snapshot read on a worker thread
(`storage.scans`, never on the event loop), and collects the records that
are due; it reads each part of the index only up to the first entry that is
not due yet, so a pass costs what it compacts, not what the store holds.
Then it replaces them by their tombstones in write transactions of a bounded
batch, each judging every record again as it is
then (one acknowledged or changed meanwhile is judged as it is now). Last,
it deletes the tombstones past their lifetime, oldest first, in bounded
batches too. A record this daemon cannot read (a key scheme it does not
know) is left as it is. The daemon runs a pass at start and then
periodically (`sidecar.server`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sidecar.clock import Clock
from sidecar.errors import UnsupportedKeyScheme
from sidecar.ledger import retention
from sidecar.ledger.model import State, ToolCall
from sidecar.ledger.policy import Policy, PolicySource
from sidecar.services._common import bulk_committed
from sidecar.storage.api import LedgerReads, LedgerWrites, Store
from sidecar.storage.scans import Scans

DEFAULT_BATCH = 256
# Index entries read per snapshot: bounds how long one read transaction
# keeps old pages from being reused.
SCAN_CHUNK = 4096


@dataclass(frozen=True, slots=True)
class PassResult:
    """What one compaction pass did."""

    # Index entries read: the records found due, and those that were not.
    examined: int
    compacted: int
    # Write transactions.
    transactions: int
    # Tombstones deleted after their lifetime.
    expired: int = 0


@dataclass(frozen=True, slots=True)
class _Chunk:
    examined: int
    # Record keys due as of the snapshot.
    due: list[bytes]
    # The last index key examined; None when the index is done.
    resume: bytes | None


def _readable(view: LedgerReads, key: bytes) -> ToolCall | None:
    try:
        return view.load_call_at(key)
    except UnsupportedKeyScheme:
        return None  # a newer daemon's: not this one's to compact


class RetentionService:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        policy: PolicySource,
        *,
        batch: int = DEFAULT_BATCH,
        scans: Scans | None = None,
    ) -> None:
        if batch < 1:
            raise ValueError("batch: must be at least 1")
        self._store = store
        self._clock = clock
        self._policy = policy
        self._batch = batch
        self._scans = scans or Scans(store)

    def _find_due(
        self,
        view: LedgerReads,
        *,
        policy: Policy,
        acknowledged: bool,
        after: bytes | None,
    ) -> _Chunk:
        now_ns = self._clock.wall_ns()
        examined = 0
        due: list[bytes] = []
        for place, key in view.retained(acknowledged=acknowledged, after=after):
            examined += 1
            call = _readable(view, key)
            if call is not None and call.state is State.COMMITTED:
                if not retention.is_due(call, policy, now_ns):
                    # Later entries of this part changed later: none is due.
                    return _Chunk(examined, due, None)
                due.append(key)
            if examined == SCAN_CHUNK:
                return _Chunk(examined, due, place)
        return _Chunk(examined, due, None)

    def _compact_keys(
        self, view: LedgerWrites, *, policy: Policy, keys: list[bytes]
    ) -> int:
        now_ns = self._clock.wall_ns()
        compacted = 0
        for key in keys:
            call = _readable(view, key)
            if call is not None and retention.is_due(call, policy, now_ns):
                view.compact_call(call, retention.tombstone(call, now_ns))
                compacted += 1
        return compacted

    def _expire_batch(self, view: LedgerWrites, *, policy: Policy) -> tuple[int, bool]:
        before = retention.tombstones_expire_before(policy, self._clock.wall_ns())
        return view.expire_tombstones(before, self._batch)

    async def compact(self) -> PassResult:
        """One pass over the COMMITTED records that are due, then over the
        tombstones past their lifetime, under the policy in force when the
        pass began."""
        policy = self._policy.current()
        examined = compacted = transactions = expired = 0
        for acknowledged in (True, False):
            after: bytes | None = None
            while True:
                chunk = await self._scans.read(
                    functools.partial(
                        self._find_due,
                        policy=policy,
                        acknowledged=acknowledged,
                        after=after,
                    )
                )
                examined += chunk.examined
                for start in range(0, len(chunk.due), self._batch):
                    keys = chunk.due[start : start + self._batch]
                    compacted += await bulk_committed(
                        self._store,
                        functools.partial(self._compact_keys, policy=policy, keys=keys),
                    )
                    transactions += 1
                if chunk.resume is None:
                    break
                after = chunk.resume
        more = True
        while more:
            deleted, more = await bulk_committed(
                self._store, functools.partial(self._expire_batch, policy=policy)
            )
            expired += deleted
            transactions += 1
        return PassResult(examined, compacted, transactions, expired)
