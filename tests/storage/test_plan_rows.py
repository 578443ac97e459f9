"""A plan row (`storage.plan_rows`) is, byte for byte, what the gRPC
boundary builds from the decoded record: its summary is the serialized
`ToolCall` without history (`convert.call_pb`), its result and idempotency
key lie where the head says, its head carries the record's flags, tool and
effect. On random records of every state (the seed is printed;
EFFECTD_TEST_SEED replays one): only a COMMITTED record with a result has
a row. Negative controls: a summary whose result or key is placed one
byte off, and a head whose effect codes are swapped, are caught. The rows
are kept with their records: written by a commit, gone with a compaction.
A store of format 4, before the rows, gets them at open; a store opened
without the wire form (`summarize`) writes none, drops a record's stale
row, and leaves a format 4 store's rows to the next open that has it."""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path

import lmdb
import pytest

from sidecar.ledger import retention
from sidecar.ledger.model import (
    Effect,
    Outcome,
    Payload,
    PayloadKind,
    Result,
    State,
    ToolCall,
)
from sidecar.rpc import convert, summaries
from sidecar.storage import keys, plan_rows, records, tombstones
from sidecar.storage.api import Table, WriteView
from sidecar.storage.lmdb import migration
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore
from tests.storage.random_calls import random_call

CALLS = 400
OPTIONS = LmdbOptions(map_size=64 << 20, sync=False, summarize=summaries.summarize)
BARE = LmdbOptions(map_size=64 << 20, sync=False)


@pytest.fixture
def seed() -> int:
    chosen = os.environ.get("EFFECTD_TEST_SEED")
    value = int(chosen) if chosen else random.randrange(2**32)  # noqa: S311
    print(f"seed={value}")
    return value


def _field_tail(data: bytes) -> bytes:
    """A length-delimited value as it lies in a message: length, bytes."""
    out = bytearray()
    size = len(data)
    while size >= 0x80:
        out.append((size & 0x7F) | 0x80)
        size >>= 7
    out.append(size)
    return bytes(out) + data


def problems(
    call: ToolCall, summarize: plan_rows.Summarize = summaries.summarize
) -> list[str]:
    """How the row of `call` differs from what the boundary would answer."""
    row = plan_rows.encode(call, summarize)
    eligible = call.state is State.COMMITTED and call.result is not None
    if row is None:
        return [f"{call.ref.call_id}: no row"] if eligible else []
    if not eligible:
        return [f"{call.ref.call_id}: a row for a {call.state.name} record"]
    assert plan_rows.is_current(row)
    flags, code, tool, summary, result, key = plan_rows.parts(row)
    msg = convert.call_pb(call, history=False)
    expected = {
        "summary": msg.SerializeToString(),
        "result": _field_tail(msg.result.SerializeToString()),
        "key": _field_tail(call.idempotency_key.encode()),
        "tool": call.tool_name,
        "effect": plan_rows.effect_of_code(code),
        "acknowledged": call.acknowledged,
        "rejected": call.rejected,
    }
    got = {
        "summary": summary,
        "result": result,
        "key": key,
        "tool": tool,
        "effect": call.recorded_effect,
        "acknowledged": bool(flags & plan_rows.ACKNOWLEDGED),
        "rejected": bool(flags & plan_rows.REJECTED),
    }
    return [
        f"{call.ref.call_id}: {name} {got[name]!r} != {expected[name]!r}"
        for name in expected
        if got[name] != expected[name]
    ]


def _calls(seed: int) -> list[ToolCall]:
    rng = random.Random(seed)  # noqa: S311 - not a secret
    return [random_call(rng, f"c{i:04d}") for i in range(CALLS)]


def _encode(call: ToolCall) -> bytes | None:
    return plan_rows.encode(call, summaries.summarize)


def test_every_row_is_what_the_boundary_answers(seed: int) -> None:
    calls = _calls(seed)
    assert sum(_encode(c) is not None for c in calls) > CALLS // 10
    found = [p for call in calls for p in problems(call)]
    assert found == [], f"seed={seed}"


