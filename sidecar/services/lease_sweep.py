"""The lease sweep: STARTED calls whose lease ran out become UNKNOWN.

A request that touches such a call settles it first (`rules.settle`), but a
call nobody touches again (its agent died) would stay STARTED, and listings,
stats and metrics would count it as running instead of waiting for a person.
The daemon therefore runs this sweep periodically (`sidecar.server`): it walks
the by-state index of STARTED records in key order, a bounded batch per write
transaction, and applies `rules.settle` to each record with the moment the
writer runs the batch, so a call heartbeated or committed meanwhile is judged
as it is now. Settling is what any touch would do; nothing is started.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sidecar.clock import Clock
from sidecar.errors import UnsupportedKeyScheme
from sidecar.ledger import rules
from sidecar.ledger.model import State
from sidecar.services._common import bulk_committed, moment
from sidecar.storage.api import LedgerWrites, Store

DEFAULT_BATCH = 256


@dataclass(frozen=True, slots=True)
class SweepPass:
    """What one lease sweep did."""

    examined: int
    settled: int
    transactions: int


@dataclass(frozen=True, slots=True)
class _Batch:
    examined: int
    settled: int
    # The last index key examined; None when the index is done.
    resume: bytes | None


class LeaseSweep:
    def __init__(
        self, store: Store, clock: Clock, *, batch: int = DEFAULT_BATCH
    ) -> None:
        if batch < 1:
            raise ValueError("batch: must be at least 1")
        self._store = store
        self._clock = clock
        self._batch = batch

    def _sweep_batch(self, view: LedgerWrites, *, after: bytes | None) -> _Batch:
        now = moment(self._clock, self._store, view)
        keys = []
        for key in view.calls_in_state(State.STARTED, after=after):
            keys.append(key)
            if len(keys) == self._batch:
                break
        settled = 0
        for key in keys:
            try:
                old = view.load_call_at(key)
            except UnsupportedKeyScheme:
                continue  # a newer daemon's call: refused whenever touched
            if old is None:
                continue
            new = rules.settle(old, now)
            if new.revision != old.revision:
                view.write_call(old, new)
                settled += 1
        resume = keys[-1] if len(keys) == self._batch else None
        return _Batch(len(keys), settled, resume)

    async def sweep(self) -> SweepPass:
        """One pass over every STARTED record."""
        after: bytes | None = None
        examined = settled = transactions = 0
        while True:
            batch = await bulk_committed(
                self._store, functools.partial(self._sweep_batch, after=after)
            )
            examined += batch.examined
            settled += batch.settled
            transactions += 1
            if batch.resume is None:
                return SweepPass(examined, settled, transactions)
            after = batch.resume
