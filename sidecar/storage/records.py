"""How ledger records and checkpoints are laid out in the store's tables.

Keys: `namespace NUL run NUL call`, each identity part in its stored form
(`storage.keys`: verbatim when short, hashed when long, so every identity
that validation accepts fits LMDB's key limit). Identifiers never contain
NUL or other control characters (see `ledger.validation`), so keys are
unambiguous, and a namespace or run is a key prefix. Values: versioned JSON
documents, which hold the readable identity (`sidecar.storage.call_documents`).
Every load and save of a record goes through here, which keeps the by-state
index, the retention index (`storage.retention_times`) and the plan rows
(`storage.plan_rows`) in step with the records.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from sidecar.ledger import audit
from sidecar.ledger.checkpoints import StoredCheckpoint
from sidecar.ledger.model import CallRef, State, ToolCall
from sidecar.storage import keys, plan_rows, retention_times
from sidecar.storage.api import (
    IssuesRevisions,
    SkipsRevisions,
    Table,
    Tables,
    WritableTables,
)
from sidecar.storage.call_documents import decode_call, encode_call

_SEP = b"\x00"
_STATE_CODES = {s: bytes([i + 1]) for i, s in enumerate(State)}


def state_prefix(state: State, namespace: str | None = None) -> bytes:
    return _STATE_CODES[state] + (
        b"" if namespace is None else keys.namespace_prefix(namespace)
    )


def load_call(view: Tables, ref: CallRef) -> ToolCall | None:
    return load_call_at(view, keys.call_key(ref))


def load_call_at(view: Tables, key: bytes) -> ToolCall | None:
    """The record stored under `key` (a CALLS key, as in the by-state index)."""
    raw = view.get(Table.CALLS, key)
    return None if raw is None else decode_call(raw)


def save_call(view: WritableTables, old: ToolCall | None, new: ToolCall) -> None:
    """Stores `new` (which replaces `old`, as loaded) and its index entries."""
    key = keys.call_key(new.ref)
    if old is not None and old.state is not new.state:
        view.delete(Table.CALL_STATES, _STATE_CODES[old.state] + key)
    if old is None or old.state is not new.state:
        view.put(Table.CALL_STATES, _STATE_CODES[new.state] + key, b"")
    was = None if old is None else retention_times.key(old, key)
    now = retention_times.key(new, key)
    if was != now:
        if was is not None:
            view.delete(Table.RETENTION_TIMES, was)
        if now is not None:
            view.put(Table.RETENTION_TIMES, now, b"")
    row = plan_rows.encode(new, view.summarize)
    if row is not None:
        view.put(Table.PLAN_ROWS, key, row)
    elif old is not None and old.state is State.COMMITTED:
        # Only a COMMITTED record has a row (a new record finds none: the
        # row goes with its record, `tombstones.compact`).
        view.delete(Table.PLAN_ROWS, key)
    view.put(Table.CALLS, key, encode_call(new))


# -- checkpoints -------------------------------------------------------------

_REVISION_KEY = b"checkpoint_revision"
# Revision and last change; then, for a key stored hashed, the key's length
# and the key itself; then the value.
_CHECKPOINT_HEAD = struct.Struct(">QQ")
_KEY_LENGTH = struct.Struct(">H")


def load_checkpoint(view: Tables, namespace: str, key: str) -> StoredCheckpoint | None:
    stored = keys.checkpoint_key(namespace, key)
    raw = view.get(Table.CHECKPOINTS, stored)
    return None if raw is None else decode_checkpoint(stored, raw)


def decode_checkpoint(stored: bytes, raw: bytes) -> StoredCheckpoint:
    """The checkpoint stored under the key `stored`."""
    revision, updated_ns = _CHECKPOINT_HEAD.unpack_from(raw)
    body = raw[_CHECKPOINT_HEAD.size :]
    if keys.is_hashed(stored):
        (size,) = _KEY_LENGTH.unpack_from(body)
        start = _KEY_LENGTH.size
        key = body[start : start + size].decode()
        return StoredCheckpoint(key, body[start + size :], revision, updated_ns)
    return StoredCheckpoint(
        stored.split(_SEP, 1)[1].decode(), body, revision, updated_ns
    )


def checkpoint_head(raw: bytes) -> tuple[int, int] | None:
    """The revision and last change (wall ns) of a stored checkpoint; None
    for a value too short to be one."""
    if len(raw) < _CHECKPOINT_HEAD.size:
        return None
    revision, updated_ns = _CHECKPOINT_HEAD.unpack_from(raw)
    return int(revision), int(updated_ns)


def encode_checkpoint(stored: bytes, cp: StoredCheckpoint) -> bytes:
    head = _CHECKPOINT_HEAD.pack(cp.revision, cp.updated_ns)
    if keys.is_hashed(stored):
        key = cp.key.encode()
        head += _KEY_LENGTH.pack(len(key)) + key
    return head + cp.value


def save_checkpoint(view: WritableTables, namespace: str, cp: StoredCheckpoint) -> None:
    stored = keys.checkpoint_key(namespace, cp.key)
    view.put(Table.CHECKPOINTS, stored, encode_checkpoint(stored, cp))


def delete_checkpoint(view: WritableTables, namespace: str, key: str) -> None:
    view.delete(Table.CHECKPOINTS, keys.checkpoint_key(namespace, key))


def scan_checkpoints(
    view: Tables, namespace: str, prefix: str, after: bytes | None
) -> Iterator[tuple[bytes, StoredCheckpoint]]:
    """(stored key, checkpoint) of every row of `checkpoint_ranges` after the
    stored key `after`, in key order; rows whose key does not start with
    `prefix` are included: the caller filters, and counts what it read."""
    for start in keys.checkpoint_ranges(namespace, prefix):
        for stored, raw in view.scan(Table.CHECKPOINTS, start, after=after):
            yield stored, decode_checkpoint(stored, raw)


def skip_checkpoint_revisions(view: WritableTables, gap: int) -> None:
    """Moves the checkpoint revision counter `gap` ahead (after a restore,
    past every revision a lost later state may have issued), and the
    store's sequence when it issues them from one."""
    if isinstance(view, SkipsRevisions):
        view.skip_revisions(gap)
    revision = int(view.get(Table.META, _REVISION_KEY) or b"0") + gap
    view.put(Table.META, _REVISION_KEY, str(revision).encode())


