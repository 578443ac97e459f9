"""The records a daemon saved last, and a call's next step decided on one
of them with no read (`stepped`): on a store whose saves are statements
(`Store.saves_by_statement`, PostgreSQL), a read before the save is a round
trip the save does not need, since its compare-and-swap proves the record
still the one decided on.

Never an answer by itself. A step that changes nothing is answered from the
stored record, read: a remembered record may be older than the stored one,
and only a save's compare tells. A rule that reads the store (judging
another daemon's lease) decides again on a read, and so does a lost
compare, which forgets the record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from sidecar.errors import EffectdError
from sidecar.ledger.model import CallRef, ToolCall
from sidecar.ledger.rules import Answer
from sidecar.services._common import Decided
from sidecar.storage.api import Conflict, ReadView, Store, Table

# Records a `RecentCalls` keeps: the calls in flight at one daemon.
RECENT_CALLS = 4096


class RecentCalls:
    """The records this daemon saved last, by call, at most `size` (the
    oldest forgotten first): what the next step of a call in flight (a
    commit after its start, a heartbeat) is decided on."""

    def __init__(self, size: int = RECENT_CALLS) -> None:
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
    """A rule deciding on a remembered record read the store."""


class _NoReads:
    """The view a remembered record is decided on: nothing to read."""

    def get(self, table: Table, key: bytes) -> bytes | None:
        raise _Unread(table)

    def scan(
        self, table: Table, prefix: bytes, *, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        raise _Unread(table)


NO_READS: ReadView = _NoReads()


async def stepped(
    store: Store,
    recent: RecentCalls,
    ref: CallRef,
    decide: Callable[[ToolCall, ReadView], Decided],
) -> Answer | None:
    """`decide` on the record of `ref` this daemon saved last, with no read,
    and its write saved by compare-and-swap; the reply once saved (raised
    when a refusal). None when that cannot be: no such record (or a store
    whose saves are not statements), a decision that writes nothing, a
    rule that read the store, or a compare lost."""
    old = recent.get(ref) if store.saves_by_statement else None
    if old is None:
        return None
    try:
        decision = decide(old, NO_READS)
    except _Unread:
        return None
    write = decision.write
    if write is None:
        return None
    try:
        await store.save_call(write)
    except Conflict:
        recent.forget(ref)
        return None
    recent.remember(write.new)
    if isinstance(decision.reply, EffectdError):
        raise decision.reply
    return decision.reply
