"""The retention index (`storage.retention_times`) stays exact under random
operations: after every step it holds one entry per COMMITTED record with a
result, under the record's acknowledgement and last change, and nothing
else; and after each retention pass no record a full scan finds due is
left. The operations are seeded (the seed is printed; EFFECTD_TEST_SEED
replays one). Negative controls: an index that is not updated when a
record is compacted, or when a result is acknowledged, is caught.

A store written before the index existed (format 3) gets it at open, and
its due records are compacted by the indexed pass."""

from __future__ import annotations

import asyncio
import functools
import os
import random
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import lmdb
import pytest

from sidecar.clock import ManualClock
from sidecar.errors import EffectdError
from sidecar.ledger import retention
from sidecar.ledger.model import CallRef, Effect, State, ToolCall
from sidecar.ledger.policy import FixedPolicy, Policy
from sidecar.ledger.validation import Limits
from sidecar.rpc import summaries
from sidecar.services.ledger import LedgerService
from sidecar.services.recovery import RecoveryService
from sidecar.services.retention import RetentionService
from sidecar.storage import records, retention_times, tombstones
from sidecar.storage.api import ReadView, Table
from sidecar.storage.lmdb import migration
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore
from tests.ledger.builders import ok_result
from tests.services.support import spec

# A daemon's open: an upgrade writes the plan rows too.
OPTIONS = LmdbOptions(map_size=64 << 20, sync=False, summarize=summaries.summarize)
POLICY = Policy(
    retention_seconds=100,
    unacknowledged_retention_seconds=300,
    tombstone_seconds=1000,
)
STEPS = 400
KINDS = (
    *("prepare", "prepare", "commit", "commit", "ack", "unknown"),
    *("advance", "compact", "recover"),
)


def drift(view: ReadView) -> list[str]:
    """How the index differs from the index a full scan of the records
    makes."""
    expected = set()
    for key, raw in view.scan(Table.CALLS, b""):
        indexed = retention_times.key(records.decode_call(raw), key)
        if indexed is not None:
            expected.add(indexed)
    found = {key for key, _ in view.scan(Table.RETENTION_TIMES, b"")}
    return [f"missing {k!r}" for k in sorted(expected - found)] + [
        f"stale {k!r}" for k in sorted(found - expected)
    ]


def left_due(view: ReadView, now_ns: int) -> list[str]:
    """Records a full scan finds due."""
    return [
        call.ref.call_id
        for _, raw in view.scan(Table.CALLS, b"")
        if retention.is_due(call := records.decode_call(raw), POLICY, now_ns)
    ]


class _World:
    def __init__(self, store: LmdbStore) -> None:
        self.store = store
        self.clock = ManualClock()
        policy = FixedPolicy(POLICY)
        self.ledger = LedgerService(store, self.clock, Limits(), policy)
        self.recovery = RecoveryService(store, self.clock, Limits(), policy)
        self.retention = RetentionService(store, self.clock, policy, batch=3)
        self.compacted = 0

    def calls(self) -> list[ToolCall]:
        return self.store.read(
            lambda v: [records.decode_call(raw) for _, raw in v.scan(Table.CALLS, b"")]
        )

    async def step(self, rng: random.Random) -> str:
        calls = self.calls()
        kind = rng.choice(KINDS)
        try:
            match kind:
                case "prepare":
                    call_id = f"c{rng.randrange(60):02d}"
                    effect = rng.choice(list(Effect))
                    await self.ledger.prepare(spec(call_id, effect, start=True))
                case "commit" | "unknown" if calls:
                    call = rng.choice(calls)
                    if kind == "commit":
                        await self.ledger.commit(
                            call.ref,
                            attempt=call.attempt,
                            result=ok_result(),
                            expected_revision=None,
                        )
                    else:
                        await self.ledger.report_unknown(
                            call.ref, attempt=call.attempt, reason="lost"
                        )
                case "ack" if calls:
                    call = rng.choice(calls)
                    await self.recovery.acknowledge(
                        call.ref.namespace, call.ref.run_id, [call.ref.call_id]
                    )
                case "advance":
                    self.clock.advance(rng.choice([1, 30, 90, 150, 400, 1200]))
                case "compact":
                    self.compacted += (await self.retention.compact()).compacted
                    due = self.store.read(lambda v: left_due(v, self.clock.wall_ns()))
                    assert due == [], f"due after a pass: {due}"
                case "recover":
                    await self.recovery.recover("default", "run-1")
        except EffectdError:
            pass  # a refused step changes nothing
        return kind


def _random_run(store: LmdbStore, seed: int) -> tuple[list[str], int]:
    """Runs the seeded steps; returns the drift found after the first step
    that made one (empty: none did), and how many records the retention
    passes compacted."""
    rng = random.Random(seed)  # noqa: S311 - not a secret
    world = _World(store)

    async def run() -> list[str]:
        for _ in range(STEPS):
            await world.step(rng)
            found = store.read(drift)
            if found:
                return found
        return []

    return asyncio.run(run()), world.compacted


@pytest.fixture
def seed() -> int:
    chosen = os.environ.get("EFFECTD_TEST_SEED")
    value = int(chosen) if chosen else random.randrange(2**32)  # noqa: S311
    print(f"seed={value}")
    return value


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LmdbStore]:
    s = LmdbStore(tmp_path / "data", OPTIONS)
    yield s
    s.close()


