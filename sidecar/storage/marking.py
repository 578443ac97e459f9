"""Marking a store restored from a backup (`ledger.restore`), on any backend.

A restored store holds an earlier state of the ledger, and nothing in it says
so: a call PREPARED then, and started and run since, would answer EXECUTE
again. `mark` turns every call not COMMITTED UNKNOWN, in bounded
transactions, then moves the checkpoint revisions ahead and writes the marker
and its audit entry. Each backend's offline restore calls it on the copy it
restored (`storage.lmdb.restore`, `storage.postgres.restore`); a daemon
refuses to start on a store whose marking began and did not finish
(`refuse_unfinished_marking`, in the transaction that registers it).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from sidecar.clock import Clock
from sidecar.ledger import restore
from sidecar.ledger.restore import Marker
from sidecar.storage import records
from sidecar.storage.api import ReadView, Store, Table, Tables, WriteView

_MARKER_KEY = b"restored"
# Present from a marking's first transaction to its last: the backup's name.
_MARKING_KEY = b"restore-marking"
# Calls turned UNKNOWN per write transaction.
BATCH = 1024


class RestoreRefused(Exception):
    """The restore would be unsafe or cannot be done; nothing was changed in
    the data directory's store. The message says why."""


class UnfinishedRestore(RuntimeError):
    """A restore into the data directory stopped before its store was
    marked; a daemon must not start there."""


def load_marker(view: ReadView) -> Marker | None:
    """How the store was last restored, or None if it never was."""
    raw = view.get(Table.META, _MARKER_KEY)
    return None if raw is None else restore.decode(raw)


def mark(
    store: Store,
    backup: str,
    *,
    actor: str,
    reason: str,
    clock: Clock,
    refuse: Callable[[ReadView], None] | None = None,
) -> Marker:
    """Marks `store`, restored from `backup`, as `ledger.restore` says: every
    call not COMMITTED turned UNKNOWN in bounded transactions, then the
    checkpoint revisions moved ahead, the marker and the audit entry, in one
    transaction. Nothing may serve `store` meanwhile: the first transaction
    runs `refuse` (which raises RestoreRefused, changing nothing, if something
    serves it) and records the marking as begun, which a daemon's start then
    refuses (`refuse_unfinished_marking`) until the last transaction."""
    at_ns = clock.wall_ns()
    store.submit(functools.partial(_begin, backup=backup, refuse=refuse)).result()
    made_unknown = 0
    for state in restore.OPEN_STATES:
        while True:
            done = store.submit(
                functools.partial(
                    _mark_batch,
                    state=records.state_prefix(state),
                    at_ns=at_ns,
                    actor=actor,
                )
            ).result()
            made_unknown += done
            if done < BATCH:
                break
    marker = Marker(
        at_ns=at_ns,
        actor=actor,
        reason=reason,
        backup=backup,
        # Opening the store for the marking counted one more incarnation.
        backup_incarnation=store.incarnation - 1,
        made_unknown=made_unknown,
        count=1,
    )
    return store.submit(functools.partial(_finish, marker=marker)).result()


def _begin(
    view: WriteView, *, backup: str, refuse: Callable[[ReadView], None] | None
) -> None:
    if refuse is not None:
        refuse(view)
    view.put(Table.META, _MARKING_KEY, backup.encode())


def refuse_unfinished_marking(view: Tables) -> None:
    """Raises UnfinishedRestore if a marking of this store (`mark`) began and
    did not finish: a daemon must not serve it half marked. Run in the
    transaction that registers a starting daemon, so that a marking and a
    start racing cannot both go on."""
    raw = view.get(Table.META, _MARKING_KEY)
    if raw is not None:
        raise UnfinishedRestore(
            f"the marking of this store as restored from "
            f"{raw.decode(errors='replace')!r} did not finish: run "
            "`effectd ctl restore` again"
        )


def _mark_batch(view: WriteView, *, state: bytes, at_ns: int, actor: str) -> int:
    # Each call marked leaves this state's index: take the first ones again.
    keys = []
    for key, _ in view.scan(Table.CALL_STATES, state):
        keys.append(key)
        if len(keys) == BATCH:
            break
    for key in keys:
        # A call of a key scheme this daemon does not know cannot be marked;
        # the restore is refused rather than leave it answering as before.
        old = records.load_call_at(view, key[len(state) :])
        if old is not None:
            records.save_call(
                view, old, restore.restored(old, at_ns=at_ns, actor=actor)
            )
    return len(keys)


def _finish(view: WriteView, *, marker: Marker) -> Marker:
    previous = load_marker(view)
    marker = dataclasses.replace(
        marker, count=1 if previous is None else previous.count + 1
    )
    entry = records.append_audit(view, restore.fact(marker))
    marker = dataclasses.replace(marker, audit_sequence=entry.sequence)
    view.put(Table.META, _MARKER_KEY, restore.encode(marker))
    view.delete(Table.META, _MARKING_KEY)
    records.skip_checkpoint_revisions(view, restore.CHECKPOINT_REVISION_GAP)
    return marker
