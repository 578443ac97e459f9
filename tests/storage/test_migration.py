"""The upgrade of a store of format 2, written by the effectd before format 3
(`old_stores/format2.tar.gz`, made by `old_stores/make_format2.py`), to
format 3 at open (`storage.lmdb.migration`): every call and checkpoint is found
under its identity, long ones included, so none is recorded or executed
again; records keep comparing with repeated prepares of their own inputs;
approvals bound to a fingerprint still apply; counters are exact; an
upgrade stopped midway is resumed. Negative control: an upgrade that leaves
long identities where format 2 put them is caught."""

from __future__ import annotations

import asyncio
import dataclasses
import tarfile
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from sidecar.clock import ManualClock
from sidecar.errors import EffectdError, InputMismatch
from sidecar.ledger import fingerprint
from sidecar.ledger.model import (
    FINGERPRINT_V1,
    FINGERPRINT_V2,
    CallRef,
    Decision,
    Payload,
    State,
)
from sidecar.ledger.operator_rules import ApprovalDecision
from sidecar.ledger.policy import FixedPolicy
from sidecar.ledger.validation import Limits
from sidecar.rpc import summaries
from sidecar.services.checkpoints import CheckpointService
from sidecar.services.ledger import LedgerService
from sidecar.services.operator import OperatorService
from sidecar.storage import tombstones, usage
from sidecar.storage.api import Table
from sidecar.storage.lmdb import migration
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore
from tests.storage.old_stores.make_format2 import (
    JSON_INPUT,
    LONG_CALL,
    LONG_KEY,
    LONG_RUN,
    NS,
    RAW_INPUT,
    RUN,
    spec,
)
from tests.storage.test_usage import drift

FIXTURE = Path(__file__).parent / "old_stores" / "format2.tar.gz"
# A daemon's open: the upgrade writes the plan rows too.
OPTIONS = LmdbOptions(map_size=64 << 20, sync=False, summarize=summaries.summarize)
LONG = CallRef(NS, LONG_RUN, LONG_CALL)
LONG_GONE = CallRef(NS, LONG_RUN, "gone-" + "g" * 240)


def unpack(into: Path) -> Path:
    into.mkdir(mode=0o700)
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(into, filter="data")
    return into


@pytest.fixture
def old(tmp_path: Path) -> Path:
    return unpack(tmp_path / "data")


@pytest.fixture
def store(old: Path) -> Iterator[LmdbStore]:
    s = LmdbStore(old, OPTIONS)
    yield s
    s.close()


def meta(store: LmdbStore, key: bytes) -> bytes | None:
    return store.read(lambda v: v.get(Table.META, key))


def test_the_fixture_is_a_format_2_store(tmp_path: Path) -> None:
    """The store under test is what the old code wrote: format 2, long
    identities in verbatim keys of up to 511 bytes."""
    env = lmdb.open(str(unpack(tmp_path / "raw")), max_dbs=16, readonly=True)
    try:
        with env.begin() as txn:
            assert txn.get(b"format_version", db=env.open_db(b"meta", txn=txn)) == b"2"
            calls = env.open_db(b"calls", txn=txn)
            longest = max(len(k) for k, _ in txn.cursor(db=calls))
            assert longest == len(f"{NS}\0{LONG_RUN}\0{LONG_CALL}")
    finally:
        env.close()


