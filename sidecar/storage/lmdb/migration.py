"""The upgrade of a store of format 1 to 4 to format 5, in place, at open.

What format 3 changed, and what the upgrade of a format 1 or 2 store does
about it:
- An identity part longer than the bounds of `storage.keys` is stored
  hashed; format 2 stored every part verbatim (and refused what did not
  fit). Records, index entries, tombstones and checkpoints of long
  identities move to their new keys; a checkpoint stored hashed keeps its
  readable key in its value.
- Tombstones are indexed by the time they were made (`TOMBSTONE_TIMES`),
  for their lifetime.
- Tombstone bytes are counted apart from stored bytes: the usage counters
  are counted again (`usage.ensure_counted`, right after).
- Records and tombstones without a fingerprint scheme hold the fingerprint
  of before the input's kind was hashed (V1): `records.decode_call` reads
  them so, and nothing is rewritten for it.

What format 4 changed: COMMITTED records are indexed by the time their
retention window ends (`storage.retention_times`); the upgrade of a store
of any earlier format indexes every COMMITTED record it finds.

What format 5 changed: each COMMITTED record with a result has its plan row
(`storage.plan_rows`); the upgrade of a store of any earlier format writes
the row of every COMMITTED record it finds.

The open that finds format 1 to 4 sets format 5 and a pending mark in the
same transaction, so a daemon of an earlier format never opens a store
whose keys are half moved. The steps are idempotent and run in bounded
transactions; an upgrade stopped midway is resumed at the next open, and
the mark is deleted by its last transaction.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.errors import UnsupportedKeyScheme
from sidecar.ledger.model import CallRef, State
from sidecar.storage import keys, plan_rows, records, retention_times, tombstones, usage
from sidecar.storage.api import Store, Table, WriteView
from sidecar.storage.plan_rows import Summarize

log = logging.getLogger(__name__)

PENDING_KEY = b"upgrade_pending"
BATCH = 1000
_SEP = b"\x00"
# Formats whose keys are moved and whose usage is counted again.
_BEFORE_HASHED_KEYS = frozenset({b"1", b"2"})
# Formats whose COMMITTED records are indexed for retention.
_BEFORE_RETENTION_INDEX = frozenset({b"1", b"2", b"3"})

# A stored row's new (key, value), or None when it stays.
_Rekey = Callable[[bytes, bytes], tuple[bytes, bytes] | None]


def _call_key(old: bytes) -> bytes:
    namespace, run_id, call_id = old.split(_SEP, 2)
    return keys.call_key(CallRef(namespace.decode(), run_id.decode(), call_id.decode()))


def _rekey_call(key: bytes, raw: bytes) -> tuple[bytes, bytes] | None:
    if keys.is_hashed(key):  # moved already
        return None
    new = _call_key(key)
    return None if new == key else (new, raw)


def _rekey_index(key: bytes, raw: bytes) -> tuple[bytes, bytes] | None:
    if keys.is_hashed(key):
        return None
    new = key[:1] + _call_key(key[1:])
    return None if new == key else (new, raw)


def _rekey_checkpoint(key: bytes, raw: bytes) -> tuple[bytes, bytes] | None:
    if keys.is_hashed(key):
        return None
    cp = records.decode_checkpoint(key, raw)
    new = keys.checkpoint_key(keys.namespace_of(key), cp.key)
    return None if new == key else (new, records.encode_checkpoint(new, cp))


_MOVES: tuple[tuple[Table, _Rekey], ...] = (
    (Table.CALLS, _rekey_call),
    (Table.CALL_STATES, _rekey_index),
    (Table.TOMBSTONES, _rekey_call),
    (Table.CHECKPOINTS, _rekey_checkpoint),
)


@dataclass(frozen=True, slots=True)
class _Step:
    done: int
    # The last key examined; None when the table is done.
    resume: bytes | None


def _move(
    view: WriteView, *, table: Table, rekey: _Rekey, after: bytes | None
) -> _Step:
    rows = []
    for key, raw in view.scan(table, b"", after=after):
        rows.append((key, raw))
        if len(rows) == BATCH:
            break
    moved = 0
    for key, raw in rows:
        new = rekey(key, raw)
        if new is not None:
            view.delete(table, key)
            view.put(table, *new)
            moved += 1
    return _Step(moved, rows[-1][0] if len(rows) == BATCH else None)


def _index_tombstones(view: WriteView, *, after: bytes | None) -> _Step:
    rows = []
    for key, raw in view.scan(Table.TOMBSTONES, b"", after=after):
        rows.append((key, raw))
        if len(rows) == BATCH:
            break
    for key, raw in rows:
        made = tombstones.decode(raw).compacted_ns
        view.put(Table.TOMBSTONE_TIMES, tombstones.time_key(made, key), b"")
    return _Step(len(rows), rows[-1][0] if len(rows) == BATCH else None)


def _index_retention(view: WriteView, *, after: bytes | None) -> _Step:
    prefix = records.state_prefix(State.COMMITTED)
    rows = []
    for index_key, _ in view.scan(Table.CALL_STATES, prefix, after=after):
        rows.append(index_key)
        if len(rows) == BATCH:
            break
    for index_key in rows:
        key = index_key[len(prefix) :]
        raw = view.get(Table.CALLS, key)
        try:
            # The index reads no history: most of a decode's cost, left out.
            call = None if raw is None else records.decode_call(raw, history=False)
        except UnsupportedKeyScheme:
            continue  # a newer daemon's: never compacted by this one
        indexed = None if call is None else retention_times.key(call, key)
        if indexed is not None:
            view.put(Table.RETENTION_TIMES, indexed, b"")
    return _Step(len(rows), rows[-1] if len(rows) == BATCH else None)


def _write_plan_rows(view: WriteView, *, after: bytes | None) -> _Step:
    prefix = records.state_prefix(State.COMMITTED)
    rows = []
    for index_key, _ in view.scan(Table.CALL_STATES, prefix, after=after):
        rows.append(index_key)
        if len(rows) == BATCH:
            break
    for index_key in rows:
        key = index_key[len(prefix) :]
        raw = view.get(Table.CALLS, key)
        try:
            # A plan row shows no history.
            call = None if raw is None else records.decode_call(raw, history=False)
        except UnsupportedKeyScheme:
            continue  # a newer daemon's: read the long way, and refused there
        row = None if call is None else plan_rows.encode(call, view.summarize)
        if row is not None:
            view.put(Table.PLAN_ROWS, key, row)
    return _Step(len(rows), rows[-1] if len(rows) == BATCH else None)


def _finish(view: WriteView) -> None:
    view.delete(Table.META, PENDING_KEY)


def _rows_left(view: WriteView) -> None:
    # What a format 4 store still lacks.
    view.put(Table.META, PENDING_KEY, b"4")


def _walk(store: Store, step: Callable[..., _Step]) -> int:
    after: bytes | None = None
    done = 0
    while True:
        result = store.submit(functools.partial(step, after=after)).result()
        done += result.done
        if result.resume is None:
            return done
        after = result.resume


def resume(store: Store, summarize: Summarize | None) -> bool:
    """Runs the pending upgrade, if the store has one; returns whether it did.
    Without `summarize` (an offline tool's open) the plan rows are left to
    the next open that has it: the mark stays, as of format 4."""
    pending = store.read(lambda view: view.get(Table.META, PENDING_KEY))
    if pending is None:
        return False
    moved = indexed = 0
    if pending in _BEFORE_HASHED_KEYS:
        moved = sum(
            _walk(store, functools.partial(_move, table=table, rekey=rekey))
            for table, rekey in _MOVES
        )
        indexed = _walk(store, _index_tombstones)
    committed = 0
    if pending in _BEFORE_RETENTION_INDEX:
        committed = _walk(store, _index_retention)
    planned = 0
    if summarize is None:
        store.submit(_rows_left).result()
    else:
        planned = _walk(store, _write_plan_rows)
        store.submit(_finish).result()
    log.info(
        "store upgraded from format %s: %d rows moved to their format 3 keys, "
        "%d tombstones indexed by time, %d committed calls indexed for "
        "retention, %d given their plan rows",
        pending.decode(errors="replace"),
        moved,
        indexed,
        committed,
        planned,
    )
    return True


def mark_pending(view: WriteView, from_format: bytes) -> None:
    """Records, in the transaction that sets format 5, that the rows of
    `from_format` are still to be upgraded, and, for a format before 3, that
    the counters are to be counted again."""
    view.put(Table.META, PENDING_KEY, from_format)
    if from_format in _BEFORE_HASHED_KEYS:
        view.delete(Table.META, usage.COUNTED_KEY)