def test_the_index_matches_a_full_scan_after_every_step(
    store: LmdbStore, seed: int
) -> None:
    found, compacted = _random_run(store, seed)
    assert found == [], f"seed={seed}"
    # The passes did compact records: the index was exercised, not just kept.
    # (Whether tombstones are left at the end depends on the seed: a long
    # enough advance expires them all.)
    assert compacted > 0, f"seed={seed}"


def test_negative_control_an_index_left_behind_by_compaction_is_caught(
    store: LmdbStore, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compaction that deletes the record but not its index entry."""
    monkeypatch.setattr(
        tombstones, "retention_times", SimpleNamespace(key=lambda call, key: None)
    )
    found, _ = _random_run(store, seed)
    assert any(p.startswith("stale") for p in found), f"seed={seed}: {found}"


def test_negative_control_an_acknowledgement_left_out_is_caught(
    store: LmdbStore, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index whose entries never move when a result is acknowledged."""
    correct = retention_times.key

    def without_ack(call: ToolCall, key: bytes) -> bytes | None:
        found = correct(call, key)
        if found is None or not call.acknowledged:
            return found
        # As if unacknowledged, at the time of the commit.
        return retention_times.UNACKNOWLEDGED + found[1:9] + key

    monkeypatch.setattr(records, "retention_times", SimpleNamespace(key=without_ack))
    found, _ = _random_run(store, seed)
    assert found, f"seed={seed}"


# -- a store of format 3, written before the index -----------------------------


def _as_format_3(path: Path) -> None:
    """Takes the index out of a store and marks it format 3, as the daemon
    of format 3 left it."""
    env = lmdb.open(str(path), max_dbs=len(Table), subdir=True)
    with env.begin(write=True) as txn:
        index = env.open_db(Table.RETENTION_TIMES.value.encode(), txn=txn)
        txn.drop(index, delete=True)
        meta = env.open_db(Table.META.value.encode(), txn=txn)
        txn.put(b"format_version", b"3", db=meta)
    env.close()


def test_a_store_without_the_index_gets_it_at_open(tmp_path: Path) -> None:
    """Committed records (acknowledged and not), open ones and tombstones,
    written before the index: after the upgrade the index matches a full
    scan, the pending mark is gone, the format is 4, and the indexed pass
    compacts exactly what a full scan finds due."""
    path = tmp_path / "data"
    first = LmdbStore(path, OPTIONS)
    world = _World(first)

    async def fill() -> None:
        for i in range(30):
            answer = await world.ledger.prepare(
                spec(f"c{i:02d}", Effect.READ, start=True)
            )
            if i % 3:
                await world.ledger.commit(
                    answer.call.ref,
                    attempt=answer.call.attempt,
                    result=ok_result(),
                    expected_revision=None,
                )
            if i % 3 == 1:
                await world.recovery.acknowledge("default", "run-1", [f"c{i:02d}"])
            if i == 15:
                world.clock.advance(200)

    asyncio.run(fill())
    first.close()
    _as_format_3(path)

    reopened = LmdbStore(path, OPTIONS)
    try:
        assert reopened.read(lambda v: v.get(Table.META, b"format_version")) == b"5"
        assert reopened.read(lambda v: v.get(Table.META, migration.PENDING_KEY)) is None
        assert reopened.read(drift) == []
        assert (
            len(reopened.read(lambda v: list(v.scan(Table.RETENTION_TIMES, b"")))) == 20
        )
        clock = world.clock
        clock.advance(50)
        due = reopened.read(lambda v: left_due(v, clock.wall_ns()))
        assert due  # the acknowledged calls before the advance
        service = RetentionService(reopened, clock, FixedPolicy(POLICY))
        done = asyncio.run(service.compact())
        assert done.compacted == len(due)
        assert reopened.read(lambda v: left_due(v, clock.wall_ns())) == []
        assert reopened.read(drift) == []
        for call_id in due:
            ref = CallRef("default", "run-1", call_id)
            assert reopened.read(functools.partial(records.load_call, ref=ref)) is None
    finally:
        reopened.close()


def test_negative_control_a_store_opened_without_the_backfill_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade that skips the backfill leaves the committed records out of
    the index: the drift check finds them missing."""
    path = tmp_path / "data"
    first = LmdbStore(path, OPTIONS)
    world = _World(first)

    async def fill() -> None:
        answer = await world.ledger.prepare(spec("c", Effect.READ, start=True))
        await world.ledger.commit(
            answer.call.ref,
            attempt=answer.call.attempt,
            result=ok_result(),
            expected_revision=None,
        )

    asyncio.run(fill())
    first.close()
    _as_format_3(path)
    monkeypatch.setattr(
        migration, "_index_retention", lambda view, after: migration._Step(0, None)
    )
    reopened = LmdbStore(path, OPTIONS)
    try:
        assert any(p.startswith("missing") for p in reopened.read(drift))
    finally:
        reopened.close()


def test_states_never_compacted_are_never_indexed(store: LmdbStore) -> None:
    """Only COMMITTED records with a result have an entry."""
    world = _World(store)

    async def fill() -> None:
        await world.ledger.prepare(spec("p", Effect.READ, start=False))
        await world.ledger.prepare(spec("s", Effect.READ, start=True))

    asyncio.run(fill())
    states = {c.state for c in world.calls()}
    assert states == {State.PREPARED, State.STARTED}
    assert store.read(lambda v: list(v.scan(Table.RETENTION_TIMES, b""))) == []
