"""What every service does the same way: take the moment a rule runs, wait
for a write function's durable commit, and decide a call's change on a
snapshot, then save it by compare-and-swap (or, for a change nearly every
request makes, on a store whose reads wait, in the write itself)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sidecar.clock import Clock
from sidecar.errors import EffectdError, StorageUnavailable
from sidecar.ledger.model import ToolCall
from sidecar.ledger.ownership import Registration
from sidecar.ledger.rules import Answer, Now
from sidecar.storage import calls
from sidecar.storage.api import CallWrite, Conflict, LedgerReads, LedgerWrites, Store
from sidecar.storage.scans import Scans

T = TypeVar("T")


class StoredPeers:
    """`ownership.Peers` read from `view`; valid while `view` is."""

    def __init__(self, view: LedgerReads) -> None:
        self._view = view
        self._seen: dict[int, Registration | None] = {}

    def registration(self, incarnation: int) -> Registration | None:
        if incarnation not in self._seen:
            self._seen[incarnation] = self._view.registration(incarnation)
        return self._seen[incarnation]


def moment(clock: Clock, store: Store, view: LedgerReads) -> Now:
    """Both clocks and the store's incarnation, read together; on a store
    other daemons share, their registrations as `view` holds them, for a
    rule that judges a lease of another incarnation (valid while `view` is)."""
    peers = None if store.exclusive else StoredPeers(view)
    return Now(clock.wall_ns(), clock.monotonic_ns(), store.incarnation, peers)


async def committed(store: Store, fn: Callable[[LedgerWrites], T]) -> T:
    """Runs `fn` in a write transaction (on the event loop, gathered with
    the other writes of its pass: `Store.write`); returns its value once the
    commit is durable. For writes of a few records: the loop serves nothing
    else while they are applied."""
    return await store.write(fn)


async def bulk_committed(store: Store, fn: Callable[[LedgerWrites], T]) -> T:
    """`committed`, for a write of many records (a page of recovery, a
    retention pass or lease sweep): run by the writer thread, so the event
    loop goes on serving while it is applied."""
    return await asyncio.wrap_future(store.submit(fn))


async def answered(
    store: Store, fn: Callable[[LedgerWrites], Answer | EffectdError]
) -> Answer:
    """`committed`, for rules whose refusal may carry a change: the change is
    committed first, then the refusal is raised."""
    reply = await committed(store, fn)
    if isinstance(reply, EffectdError):
        raise reply
    return reply


# Compare-and-swaps one request may lose before it is answered UNAVAILABLE:
# each one lost is another request's write to the same record that won.
MAX_RACES = 64


@dataclass(frozen=True, slots=True)
class Decided:
    """What a rule decided on a snapshot: the reply (a refusal to raise), and
    the record to save first, if the call changes."""

    reply: Answer | EffectdError
    write: CallWrite | None = None


async def decided(
    store: Store,
    scans: Scans,
    decide: Callable[[LedgerReads], Decided],
    *,
    writes: bool = False,
    saved: Callable[[ToolCall], None] | None = None,
) -> Answer:
    """`decide` on a snapshot (`Scans.point_read`), then its record saved by
    compare-and-swap (`Store.save_call`), durably, before the reply, which is
    raised when a refusal. A compare lost to a write that came first
    (`Conflict`) decides again, on a new snapshot: what the request sees is
    then that write's record, as if it had queued behind it.

    `writes`: the rule changes the record on nearly every request (a start,
    a commit, a heartbeat). On a store whose reads wait (`Store.reads_wait`:
    each read a round trip) and whose saves are transactions of their own
    (not `Store.saves_by_statement`), it is decided in the write transaction
    itself (`in_write`), which spares the read before it; a repeat that
    changes nothing then costs a transaction that writes nothing.

    `saved` is told each record saved (not one saved in a write transaction)."""
    if writes and store.reads_wait and not store.saves_by_statement:
        return await in_write(store, decide)
    for _ in range(MAX_RACES):
        decision = await scans.point_read(decide)
        if decision.write is not None:
            try:
                await store.save_call(decision.write)
            except Conflict:
                continue
            if saved is not None:
                saved(decision.write.new)
        if isinstance(decision.reply, EffectdError):
            raise decision.reply
        return decision.reply
    raise _raced()


async def in_write(store: Store, decide: Callable[[LedgerReads], Decided]) -> Answer:
    """`decide` on the write transaction's view, its record saved by the
    same compare-and-swap in the same transaction: the store holds the row
    as read until the commit (PostgreSQL: read `FOR UPDATE`), so the compare
    holds unless what the decision assumed changed (`CallWrite.holds`: a
    policy reload), which decides again. The reply, raised when a refusal,
    once the commit is durable."""

    def apply(view: LedgerWrites) -> Answer | EffectdError:
        decision = decide(view)
        if decision.write is not None:
            calls.compare_and_save(view, decision.write)
        return decision.reply

    for _ in range(MAX_RACES):
        try:
            return await answered(store, apply)
        except Conflict:
            continue
    raise _raced()


def _raced() -> StorageUnavailable:
    return StorageUnavailable(
        f"the call changed under {MAX_RACES} decisions in a row; try again",
        {"mayHaveBeenApplied": "false"},
    )
