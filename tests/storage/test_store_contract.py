"""The `api.Store` contract, the same for every store: LMDB under a data
directory and the shared PostgreSQL store. Keys in byte order, scans by
prefix and after a key, a write function all-or-nothing, its own writes
visible to itself, usage counters exact, checkpoint revisions never given
twice, the audit chain unbroken, a new incarnation per open."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sidecar.errors import QuotaExceeded, ShuttingDown
from sidecar.ledger import audit, retention, rules
from sidecar.ledger.model import Outcome, Result, State, ToolCall
from sidecar.ledger.policy import Policy
from sidecar.ledger.quota import Quotas, Usage
from sidecar.ledger.rules import Now
from sidecar.storage import keys, records, tombstones, usage
from sidecar.storage.api import CallWrite, Conflict, ReadView, Store, Table, WriteView
from sidecar.storage.keys import KeyTooLong
from sidecar.storage.lmdb.store import LmdbStore
from sidecar.storage.postgres.store import PostgresOptions, PostgresStore
from tests.services import support
from tests.support import pgbouncer, postgres

OPTIONS = PostgresOptions(readers=2)


@pytest.fixture(params=postgres.WITH_BOUNCER)
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Store]:
    """Opens the test's store (again: the same data); the kind is the param
    (PostgreSQL reached directly, or through PgBouncer in transaction mode)."""
    if request.param == "lmdb":
        return lambda: LmdbStore(tmp_path / "data")
    url = str(request.getfixturevalue("pg_url"))
    if request.param == "pgbouncer":
        url = pgbouncer.through(url, request.getfixturevalue("pg_bouncer"))
    return lambda: PostgresStore(url, OPTIONS)


@pytest.fixture
def store(opener: Callable[[], Store]) -> Iterator[Store]:
    s = opener()
    yield s
    s.close()


def _put(table: Table, key: bytes, value: bytes) -> Callable[[WriteView], None]:
    def fn(view: WriteView) -> None:
        view.put(table, key, value)

    return fn


def _scan(
    table: Table, prefix: bytes, after: bytes | None = None
) -> Callable[[ReadView], list[tuple[bytes, bytes]]]:
    return lambda view: list(view.scan(table, prefix, after=after))


def _each(fn: Callable[[int], None], numbers: range) -> None:
    for i in numbers:
        fn(i)


def test_a_committed_write_is_read_back(store: Store) -> None:
    """A put is visible to reads once its future resolves; a delete too."""
    store.submit(_put(Table.CHECKPOINTS, b"ns\x00a", b"1")).result(10)
    assert store.read(lambda v: v.get(Table.CHECKPOINTS, b"ns\x00a")) == b"1"
    assert store.read(lambda v: v.get(Table.CALLS, b"ns\x00a")) is None

    def delete(view: WriteView) -> None:
        view.delete(Table.CHECKPOINTS, b"ns\x00a")

    store.submit(delete).result(10)
    assert store.read(lambda v: v.get(Table.CHECKPOINTS, b"ns\x00a")) is None


def test_scans_are_in_byte_order_by_prefix_and_after(store: Store) -> None:
    """Keys sort bytewise (0xFF after everything, NUL first); a scan yields
    the prefix's keys only, strictly after `after`. (In a table of values;
    the index tables follow their records, `api.Table`.)"""
    keys = [b"a", b"a\x00", b"a\x00z", b"a\x01", b"a\xff", b"a\xff\xff", b"b", b"\xff"]

    def fill(view: WriteView) -> None:
        for i, key in enumerate(reversed(keys)):
            view.put(Table.PASSES, key, bytes([i]))

    store.submit(fill).result(10)

    def scan(prefix: bytes, after: bytes | None = None) -> list[bytes]:
        return [k for k, _ in store.read(_scan(Table.PASSES, prefix, after))]

    assert scan(b"") == sorted(keys)
    assert scan(b"a") == keys[:6]
    assert scan(b"a\xff") == keys[4:6]
    assert scan(b"a", b"a\x00z") == keys[3:6]
    assert scan(b"\xff") == [b"\xff"]
    # `after` before the prefix starts at the prefix.
    assert scan(b"b", b"a") == [b"b"]


def test_a_scan_longer_than_a_batch_sees_every_row(store: Store) -> None:
    """1,200 rows come back whole and in order (PostgreSQL pages by 500)."""

    def fill(view: WriteView) -> None:
        for i in range(1200):
            view.put(Table.AUDIT, i.to_bytes(8, "big"), b"x")

    store.submit(fill).result(30)
    rows = store.read(_scan(Table.AUDIT, b""))
    assert [int.from_bytes(k, "big") for k, _ in rows] == list(range(1200))


def test_tables_do_not_share_keys(store: Store) -> None:
    """The same key in two tables is two rows."""
    store.submit(_put(Table.CALLS, b"k", b"calls")).result(10)
    store.submit(_put(Table.META, b"k", b"meta")).result(10)
    assert store.read(lambda v: v.get(Table.CALLS, b"k")) == b"calls"
    assert store.read(_scan(Table.META, b"k")) == [(b"k", b"meta")]


def test_a_write_function_that_raises_leaves_nothing(store: Store) -> None:
    """All or nothing: the puts before the exception are not kept, and the
    exception reaches the caller as it was raised."""

    class Refused(Exception):
        pass

    def fn(view: WriteView) -> None:
        view.put(Table.CHECKPOINTS, b"ns\x00one", b"1")
        view.put(Table.CHECKPOINTS, b"ns\x00two", b"2")
        raise Refused

    with pytest.raises(Refused):
        store.submit(fn).result(10)
    assert store.read(_scan(Table.CHECKPOINTS, b"")) == []
    assert store.read(lambda v: usage.load(v, "ns")) == Usage()


def test_a_write_function_reads_its_own_writes(store: Store) -> None:
    """Gets and scans inside the function see its puts and deletes."""
    store.submit(_put(Table.META, b"p1", b"old")).result(10)
    store.submit(_put(Table.META, b"p3", b"gone")).result(10)

    def fn(view: WriteView) -> list[tuple[bytes, bytes]]:
        view.put(Table.META, b"p1", b"new")
        view.put(Table.META, b"p2", b"two")
        view.delete(Table.META, b"p3")
        assert view.get(Table.META, b"p1") == b"new"
        assert view.get(Table.META, b"p3") is None
        return list(view.scan(Table.META, b"p"))

    seen = store.submit(fn).result(10)
    assert seen == [(b"p1", b"new"), (b"p2", b"two")]
    assert store.read(_scan(Table.META, b"p")) == seen


def test_queued_writes_see_each_other_and_a_refused_one_leaves_nothing(
    store: Store,
) -> None:
    """Writes queued behind a busy writer commit together (a group commit):
    each sees the rows and counters of those before it, and the one that
    raises among them leaves nothing while the others are kept."""
    busy, release = threading.Event(), threading.Event()

    class Refused(Exception):
        pass

    def blocker(view: WriteView) -> None:
        busy.set()
        release.wait(10)

    def first(view: WriteView) -> None:
        view.put(Table.META, b"batch-first", b"1")
        view.put(Table.CHECKPOINTS, b"ns\x00a", b"12")

    def refused(view: WriteView) -> None:
        view.put(Table.CHECKPOINTS, b"ns\x00bad", b"x" * 100)
        raise Refused

    def second(view: WriteView) -> tuple[bytes | None, Usage]:
        seen = view.get(Table.META, b"batch-first"), view.usage("ns")
        view.put(Table.CHECKPOINTS, b"ns\x00b", b"3")
        return seen

    held = store.submit(blocker)
    assert busy.wait(10)
    queued = [store.submit(fn) for fn in (first, refused, second)]
    release.set()
    held.result(10)
    queued[0].result(10)
    with pytest.raises(Refused):
        queued[1].result(10)
    assert queued[2].result(10) == (b"1", Usage(stored_bytes=4 + 2))
    assert store.read(lambda v: v.get(Table.CHECKPOINTS, b"ns\x00bad")) is None
    assert store.read(lambda v: usage.load(v, "ns")) == Usage(stored_bytes=6 + 5)
    assert store.read(usage.recount) == store.read(usage.stored)


def test_a_key_longer_than_the_bound_is_refused(store: Store) -> None:
    """Both stores refuse the keys LMDB cannot hold, that request alone."""
    with pytest.raises(KeyTooLong):
        store.submit(_put(Table.META, b"k" * 600, b"v")).result(10)
    store.submit(_put(Table.META, b"k", b"v")).result(10)


def test_usage_counters_follow_every_put_and_delete(store: Store) -> None:
    """Stored bytes (key + value), open calls by the by-state index, and
    tombstone bytes are exact after puts, overwrites and deletes."""
    started = _new_call("c")
    key = keys.call_key(started.ref)
    done = dataclasses.replace(
        started, state=State.COMMITTED, revision=started.revision + 1
    )

    def first(view: WriteView) -> None:
        view.put(Table.CHECKPOINTS, b"ns\x00k", b"12345")
        records.save_call(view, None, started)
        view.put(Table.TOMBSTONES, b"ns\x00t", b"xy")

    store.submit(first).result(10)
    record = len(key) + len(records.encode_call(started))
    assert store.read(lambda v: usage.load(v, "ns")) == Usage(
        open_calls=1, stored_bytes=4 + 5 + record, tombstone_bytes=4 + 2
    )

    def second(view: WriteView) -> None:
        view.put(Table.CHECKPOINTS, b"ns\x00k", b"1")
        records.save_call(view, started, done)
        view.delete(Table.TOMBSTONES, b"ns\x00t")

    store.submit(second).result(10)
    record = len(key) + len(records.encode_call(done))
    assert store.read(lambda v: usage.load(v, "ns")) == Usage(
        open_calls=0, stored_bytes=4 + 1 + record
    )
    assert store.read(usage.stored) == {"ns": Usage(stored_bytes=5 + record)}
    assert store.read(usage.recount) == store.read(usage.stored)


def test_usage_counters_stay_exact_under_concurrent_writers(store: Store) -> None:
    """200 writes from 8 threads into one namespace: the counters equal a
    recount (PostgreSQL adds to rows sharded by connection)."""

    def write(i: int) -> None:
        store.submit(_put(Table.CHECKPOINTS, b"ns\x00%04d" % i, b"v" * i)).result(30)

    threads = [
        threading.Thread(target=_each, args=(write, range(t, 200, 8))) for t in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    expected = sum(7 + i for i in range(200))
    assert store.read(lambda v: usage.load(v, "ns")).stored_bytes == expected
    assert store.read(usage.recount) == store.read(usage.stored)


def test_checkpoint_revisions_are_never_given_twice(store: Store) -> None:
    """A revision given and then deleted is not given again (no ABA)."""
    given = [store.submit(records.next_checkpoint_revision).result(10)]

    class Refused(Exception):
        pass

    def refused(view: WriteView) -> None:
        records.next_checkpoint_revision(view)
        raise Refused

    with pytest.raises(Refused):
        store.submit(refused).result(10)
    given += [store.submit(records.next_checkpoint_revision).result(10)]
    assert given[1] > given[0]


def test_audit_appends_from_many_threads_form_one_chain(store: Store) -> None:
    """40 appends racing from 4 threads: sequences 1..40, each entry sealed
    after the one before it (the head serializes appends)."""

    def append(i: int) -> None:
        fact = audit.Fact(
            at_ns=i,
            actor="tester",
            action=audit.Action.POLICY_RELOAD,
            namespace="",
            run_id="",
            call_id="",
            revision_before=0,
            revision_after=0,
            state_before=None,
            state_after=None,
            reason=str(i),
            evidence="",
        )
        store.submit(lambda view: records.append_audit(view, fact)).result(30)

    threads = [
        threading.Thread(target=_each, args=(append, range(t, 40, 4))) for t in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    rows = store.read(lambda v: list(records.scan_audit(v)))
    assert [seq for seq, _ in rows] == list(range(1, 41))
    head = store.read(records.load_audit_head)
    assert audit.verify(rows, head) == audit.Verdict(True, 40)


def test_each_open_is_a_new_incarnation(opener: Callable[[], Store]) -> None:
    """Opening the store again gives a greater incarnation."""
    first = opener()
    try:
        was = first.incarnation
    finally:
        first.close()
    second = opener()
    try:
        assert second.incarnation > was
    finally:
        second.close()


def test_a_closed_store_refuses_reads_and_writes(opener: Callable[[], Store]) -> None:
    s = opener()
    s.close()
    s.close()  # a second close is harmless
    with pytest.raises(ShuttingDown):
        s.read(lambda v: v.get(Table.META, b"k"))
    with pytest.raises(ShuttingDown):
        s.submit(_put(Table.META, b"k", b"v")).result(10)


_Op = tuple[str, bytes, bytes]


def _random_ops(rng: random.Random) -> tuple[list[_Op], bool]:
    keys = [b"ns\x00" + bytes([k]) for k in b"abcdefgh"]
    ops = [
        (rng.choice(("put", "delete", "get", "scan")), rng.choice(keys), b"%d" % i)
        for i in range(rng.randrange(1, 6))
    ]
    return ops, rng.random() < 0.2


def _apply(view: WriteView | dict[bytes, bytes], ops: list[_Op]) -> list[object]:
    """Runs `ops` on a store's view, or on a dict (the model); returns what
    the reads saw."""
    seen: list[object] = []
    for op, key, value in ops:
        if isinstance(view, dict):
            if op == "put":
                view[key] = value
            elif op == "delete":
                view.pop(key, None)
            elif op == "get":
                seen.append(view.get(key))
            else:
                seen.append(sorted((k, v) for k, v in view.items() if k > key))
        elif op == "put":
            view.put(Table.CHECKPOINTS, key, value)
        elif op == "delete":
            view.delete(Table.CHECKPOINTS, key)
        elif op == "get":
            seen.append(view.get(Table.CHECKPOINTS, key))
        else:
            seen.append(list(view.scan(Table.CHECKPOINTS, b"ns\x00", after=key)))
    return seen


def test_random_batches_of_writes_match_a_model(store: Store) -> None:
    """Random puts, deletes, gets and scans, in functions queued together
    (some refused at their end): every read sees what a dict applying the
    same functions one after the other sees, and so does the store after,
    counters included."""
    seed = random.randrange(1 << 32)  # noqa: S311 - a test seed
    print(f"seed {seed}")
    rng = random.Random(seed)  # noqa: S311 - a test seed
    model: dict[bytes, bytes] = {}

    class Refused(Exception):
        pass

    def function(ops: list[_Op], refuse: bool) -> Callable[[WriteView], object]:
        def fn(view: WriteView) -> object:
            seen = _apply(view, ops)
            if refuse:
                raise Refused
            return seen

        return fn

    for _ in range(25):
        busy, release = threading.Event(), threading.Event()

        def blocker(
            view: WriteView,
            busy: threading.Event = busy,
            release: threading.Event = release,
        ) -> None:
            busy.set()
            release.wait(10)

        held = store.submit(blocker)
        assert busy.wait(10)
        batch = [_random_ops(rng) for _ in range(rng.randrange(1, 6))]
        futures = [store.submit(function(ops, refuse)) for ops, refuse in batch]
        release.set()
        held.result(10)
        for (ops, refuse), future in zip(batch, futures, strict=True):
            trial = dict(model)
            expected = _apply(trial, ops)
            if refuse:
                with pytest.raises(Refused):
                    future.result(10)
                continue
            assert future.result(10) == expected, seed
            model = trial
    assert store.read(_scan(Table.CHECKPOINTS, b"")) == sorted(model.items())
    assert store.read(usage.recount) == store.read(usage.stored)


def test_an_awaited_write_is_read_back_and_a_refused_one_leaves_nothing(
    store: Store,
) -> None:
    """`write`, awaited on a loop, answers after its commit (a read sees
    it), and one that raises raises where it is awaited, leaving nothing."""

    def refused(view: WriteView) -> None:
        view.put(Table.META, b"aw-bad", b"x")
        raise ValueError("refused")

    async def main() -> list[bytes | None]:
        await store.write(_put(Table.META, b"aw-1", b"1"))
        after = store.read(lambda v: v.get(Table.META, b"aw-1"))
        with pytest.raises(ValueError, match="refused"):
            await store.write(refused)
        return [after, store.read(lambda v: v.get(Table.META, b"aw-bad"))]

    assert asyncio.run(main()) == [b"1", None]


# -- the compare-and-swap of one call record (Store.save_call) -----------------


def _new_call(call_id: str, namespace: str = "ns") -> ToolCall:
    asked = dataclasses.replace(
        support.spec(call_id, namespace=namespace), lease_ms=60_000
    )
    return rules.prepare(None, asked, Now(1, 1, 1), Policy()).call


def _saved(store: Store, write: CallWrite) -> None:
    asyncio.run(store.save_call(write))


def _record(store: Store, call: ToolCall) -> ToolCall | None:
    return store.read(lambda view: records.load_call(view, call.ref))


def test_save_call_creates_once_and_updates_only_the_revision_read(
    store: Store,
) -> None:
    """A new call is saved while none is stored; an update only while the
    stored record is at the revision it was decided on; each lost compare
    (`Conflict`) writes nothing."""
    new = _new_call("c1")
    _saved(store, CallWrite(None, new))
    assert _record(store, new) == new
    with pytest.raises(Conflict):
        _saved(store, CallWrite(None, dataclasses.replace(new, tool_name="other")))
    later = dataclasses.replace(new, revision=new.revision + 1, updated_ns=5)
    _saved(store, CallWrite(new, later))
    assert _record(store, new) == later
    stale = dataclasses.replace(new, revision=new.revision + 1, updated_ns=9)
    with pytest.raises(Conflict):
        _saved(store, CallWrite(new, stale))
    assert _record(store, new) == later
    with pytest.raises(Conflict):
        _saved(store, CallWrite(later, stale, holds=lambda: False))
    assert _record(store, new) == later
    assert store.read(usage.recount) == store.read(usage.stored)


def test_save_call_refuses_a_call_whose_tombstone_is_stored(store: Store) -> None:
    """A call compacted after its retention window is never created again."""
    call = _new_call("c1")
    result = Result(Outcome.OK, None, "", "", "digest")
    done = dataclasses.replace(call, state=State.COMMITTED, result=result)
    store.submit(lambda view: records.save_call(view, None, done)).result(10)
    tomb = retention.tombstone(done, 10)
    store.submit(lambda view: tombstones.compact(view, done, tomb)).result(10)
    with pytest.raises(Conflict):
        _saved(store, CallWrite(None, call))
    assert _record(store, call) is None


def test_save_call_keeps_a_new_call_within_its_quotas(store: Store) -> None:
    """A new call past the namespace's open-call quota is refused and leaves
    nothing; an update of an open call is never refused by a quota."""
    quotas = Quotas(open_calls=1, stored_bytes=0)
    first, second = _new_call("c1"), _new_call("c2")
    _saved(store, CallWrite(None, first, quotas))
    with pytest.raises(QuotaExceeded):
        _saved(store, CallWrite(None, second, quotas))
    assert _record(store, second) is None
    assert store.read(lambda view: usage.load(view, "ns")).open_calls == 1
    later = dataclasses.replace(first, revision=first.revision + 1)
    _saved(store, CallWrite(first, later, quotas))
    assert store.read(usage.recount) == store.read(usage.stored)


@pytest.mark.parametrize(
    "quotas",
    [Quotas(open_calls=1, stored_bytes=0), Quotas(open_calls=0, stored_bytes=1)],
    ids=["open-calls", "stored-bytes"],
)
def test_a_new_call_found_stored_is_a_conflict_even_at_the_quota(
    store: Store, quotas: Quotas
) -> None:
    """A new call's save that finds the call stored (another request created
    it since the decision's read) loses its compare, whatever the quota: the
    request decides again and answers the call as stored. A quota's refusal
    would tell its caller the call was not made while it was."""
    first = _new_call("c1")
    _saved(store, CallWrite(None, first, Quotas()))
    # The namespace is now at (or past) its quota: the call's own record.
    again = dataclasses.replace(first, tool_name="raced")
    with pytest.raises(Conflict):
        _saved(store, CallWrite(None, again, quotas))
    assert _record(store, first) == first