def _result_one_off(call: ToolCall) -> plan_rows.Summary:
    data, result_at, result_size, key_at, key_size = summaries.summarize(call)
    return data, result_at + 1, result_size, key_at, key_size


def _key_one_off(call: ToolCall) -> plan_rows.Summary:
    data, result_at, result_size, key_at, key_size = summaries.summarize(call)
    return data, result_at, result_size, key_at - 1, key_size


@pytest.mark.parametrize("broken", [_result_one_off, _key_one_off])
def test_negative_control_a_field_placed_one_byte_off_is_caught(
    seed: int, broken: plan_rows.Summarize
) -> None:
    found = [p for call in _calls(seed) for p in problems(call, broken)]
    assert found, f"seed={seed}"


def test_negative_control_swapped_effect_codes_are_caught(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows whose heads give a read the code of a side effect."""
    monkeypatch.setitem(plan_rows._EFFECT_CODES, Effect.READ, 3)
    found = [p for call in _calls(seed) for p in problems(call)]
    assert found, f"seed={seed}"


def test_the_head_s_effect_codes_are_those_of_the_stored_rows() -> None:
    """The codes rows already on disk hold (the storage's own, not the
    wire's): changing them would misread every stored row."""
    assert [plan_rows.effect_of_code(c) for c in (1, 2, 3)] == [
        Effect.READ,
        Effect.IDEMPOTENT_WRITE,
        Effect.SIDE_EFFECT,
    ]


def test_a_row_is_written_with_its_commit_and_deleted_with_its_compaction(
    tmp_path: Path,
) -> None:
    rng = random.Random(7)  # noqa: S311 - not a secret
    store = LmdbStore(tmp_path / "data", OPTIONS)
    started = random_call(rng, "c1", state=State.STARTED)
    committed = random_call(rng, "c1", state=State.COMMITTED)
    while committed.result is None:
        committed = random_call(rng, "c1", state=State.COMMITTED)
    key = keys.call_key(started.ref)

    def row() -> bytes | None:
        return store.read(lambda v: v.get(Table.PLAN_ROWS, key))

    try:
        store.submit(lambda v: records.save_call(v, None, started)).result()
        assert row() is None
        store.submit(lambda v: records.save_call(v, started, committed)).result()
        assert row() == _encode(committed)
        tomb = retention.tombstone(committed, 1)
        store.submit(lambda v: tombstones.compact(v, committed, tomb)).result()
        assert row() is None
    finally:
        store.close()


def test_a_format_4_store_gets_its_rows_at_open(tmp_path: Path, seed: int) -> None:
    """A store written before plan rows (format 4: no table, no rows) is
    upgraded at open: every COMMITTED record with a result gets its row,
    no other record does, and the store is format 5."""
    path = tmp_path / "data"
    calls = _calls(seed)
    first = LmdbStore(path, OPTIONS)

    def fill(view: WriteView) -> None:
        for call in calls:
            records.save_call(view, None, call)

    first.submit(fill).result()
    first.close()
    env = lmdb.open(str(path), max_dbs=len(Table), subdir=True)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(Table.PLAN_ROWS.value.encode(), txn=txn), delete=True)
        meta = env.open_db(Table.META.value.encode(), txn=txn)
        txn.put(b"format_version", b"4", db=meta)
    env.close()

    reopened = LmdbStore(path, OPTIONS)
    try:
        assert reopened.read(lambda v: v.get(Table.META, b"format_version")) == b"5"
        assert reopened.read(lambda v: v.get(Table.META, migration.PENDING_KEY)) is None
        rows = reopened.read(lambda v: dict(v.scan(Table.PLAN_ROWS, b"")))
        # The rows of the upgrade are those of a save (a row shows no
        # history: the upgrade decodes none).
        expected = {
            keys.call_key(c.ref): row for c in calls if (row := _encode(c)) is not None
        }
        assert expected, f"seed={seed}"
        assert rows == expected, f"seed={seed}"
    finally:
        reopened.close()


def test_a_record_that_protobuf_could_not_carry_gets_no_row(seed: int) -> None:
    """JSON text that is not UTF-8 (no string field holds it): the record is
    read the long way, as before plan rows."""
    rng = random.Random(seed)  # noqa: S311 - not a secret
    call = random_call(rng, "c1", state=State.COMMITTED)
    bad = Result(Outcome.OK, Payload(PayloadKind.JSON, b'"\xff"'), "", "", "d")
    assert _encode(dataclasses.replace(call, result=bad)) is None
    assert _encode(dataclasses.replace(call, tool_name="\ud800")) is None


def test_a_record_that_leaves_committed_loses_its_row(tmp_path: Path) -> None:
    """No rule moves a COMMITTED record elsewhere; if one did, its row
    would not answer for it."""
    rng = random.Random(11)  # noqa: S311 - not a secret
    committed = random_call(rng, "c1", state=State.COMMITTED)
    while committed.result is None:
        committed = random_call(rng, "c1", state=State.COMMITTED)
    reopened = dataclasses.replace(committed, state=State.PREPARED, result=None)
    key = keys.call_key(committed.ref)
    store = LmdbStore(tmp_path / "data", OPTIONS)
    try:
        store.submit(lambda v: records.save_call(v, None, committed)).result()
        assert store.read(lambda v: v.get(Table.PLAN_ROWS, key)) is not None
        store.submit(lambda v: records.save_call(v, committed, reopened)).result()
        assert store.read(lambda v: v.get(Table.PLAN_ROWS, key)) is None
    finally:
        store.close()


def _committed(seed: int) -> ToolCall:
    rng = random.Random(seed)  # noqa: S311 - not a secret
    committed = random_call(rng, "c1", state=State.COMMITTED)
    while committed.result is None:
        committed = random_call(rng, "c1", state=State.COMMITTED)
    return committed


def test_a_store_without_the_wire_form_writes_no_row_and_drops_a_stale_one(
    tmp_path: Path, seed: int
) -> None:
    """An offline tool's open: the record is saved, its row (written by a
    daemon's open before) is gone, since it would no longer answer for it."""
    committed = _committed(seed)
    acknowledged = dataclasses.replace(committed, acknowledged=True)
    key = keys.call_key(committed.ref)
    path = tmp_path / "data"
    store = LmdbStore(path, OPTIONS)
    try:
        store.submit(lambda v: records.save_call(v, None, committed)).result()
        assert store.read(lambda v: v.get(Table.PLAN_ROWS, key)) is not None
    finally:
        store.close()
    bare = LmdbStore(path, BARE)
    try:
        bare.submit(lambda v: records.save_call(v, committed, acknowledged)).result()
        assert bare.read(lambda v: v.get(Table.PLAN_ROWS, key)) is None
        assert bare.read(lambda v: v.get(Table.CALLS, key)) is not None
    finally:
        bare.close()


def test_a_format_4_store_opened_without_the_wire_form_gets_its_rows_later(
    tmp_path: Path, seed: int
) -> None:
    path = tmp_path / "data"
    calls = _calls(seed)
    first = LmdbStore(path, BARE)

    def fill(view: WriteView) -> None:
        for call in calls:
            records.save_call(view, None, call)

    first.submit(fill).result()
    first.close()
    env = lmdb.open(str(path), max_dbs=len(Table), subdir=True)
    with env.begin(write=True) as txn:
        meta = env.open_db(Table.META.value.encode(), txn=txn)
        txn.put(b"format_version", b"4", db=meta)
    env.close()

    bare = LmdbStore(path, BARE)
    try:
        assert bare.read(lambda v: v.get(Table.META, migration.PENDING_KEY)) == b"4"
        assert bare.read(lambda v: list(v.scan(Table.PLAN_ROWS, b""))) == []
    finally:
        bare.close()
    daemon_s = LmdbStore(path, OPTIONS)
    try:
        assert daemon_s.read(lambda v: v.get(Table.META, migration.PENDING_KEY)) is None
        rows = daemon_s.read(lambda v: dict(v.scan(Table.PLAN_ROWS, b"")))
        assert rows, f"seed={seed}"
        assert rows == {
            keys.call_key(c.ref): row for c in calls if (row := _encode(c)) is not None
        }, f"seed={seed}"
    finally:
        daemon_s.close()
