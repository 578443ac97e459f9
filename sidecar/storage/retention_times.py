"""The retention index: the records a retention pass may compact, by time.

`Table.RETENTION_TIMES` holds one entry per COMMITTED record with a result
(what `ledger.retention.is_due` may ever find due): the acknowledged flag
(one byte), the record's last change (wall time, 8 bytes big-endian) and the
record's key. A record is due when its last change is older than its window
(`ledger.retention`), and the window depends only on the flag, so the due
records of each flag are a prefix of that flag's part of the index: a pass
reads what it compacts, and stops at the first entry that is not due.

`records.save_call` and `tombstones.compact` keep the index in step with the
record in the same write transaction; a store written before the index
existed gets it at open (`storage.lmdb.migration`).
"""

from __future__ import annotations

from sidecar.ledger.model import State, ToolCall

ACKNOWLEDGED = b"\x01"
UNACKNOWLEDGED = b"\x00"
_TIME_BYTES = 8


def key(call: ToolCall, record_key: bytes) -> bytes | None:
    """The index key of `call`, stored under `record_key`; None when a
    retention pass never compacts it (not COMMITTED with a result)."""
    if call.state is not State.COMMITTED or call.result is None:
        return None
    flag = ACKNOWLEDGED if call.acknowledged else UNACKNOWLEDGED
    return flag + call.updated_ns.to_bytes(_TIME_BYTES, "big") + record_key


def split(index_key: bytes) -> tuple[int, bytes]:
    """The last change (wall ns) and the record key of an index key."""
    start = len(ACKNOWLEDGED)
    end = start + _TIME_BYTES
    return int.from_bytes(index_key[start:end], "big"), index_key[end:]
