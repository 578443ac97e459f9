"""The records a daemon saved last, and a call's next step decided on one
of them with no read (`stepped`): on a store whose saves are statements
(`Store.saves_by_statement`, PostgreSQL), a read before the save is a round
trip the save does not need, since its compare-and-swap proves the record
still the one decided on. So is the read before a new call's save
(`made`): its insert is its compare, which a record or tombstone of the
call stored fails; a call this daemon knows stored is not tried so.

Never an answer by itself. A step that changes nothing is answered from the
stored record, read: a remembered record may be older than the stored one,
and only a save's compare tells. A rule that reads the store (judging
another daemon's lease) decides again on a read, and so does a lost
compare, which forgets the record.
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.errors import EffectdError
from sidecar.ledger.model import CallRef, State, ToolCall
from sidecar.ledger.retention import Tombstone
from sidecar.ledger.rules import Answer
from sidecar.services._common import Decided
from sidecar.storage.api import CallWrite, Conflict, LedgerReads, Store
from sidecar.storage.table_ledger import NO_READS, Unread, absent, holding

# Records a `RecentCalls` keeps, and the payload bytes they may hold
# together: the calls in flight at one daemon, whose kept inputs and
# results may each be up to a MiB (`validation.Limits`).
RECENT_CALLS = 4096
RECENT_BYTES = 32 << 20
# What a record weighs besides its payloads: its texts, history and fields.
_RECORD_WEIGHT = 1024
# Calls a `RecentCalls` knows stored, by identity alone (a few hundred bytes
# each), for `made` to leave to a read.
KNOWN_CALLS = 16384


def _weight(call: ToolCall) -> int:
    weight = _RECORD_WEIGHT
    if call.kept_input is not None:
        weight += len(call.kept_input.data)
    if call.result is not None and call.result.payload is not None:
        weight += len(call.result.payload.data)
    return weight


class RecentCalls:
    """The records of calls in flight this daemon saved last, by call, at
    most `size` of them and `budget` bytes of payloads (the oldest forgotten
    first): what the next step of a call (a commit after its start, a
    heartbeat) is decided on. A COMMITTED record is not kept: a call's
    steps end with its commit, and its result may be large."""

    def __init__(
        self,
        size: int = RECENT_CALLS,
        budget: int = RECENT_BYTES,
        known: int = KNOWN_CALLS,
    ) -> None:
        self._size = size
        self._budget = budget
        self._bytes = 0
        self._calls: dict[CallRef, tuple[ToolCall, int]] = {}
        # The calls seen stored last (saved, or found by a lost insert),
        # committed ones too, the oldest forgotten first: a hint, never an
        # answer (a call compacted and expired since is only read first).
        self._known_size = known
        self._known: dict[CallRef, None] = {}

    def __len__(self) -> int:
        return len(self._calls)

    @property
    def held_bytes(self) -> int:
        """The payload bytes (and records' weights) held now."""
        return self._bytes

    def get(self, ref: CallRef) -> ToolCall | None:
        found = self._calls.get(ref)
        return None if found is None else found[0]

    def is_known(self, ref: CallRef) -> bool:
        """Whether this daemon saw the call of `ref` stored, lately."""
        return ref in self._known

    def know(self, ref: CallRef) -> None:
        """Notes the call of `ref` as stored."""
        known = self._known
        known.pop(ref, None)
        known[ref] = None
        if len(known) > self._known_size:
            del known[next(iter(known))]

    def remember(self, call: ToolCall) -> None:
        self.know(call.ref)
        self.forget(call.ref)
        weight = _weight(call)
        if call.state is State.COMMITTED or weight > self._budget:
            return
        calls = self._calls
        calls[call.ref] = (call, weight)
        self._bytes += weight
        while len(calls) > self._size or self._bytes > self._budget:
            self.forget(next(iter(calls)))

    def forget(self, ref: CallRef) -> None:
        found = self._calls.pop(ref, None)
        if found is not None:
            self._bytes -= found[1]


async def stepped(
    store: Store,
    recent: RecentCalls,
    ref: CallRef,
    decide: Callable[[ToolCall, LedgerReads], Decided],
) -> Answer | None:
    """`decide` on the record of `ref` this daemon saved last, with no read,
    and its write saved by compare-and-swap on `store` (one whose saves are
    statements); the reply once saved (raised when a refusal). None when
    that cannot be: no such record, a decision that writes nothing, a rule
    that read the store, or a compare lost."""
    old = recent.get(ref)
    if old is None:
        return None
    try:
        decision = decide(old, NO_READS)
    except Unread:
        return None
    write = decision.write
    if write is None:
        return None
    return await _saved(store, recent, write, decision.reply, lost=recent.forget)


async def made(
    store: Store,
    recent: RecentCalls,
    ref: CallRef,
    decide: Callable[[LedgerReads], Decided],
) -> Answer | None:
    """`decide` as if no call of `ref` were stored, with no read, and the new
    call it makes saved by compare-and-swap on `store` (one whose saves are
    statements): its insert, which a record or a tombstone of the call
    stored fails (`Conflict`). An insert that lost and found the call
    (`Conflict.found`, on the statement's snapshot, as a read's) decides
    again on what it found, a change saved as `stepped` saves one. The reply
    once saved (raised when a refusal). None when that cannot be, for a read
    to decide: a call this daemon knows stored, a decision that makes no new
    call (nothing to prove it on), a rule that read the store, or a lost
    compare that found nothing it can read."""
    if recent.is_known(ref):
        return None
    try:
        decision = decide(absent(ref))
    except Unread:
        return None
    write = decision.write
    if write is None or write.old is not None:
        return None
    try:
        await store.save_call(write)
    except Conflict as lost:
        recent.know(ref)
        if lost.found is None:
            return None
        return await _decided_on(store, recent, ref, decide, lost.found)
    return _remembered(recent, write.new, decision.reply)


async def _decided_on(
    store: Store,
    recent: RecentCalls,
    ref: CallRef,
    decide: Callable[[LedgerReads], Decided],
    found: tuple[ToolCall | None, Tombstone | None],
) -> Answer | None:
    """`decide` on the call as a lost insert found it: the reply, or the
    change it makes saved by compare-and-swap first; None for a read to
    decide (a rule that read more, a lost compare)."""
    try:
        decision = decide(holding(ref, *found))
    except Unread:
        return None
    write = decision.write
    if write is None:
        if isinstance(decision.reply, EffectdError):
            raise decision.reply
        return decision.reply
    if write.old is None:
        return None
    return await _saved(store, recent, write, decision.reply, lost=recent.forget)


async def _saved(
    store: Store,
    recent: RecentCalls,
    write: CallWrite,
    reply: Answer | EffectdError,
    *,
    lost: Callable[[CallRef], None],
) -> Answer | None:
    """`reply` once `write` is saved (raised when a refusal), its record
    remembered; None, and `lost` told the call, when its compare lost."""
    try:
        await store.save_call(write)
    except Conflict:
        lost(write.new.ref)
        return None
    return _remembered(recent, write.new, reply)


def _remembered(
    recent: RecentCalls, saved: ToolCall, reply: Answer | EffectdError
) -> Answer:
    """`reply` (raised when a refusal), `saved` remembered."""
    recent.remember(saved)
    if isinstance(reply, EffectdError):
        raise reply
    return reply