def problems(store: LmdbStore) -> list[str]:
    """What is wrong with the store after its upgrade, for the agent and the
    operator: each call and checkpoint of the old store found under its
    identity and answered as before."""
    found: list[str] = []
    clock = ManualClock(wall_ns=1_800_000_000_000_000_000)
    ledger = LedgerService(store, clock, Limits(), FixedPolicy())

    async def answer(ref: CallRef, payload: Payload) -> str:
        try:
            got = await ledger.prepare(spec(ref, payload))
        except EffectdError as exc:
            return exc.reason
        return f"{got.decision.name}@{got.call.revision}"

    expected = {
        # The record is found: the same answer as before the upgrade, never
        # a new record (EXECUTE@1 of a long identity would be a duplicate).
        (LONG, "raw"): "RETURN_RESULT@3",
        (LONG_GONE, "json"): "RESULT_COMPACTED",
        (CallRef(NS, RUN, "gone"), "json"): "RESULT_COMPACTED",
        (CallRef(NS, RUN, "json-prepared"), "json"): "EXECUTE@1",
        (CallRef(NS, RUN, "raw-prepared"), "raw"): "EXECUTE@1",
        (CallRef(NS, RUN, "raw-committed"), "raw"): "RETURN_RESULT@3",
        (CallRef(NS, RUN, "awaiting"), "json"): "AWAIT_APPROVAL@1",
        (CallRef(NS, RUN, "approved"), "raw"): "EXECUTE@2",
        # Another input is still another input.
        (CallRef(NS, RUN, "json-prepared"), "other"): "INPUT_MISMATCH",
        (LONG, "other"): "INPUT_MISMATCH",
        (LONG_GONE, "other"): "INPUT_MISMATCH",
    }
    inputs = {
        "json": JSON_INPUT,
        "raw": RAW_INPUT,
        "other": dataclasses.replace(JSON_INPUT, data=b'{"other": 1}'),
    }

    async def answers() -> dict[tuple[CallRef, str], str]:
        return {key: await answer(key[0], inputs[key[1]]) for key in expected}

    got = asyncio.run(answers())
    found += [
        f"{k[0].call_id[:20]} {k[1]}: {got[k]} != {v}"
        for k, v in expected.items()
        if got[k] != v
    ]
    if store.entries(Table.CALLS) != 8:
        found.append(f"{store.entries(Table.CALLS)} records, the old store held 8")

    checkpoints = CheckpointService(store, clock)
    for key, value in (("a/1", b"one"), ("a/2", b"two"), (LONG_KEY, b"long")):
        try:
            if asyncio.run(checkpoints.get(NS, key)).value != value:
                found.append(f"checkpoint {key[:10]} has another value")
        except EffectdError as exc:
            found.append(f"checkpoint {key[:10]}: {exc.reason}")
    page = asyncio.run(checkpoints.list(NS, prefix="", page_size=10, page_token=""))
    listed = [cp.key for cp in page.checkpoints]
    if sorted(listed) != sorted(["a/1", "a/2", LONG_KEY]):
        found.append(f"checkpoints listed: {[k[:10] for k in listed]}")

    if store.read(drift):
        found.append(f"usage counters drift: {store.read(drift)}")
    indexed = store.read(lambda v: len(list(v.scan(Table.TOMBSTONE_TIMES, b""))))
    if indexed != 2:
        found.append(f"{indexed} tombstones indexed by time, the old store held 2")
    return found


def test_a_format_2_store_is_upgraded_and_answers_as_before(store: LmdbStore) -> None:
    """After the upgrade every call and checkpoint of the old store is found
    under its identity and answered as before (issue 10 items A1, C13; the
    negative controls below are the keys and fingerprints of format 3
    without this upgrade: long identities looked up where they are not and
    executed again, old records refusing their own inputs)."""
    assert problems(store) == []
    assert meta(store, b"format_version") == b"5"
    assert meta(store, migration.PENDING_KEY) is None


def test_old_records_keep_their_fingerprints_and_new_ones_name_the_kind(
    store: LmdbStore,
) -> None:
    """An upgraded record keeps its V1 fingerprint, compares in V1 with a
    repeat of either kind of the same bytes (the limit of V1), and a record
    made after the upgrade holds a V2 fingerprint that tells the kinds apart."""
    ledger = LedgerService(store, ManualClock(), Limits(), FixedPolicy())
    old = asyncio.run(ledger.get(CallRef(NS, RUN, "raw-prepared")))
    assert old.fingerprint_scheme == FINGERPRINT_V1
    assert old.input_fingerprint == fingerprint.of(RAW_INPUT, FINGERPRINT_V1)
    as_json = dataclasses.replace(RAW_INPUT, kind=JSON_INPUT.kind)
    fresh = CallRef(NS, RUN, "fresh")

    async def scenario() -> None:
        again = await ledger.prepare(spec(old.ref, as_json))
        assert again.call.revision == old.revision
        made = await ledger.prepare(spec(fresh, RAW_INPUT))
        assert made.call.fingerprint_scheme == FINGERPRINT_V2
        with pytest.raises(InputMismatch):
            await ledger.prepare(spec(fresh, as_json))

    asyncio.run(scenario())