def next_checkpoint_revision(view: WritableTables) -> int:
    """The store-wide checkpoint revision counter: never reused, so no ABA."""
    if isinstance(view, IssuesRevisions):
        issued = view.issued_revision()
        if issued is not None:
            return issued
    revision = int(view.get(Table.META, _REVISION_KEY) or b"0") + 1
    view.put(Table.META, _REVISION_KEY, str(revision).encode())
    return revision


# -- the audit log -------------------------------------------------------------

_AUDIT_HEAD_KEY = b"audit_head"


def audit_key(sequence: int) -> bytes:
    return sequence.to_bytes(8, "big")


def load_audit_head(view: Tables) -> audit.Head | None:
    """The chain head kept in META: the newest entry's sequence and hash."""
    raw = view.get(Table.META, _AUDIT_HEAD_KEY)
    if raw is None:
        return None
    sequence, digest = raw.decode().split(" ", 1)
    return audit.Head(int(sequence), digest)


def append_audit(view: WritableTables, fact: audit.Fact) -> audit.Entry:
    """Seals `fact` after the current head and stores it with the new head,
    in the caller's write transaction."""
    entry = audit.seal(fact, load_audit_head(view))
    view.put(Table.AUDIT, audit_key(entry.sequence), audit.encode(entry))
    view.put(Table.META, _AUDIT_HEAD_KEY, f"{entry.sequence} {entry.hash}".encode())
    return entry


def load_audit(view: Tables, sequence: int) -> bytes | None:
    return view.get(Table.AUDIT, audit_key(sequence))


def scan_audit(view: Tables, after: int = 0) -> Iterator[tuple[int, bytes]]:
    """(sequence, stored bytes) of the entries after `after`, oldest first."""
    start = None if after == 0 else audit_key(after)
    for key, raw in view.scan(Table.AUDIT, b"", after=start):
        yield int.from_bytes(key, "big"), raw


# The record document's own two functions are used through this module too.
__all__ = [
    "append_audit",
    "audit_key",
    "checkpoint_head",
    "decode_call",
    "decode_checkpoint",
    "delete_checkpoint",
    "encode_call",
    "encode_checkpoint",
    "load_audit",
    "load_audit_head",
    "load_call",
    "load_call_at",
    "load_checkpoint",
    "next_checkpoint_revision",
    "save_call",
    "save_checkpoint",
    "scan_audit",
    "scan_checkpoints",
    "skip_checkpoint_revisions",
    "state_prefix",
]
