"""Store keys of every identity size validation accepts (`storage.keys`):
each fits LMDB's key limit, none collides, each round-trips through the
ledger and the checkpoints, listings by run, namespace and prefix find it,
and a request with the longest identity shares a group commit with others
without failing them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sidecar.clock import ManualClock
from sidecar.errors import QuotaExceeded
from sidecar.ledger.checkpoints import Expect
from sidecar.ledger.fingerprint import fingerprint
from sidecar.ledger.model import (
    CallRef,
    Decision,
    Effect,
    Payload,
    PayloadKind,
    State,
)
from sidecar.ledger.policy import FixedPolicy
from sidecar.ledger.quota import Quotas
from sidecar.ledger.rules import PrepareSpec
from sidecar.ledger.validation import Limits, Violations
from sidecar.services.checkpoints import CheckpointService
from sidecar.services.ledger import LedgerService
from sidecar.services.retention import RetentionService
from sidecar.storage import keys, records, retention_times, tombstones
from sidecar.storage.api import Table, WriteView
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore
from tests.ledger.builders import committed, ok_result

LIMITS = Limits()
NS64 = "n" * 64
# Byte sizes around every bound: verbatim, the largest verbatim, the first
# hashed, the largest accepted; in one-, two- and four-byte characters.
ID_SIZES = (1, 127, 128, 129, 200, 201, 255, 256)
KEY_SIZES = (1, 256, 257, 440, 441, 511, 512)


def text(size: int, char: str = "a") -> str:
    """`size` bytes of UTF-8 made of `char` (and ASCII to make up the rest)."""
    width = len(char.encode())
    return char * (size // width) + "a" * (size % width)


def accepted_ids() -> list[str]:
    found = list(dict.fromkeys(text(n, c) for n in ID_SIZES for c in ("a", "é", "😀")))
    v = Violations()
    for value in found:
        v.text_id("id", value, LIMITS.max_id_bytes, no_colon=True)
    assert v.items == []
    return found


def accepted_checkpoint_keys() -> list[str]:
    found = list(dict.fromkeys(text(n, c) for n in KEY_SIZES for c in ("a", "é", "😀")))
    v = Violations()
    for value in found:
        v.text_id("key", value, LIMITS.max_key_bytes)
    assert v.items == []
    return found


# -- sizes and distinctness ------------------------------------------------------


@pytest.mark.parametrize("run_id", accepted_ids())
@pytest.mark.parametrize("call_id", [text(256), text(256, "é"), "c"])
def test_every_accepted_identity_has_keys_lmdb_stores(
    run_id: str, call_id: str
) -> None:
    """Record, index, retention-time, tombstone and tombstone-time keys of the longest
    namespace with any accepted run_id and call_id fit in 511 bytes (issue
    10 item A1: fails before the fix: 64 + 256 + 256 bytes made a 579-byte
    key)."""
    key = keys.call_key(CallRef(NS64, run_id, call_id))
    assert len(records.state_prefix(State.COMMITTED) + key) <= keys.MAX_KEY_BYTES
    assert len(tombstones.time_key(2**63 - 1, key)) <= keys.MAX_KEY_BYTES
    indexed = retention_times.key(committed(Effect.READ), key)
    assert indexed is not None
    assert len(indexed) <= keys.MAX_KEY_BYTES


@pytest.mark.parametrize("key", accepted_checkpoint_keys())
def test_every_accepted_checkpoint_key_fits(key: str) -> None:
    """A checkpoint key of 512 bytes in the longest namespace fits (issue 10
    item A1: fails before the fix: 577 bytes)."""
    assert len(keys.checkpoint_key(NS64, key)) <= keys.MAX_KEY_BYTES


def test_identities_never_share_a_key() -> None:
    """Distinct identities, long ones sharing their first bytes included,
    have distinct keys; a run's key is a prefix of its calls' keys only."""
    ids = [*accepted_ids(), text(200) + "x", text(200) + "y", text(128) + "z" * 100]
    refs = [CallRef("ns", r, c) for r in ids for c in ids[::7]]
    stored = {keys.call_key(r) for r in refs}
    assert len(stored) == len(refs)
    for r in refs:
        key = keys.call_key(r)
        owners = [
            other.run_id
            for other in {CallRef("ns", x, "") for x in ids}
            if key.startswith(keys.run_prefix("ns", other.run_id))
        ]
        assert owners == [r.run_id]
    cps = [*accepted_checkpoint_keys(), text(440) + "x", text(440) + "y"]
    assert len({keys.checkpoint_key("ns", k) for k in cps}) == len(cps)


def test_a_hashed_part_is_never_longer_than_a_verbatim_one() -> None:
    """The bounds are checked where they are made."""
    with pytest.raises(ValueError, match="hashed part"):
        keys.PartBound(verbatim=100, kept=40)


# -- over a real store ------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LmdbStore]:
    s = LmdbStore(tmp_path / "data", LmdbOptions(map_size=256 << 20, sync=False))
    yield s
    s.close()


def spec(ref: CallRef, start: bool = True) -> PrepareSpec:
    payload = Payload(PayloadKind.JSON, b'{"q": 1}')
    return PrepareSpec(
        ref=ref,
        tool_name="tool",
        effect=Effect.SIDE_EFFECT,
        input=payload,
        fingerprint=fingerprint(payload),
        require_approval=False,
        start=start,
        lease_ms=60_000,
    )


def held(store: LmdbStore) -> Callable[[], None]:
    """Holds the writer until the returned function is called, so that what
    is submitted meanwhile shares one batch."""
    inside = threading.Event()
    release = threading.Event()

    def hold(view: WriteView) -> None:
        inside.set()
        release.wait(10)

    future = store.submit(hold)
    assert inside.wait(10)

    def let_go() -> None:
        release.set()
        future.result(10)

    return let_go


def test_the_longest_identity_shares_a_batch_with_another_namespace(
    store: LmdbStore,
) -> None:
    """A prepare of a 64-byte namespace, 256-byte run_id and call_id, in the
    same group commit as a normal prepare of another namespace: both commit
    (issue 10 item A1: fails before the fix: both were STORAGE_UNAVAILABLE)."""
    clock = ManualClock()
    ledger = LedgerService(store, clock, LIMITS, FixedPolicy())
    longest = CallRef(NS64, text(256, "é"), text(256))
    normal = CallRef("default", "run-ok", "c1")

    async def scenario() -> list[Decision]:
        let_go = held(store)
        tasks = [
            asyncio.ensure_future(ledger.prepare(spec(r))) for r in (longest, normal)
        ]
        await asyncio.sleep(0)  # both are submitted to the held writer
        await asyncio.to_thread(let_go)
        return [answer.decision for answer in await asyncio.gather(*tasks)]

    assert asyncio.run(scenario()) == [Decision.EXECUTE, Decision.EXECUTE]
    assert store.stats.largest_batch >= 2
    assert asyncio.run(ledger.get(longest)).ref == longest
    assert asyncio.run(ledger.get(normal)).ref == normal


def test_every_accepted_identity_round_trips(store: LmdbStore) -> None:
    """Each accepted size is prepared, found by Get, listed by its run and
    its namespace with its readable identity, compacted to a tombstone that
    refuses it again, and the tombstone deleted after its lifetime."""
    clock = ManualClock()
    ledger = LedgerService(store, clock, LIMITS, FixedPolicy())
    ids = accepted_ids()
    refs = [CallRef(NS64, r, c) for r in ids for c in (ids[0], ids[-1], ids[-4])]

    async def scenario() -> None:
        for ref in refs:
            assert (await ledger.prepare(spec(ref, start=False))).call.ref == ref
        # A repeat finds the record: no second record for one identity.
        for ref in refs:
            again = await ledger.prepare(spec(ref, start=False))
            assert (again.decision, again.call.revision) == (Decision.EXECUTE, 1)

    asyncio.run(scenario())
    for ref in refs:
        assert asyncio.run(ledger.get(ref)).ref == ref
    for run_id in ids:
        page = asyncio.run(
            ledger.list(
                frozenset({NS64}),
                run_id=run_id,
                states=frozenset(),
                page_size=1000,
                page_token="",
            )
        )
        assert {c.ref for c in page.calls} == {r for r in refs if r.run_id == run_id}
    listed = []
    token = ""
    while True:
        page = asyncio.run(
            ledger.list(
                frozenset({NS64}),
                run_id="",
                states=frozenset(),
                page_size=5,
                page_token=token,
            )
        )
        listed += [c.ref for c in page.calls]
        token = page.next_page_token
        if not token:
            break
    assert sorted(listed, key=repr) == sorted(refs, key=repr)
    assert store.entries(Table.CALLS) == len(refs)


def test_long_identities_compact_and_expire(store: LmdbStore) -> None:
    """The compaction pass finds long identities through the by-state index,
    replaces them by tombstones under the same keys, and deletes those after
    their lifetime."""
    clock = ManualClock()
    policy = FixedPolicy()
    ledger = LedgerService(store, clock, LIMITS, policy)
    service = RetentionService(store, clock, policy)
    ref = CallRef(NS64, text(256), text(256, "😀"))

    async def scenario() -> None:
        started = await ledger.prepare(spec(ref))
        done = await ledger.commit(
            ref,
            attempt=started.call.attempt,
            result=ok_result(),
            expected_revision=None,
        )
        assert done.call.ref == ref
        clock.advance(31 * 86_400)
        assert (await service.compact()).compacted == 1
        tomb = store.read(lambda v: tombstones.load(v, ref))
        assert tomb is not None
        assert tomb.ref == ref
        assert (await service.compact()).expired == 0
        clock.advance(31 * 86_400)
        assert (await service.compact()).expired == 1

    asyncio.run(scenario())
    assert store.read(lambda v: tombstones.load(v, ref)) is None


def test_every_accepted_checkpoint_key_round_trips(store: LmdbStore) -> None:
    """Each accepted key is put, got with its value, and listed once under
    every prefix of it, page by page, with its readable key."""
    checkpoints = CheckpointService(store, ManualClock())
    found = accepted_checkpoint_keys()

    async def scenario() -> None:
        for key in found:
            await checkpoints.put(NS64, Expect(key, None), key.encode()[:9])

    asyncio.run(scenario())
    for key in found:
        got = asyncio.run(checkpoints.get(NS64, key))
        assert (got.key, got.value) == (key, key.encode()[:9])

    def listing(prefix: str, page_size: int) -> list[str]:
        keys_found: list[str] = []
        token = ""
        while True:
            page = asyncio.run(
                checkpoints.list(
                    NS64, prefix=prefix, page_size=page_size, page_token=token
                )
            )
            keys_found += [cp.key for cp in page.checkpoints]
            token = page.next_page_token
            if not token:
                return keys_found

    prefixes = {""} | {k[:n] for k in found for n in (1, 256, 300, 441, 500)}
    for prefix in sorted(prefixes):
        want = sorted(k for k in found if k.startswith(prefix))
        for page_size in (1, 3, 100):
            got_keys = listing(prefix, page_size)
            assert sorted(got_keys) == want, (prefix, page_size)
            assert len(got_keys) == len(set(got_keys))


def test_a_long_checkpoint_key_counts_and_frees_its_bytes(store: LmdbStore) -> None:
    """A hashed key's value carries the readable key; deleting it frees
    every byte it counted, so a quota sees it like any other."""
    checkpoints = CheckpointService(store, ManualClock())
    key = text(512)

    async def scenario() -> None:
        revision = await checkpoints.put("ns", Expect(key, None), b"v")
        assert store.read(lambda v: records.load_checkpoint(v, "ns", key)) is not None
        await checkpoints.delete("ns", key, revision)

    asyncio.run(scenario())
    assert store.read(lambda v: list(v.scan(Table.USAGE, b""))) == []


def test_a_quota_refusal_of_a_long_key_writes_nothing(tmp_path: Path) -> None:
    """A refusal inside the write leaves no row of the long key behind."""
    s = LmdbStore(tmp_path / "data", LmdbOptions(map_size=64 << 20, sync=False))
    checkpoints = CheckpointService(s, ManualClock(), quotas=Quotas(stored_bytes=100))
    try:
        with pytest.raises(QuotaExceeded):
            asyncio.run(checkpoints.put("ns", Expect(text(512), None), b"v"))
        assert s.read(lambda v: list(v.scan(Table.CHECKPOINTS, b""))) == []
    finally:
        s.close()
