"""The plan row of a COMMITTED record: what a recovery plan shows of the
call, stored beside the record so that a plan is assembled from bytes.

A recovery plan (`ledger.recovery`) shows each call without its history.
Decoding a stored JSON record and building its answer field by field costs
tens of microseconds a call; for a COMMITTED record, whose item recovery
never changes (nothing settles or enforces on it), that work is done once,
when the record is saved. `Table.PLAN_ROWS` maps a record key to:

    a head (`_HEAD`): the row version, flags (acknowledged, rejected), the
        declared and forced effects (`_EFFECT_CODES`), and the lengths of
        the tool name, of the summary, and where the result and the
        idempotency key lie in it (each as its length and bytes: its field
        without the tag);
    the tool name (UTF-8), which the policy's effect depends on;
    the summary: the record without its history in the protobuf wire form
        of `effectd.v1.ToolCall`, so an answer carries it as it is.

Storage knows no wire form: the summary, and where the result and the key
lie in it, are made by the `Summarize` the store was opened with, which the
gRPC boundary offers (`sidecar.rpc.summaries`) and the daemon hands in when
it opens its store. A store opened without one (an offline tool's) writes
no rows, and a record it saves loses the row it had.

The summary is the storage's own derived form of the record, kept by
`records.save_call` in the record's transaction (and deleted with it by
`tombstones.compact`), like the by-state and retention indexes: written
only for a COMMITTED record with a result, deleted when the record is not
one. A test holds every row byte for byte to what the gRPC boundary
answers for the decoded record, on random records. A record with no row,
or a row of another version, is read the long way.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from sidecar.ledger.model import KEY_SCHEMES, Effect, State, ToolCall

# The wire form of a record without its history, then where its result and
# where its idempotency key lie in it, each as the offset and the size of
# the field's value (its length, then its bytes; 0 and 0 for a key that is
# not set).
Summary = tuple[bytes, int, int, int, int]
# Makes the `Summary` of a record; raises UnicodeError for text the wire
# form cannot carry.
Summarize = Callable[[ToolCall], Summary]

VERSION = 1
ACKNOWLEDGED = 1
REJECTED = 2
# version, flags, effect, forced effect (0: none), tool name length, summary
# length, and the offsets and lengths within the summary of the result and
# of the idempotency key, each as a length-delimited value (its length, then
# its bytes) with no tag.
_HEAD = struct.Struct(">BBBBHIIIII")
HEAD_SIZE = _HEAD.size

# The effect codes of a row's head: the storage's own (0 is "none"), fixed
# by the rows already stored.
_EFFECT_CODES = {Effect.READ: 1, Effect.IDEMPOTENT_WRITE: 2, Effect.SIDE_EFFECT: 3}
_EFFECT_OF_CODE = {code: effect for effect, code in _EFFECT_CODES.items()}


def encode(call: ToolCall, summarize: Summarize | None) -> bytes | None:
    """The plan row of `call`; None when it gets none: no `summarize`, not
    COMMITTED, no result, a key scheme this daemon does not know, or text
    that is not UTF-8 (such a record is read the long way)."""
    if (
        summarize is None
        or call.state is not State.COMMITTED
        or call.result is None
        or call.key_scheme not in KEY_SCHEMES
    ):
        return None
    try:
        summary, result_at, result_size, key_at, key_size = summarize(call)
        tool = call.tool_name.encode()
    except UnicodeError:
        return None
    flags = (ACKNOWLEDGED if call.acknowledged else 0) | (
        REJECTED if call.rejected else 0
    )
    forced = call.forced_effect
    return (
        _HEAD.pack(
            VERSION,
            flags,
            _EFFECT_CODES[call.effect],
            0 if forced is None else _EFFECT_CODES[forced],
            len(tool),
            len(summary),
            result_at,
            result_size,
            key_at,
            key_size,
        )
        + tool
        + summary
    )


def is_current(raw: bytes) -> bool:
    """Whether a row is of this version (`parts` reads only those)."""
    return raw[0] == VERSION


def parts(raw: bytes) -> tuple[int, int, str, bytes, bytes, bytes]:
    """A row's flags; the code of the effect the record itself assumes (the
    forced one, else as declared; `effect_of_code`); its tool name; its
    summary; and, as they lie in it, its result and its idempotency key,
    each as its length and bytes."""
    (
        _,
        flags,
        effect,
        forced,
        tool_size,
        summary_size,
        result_at,
        result_size,
        key_at,
        key_size,
    ) = _HEAD.unpack_from(raw)
    start = HEAD_SIZE + tool_size
    summary = raw[start : start + summary_size]
    return (
        flags,
        forced or effect,
        raw[HEAD_SIZE:start].decode(),
        summary,
        summary[result_at : result_at + result_size],
        summary[key_at : key_at + key_size],
    )


def effect_of_code(code: int) -> Effect:
    return _EFFECT_OF_CODE[code]