def test_an_approval_bound_to_an_old_fingerprint_applies(store: LmdbStore) -> None:
    """An approver who read the waiting call's fingerprint (before or after
    the upgrade) approves it with that fingerprint."""
    clock = ManualClock()
    ref = CallRef(NS, RUN, "awaiting")
    waiting = asyncio.run(LedgerService(store, clock, Limits(), FixedPolicy()).get(ref))
    operator = OperatorService(store, clock, Limits())
    decision = ApprovalDecision(
        approve=True,
        approver="bob",
        reason="ok",
        expected_revision=waiting.revision,
        input_fingerprint=fingerprint.of(JSON_INPUT, FINGERPRINT_V1),
    )
    done = asyncio.run(operator.decide_approval(ref, decision))
    assert (done.decision, done.call.state) == (Decision.EXECUTE, State.PREPARED)


def test_a_stopped_upgrade_is_resumed(
    old: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade that stops after moving the rows leaves format 5 with the
    pending mark (a daemon of format 2 or 3 refuses the store); the next open
    finishes it, with the same result as an upgrade in one go."""

    def stop(*args: object, **kwargs: object) -> object:
        raise RuntimeError("stopped")

    with monkeypatch.context() as patch:
        patch.setattr(migration, "_index_tombstones", stop)
        patch.setattr(migration, "BATCH", 2)
        with pytest.raises(RuntimeError, match="stopped"):
            LmdbStore(old, OPTIONS)
    env = lmdb.open(str(old), max_dbs=16, readonly=True)
    try:
        with env.begin() as txn:
            db = env.open_db(b"meta", txn=txn)
            marks = [txn.get(k, db=db) for k in (b"format_version", b"upgrade_pending")]
    finally:
        env.close()
    assert marks == [b"5", b"2"]
    half = LmdbStore(old, OPTIONS)
    try:
        assert problems(half) == []
        assert meta(half, migration.PENDING_KEY) is None
        assert half.incarnation == 3
    finally:
        half.close()


def test_the_tombstones_of_the_old_store_expire(store: LmdbStore) -> None:
    """Tombstones of the old store are indexed by when they were made and
    counted apart from stored bytes."""
    made = store.read(
        lambda v: sorted(
            tombstones.decode(raw).compacted_ns
            for _, raw in v.scan(Table.TOMBSTONES, b"")
        )
    )
    assert len(made) == 2
    stored = store.read(usage.stored)
    assert stored[NS].tombstone_bytes > 0
    assert stored["other"].tombstone_bytes == 0


def test_negative_control_an_upgrade_that_leaves_long_keys_is_caught(
    old: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: an upgrade that moves no row leaves the long
    identities under their format 2 keys; the check finds the long call
    executed again and the long checkpoint missing."""
    monkeypatch.setattr(migration, "_MOVES", ())
    for step in ("_index_tombstones", "_index_retention"):
        monkeypatch.setattr(
            migration, step, lambda view, after: migration._Step(0, None)
        )
    broken = LmdbStore(old, OPTIONS)
    try:
        found = problems(broken)
    finally:
        broken.close()
    assert any("EXECUTE@1" in p for p in found), found
    assert any("checkpoint kkkk" in p for p in found), found


def test_negative_control_comparing_old_records_in_v2_is_caught(
    store: LmdbStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: comparing an old record's fingerprint with the
    repeat's V2 fingerprint refuses the same input as INPUT_MISMATCH."""
    correct = fingerprint.of
    monkeypatch.setattr(fingerprint, "of", lambda p, scheme: correct(p, FINGERPRINT_V2))
    found = problems(store)
    assert any("json-prepared json: INPUT_MISMATCH" in p for p in found), found


def test_resumption_never_runs_on_a_store_without_the_mark(tmp_path: Path) -> None:
    """A new store is format 5 from its first open, with nothing to upgrade."""
    s = LmdbStore(tmp_path / "new", OPTIONS)
    try:
        assert meta(s, b"format_version") == b"5"
        assert meta(s, migration.PENDING_KEY) is None
        assert not migration.resume(s, summaries.summarize)
    finally:
        s.close()
