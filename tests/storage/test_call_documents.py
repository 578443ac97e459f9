"""A record decoded without its history (`decode_call(history=False)`, what
a recovery page reads) answers exactly as the whole record wherever the
history is not shown: the plan's item and its call summary are the same.
An UNKNOWN record keeps its history, since an old one (stored before
`unknown_since` was kept) knows from there when its outcome became unknown;
negative control: without it, that time would be wrong."""

from __future__ import annotations

import dataclasses

import pytest

from sidecar.ledger import recovery
from sidecar.ledger.model import Effect, State, ToolCall
from sidecar.ledger.policy import Policy
from sidecar.rpc import convert
from sidecar.rpc.recovery import item_pb
from sidecar.storage.call_documents import decode_call, encode_call
from tests.ledger import builders

UNKNOWN = builders.unknown(Effect.READ)
RECORDS = {
    "prepared": builders.prepared(Effect.READ),
    "awaiting": builders.awaiting(Effect.SIDE_EFFECT),
    "started": builders.started(Effect.IDEMPOTENT_WRITE),
    "unknown": builders.unknown(Effect.SIDE_EFFECT),
    "committed": builders.committed(Effect.READ),
    "rejected": builders.rejected(Effect.SIDE_EFFECT),
    # Stored before `unknown_since` was kept, and changed since it became
    # UNKNOWN: only the history tells when that was.
    "old unknown": dataclasses.replace(
        UNKNOWN, unknown_since_ns=0, updated_ns=UNKNOWN.updated_ns + 5
    ),
}


@pytest.mark.parametrize("name", RECORDS)
def test_a_summary_decodes_to_the_same_plan_item(name: str) -> None:
    raw = encode_call(RECORDS[name])
    whole, summary = decode_call(raw), decode_call(raw, history=False)
    assert whole.history
    # The summary leaves the kept input out (no plan shows it), and the
    # history too, but an UNKNOWN record's.
    bare = dataclasses.replace(whole, kept_input=None)
    if whole.state is State.UNKNOWN:
        assert summary == bare
    else:
        assert summary == dataclasses.replace(bare, history=())
    [a, b] = recovery.plan([whole, summary], Policy()).items
    assert item_pb(a) == item_pb(b)
    assert convert.call_pb(whole, history=False) == convert.call_pb(
        summary, history=False
    )


def test_negative_control_an_old_unknown_record_without_history_is_caught() -> None:
    """Leaving the history out of an old UNKNOWN record changes the time its
    outcome became unknown that the plan shows."""
    old: ToolCall = decode_call(encode_call(RECORDS["old unknown"]))
    bare = dataclasses.replace(old, history=())
    assert convert.call_pb(old, history=False) != convert.call_pb(bare, history=False)
