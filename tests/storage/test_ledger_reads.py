"""The ledger's reads and writes at the store's seam (`api.CallReads`,
`api.RetentionReads`, `api.CallWrites`), the same on every store, and the
same from a snapshot (where PostgreSQL reads its typed columns,
`storage.postgres.call_reads`) as from inside a write (where every store
reads its tables, with what the write has not sent yet). A random ledger,
its seed printed, against a model of it kept in Python; the scans of
PostgreSQL in batches of a few rows, so that every walk crosses batches."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, LiteralString

import pytest

from sidecar.errors import UnsupportedKeyScheme
from sidecar.ledger import retention, rules
from sidecar.ledger.model import CallRef, Outcome, Result, State, ToolCall
from sidecar.ledger.policy import Policy
from sidecar.ledger.rules import Now
from sidecar.observability.collectors import count_states
from sidecar.storage import keys, plan_rows
from sidecar.storage.api import ReadView, Store, WriteView
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore
from sidecar.storage.plan_rows import Summary
from sidecar.storage.postgres import tables
from sidecar.storage.postgres.store import PostgresOptions, PostgresStore
from sidecar.storage.postgres.views import Params, PgReadView
from tests.services import support
from tests.support import pgbouncer, postgres

CALLS = 80
STATES = (
    State.PREPARED,
    State.STARTED,
    State.AWAITING_APPROVAL,
    State.UNKNOWN,
    State.COMMITTED,
)


def _summarize(call: ToolCall) -> Summary:
    # A summary of the test's own: the rows' head is what is compared.
    return call.tool_name.encode(), 0, 0, 0, 0


@pytest.fixture(params=postgres.WITH_BOUNCER)
def store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Store]:
    opened: Store
    if request.param == "lmdb":
        opened = LmdbStore(tmp_path / "data", LmdbOptions(summarize=_summarize))
    else:
        url = str(request.getfixturevalue("pg_url"))
        if request.param == "pgbouncer":
            url = pgbouncer.through(url, request.getfixturevalue("pg_bouncer"))
        opened = PostgresStore(url, PostgresOptions(readers=2, summarize=_summarize))
        monkeypatch.setattr(tables, "SCAN_BATCH", 7)
    yield opened
    opened.close()


@dataclasses.dataclass
class _Ledger:
    """What the store should hold: records by key, and the compacted."""

    calls: dict[bytes, ToolCall]
    tombs: dict[bytes, retention.Tombstone]


def _ledger(rng: random.Random) -> tuple[list[ToolCall], _Ledger]:
    made: list[ToolCall] = []
    for i in range(CALLS):
        asked = support.spec(
            f"c{rng.randrange(1000):03d}-{i}", namespace=rng.choice(("a", "b"))
        )
        asked = dataclasses.replace(
            asked, ref=dataclasses.replace(asked.ref, run_id=rng.choice(("r1", "r2")))
        )
        call = rules.prepare(None, asked, Now(1, 1, 1), Policy()).call
        state = rng.choice(STATES)
        result = (
            Result(Outcome.OK, None, "", "", f"d{i}")
            if state is State.COMMITTED and rng.random() < 0.8
            else None
        )
        made.append(
            dataclasses.replace(
                call,
                state=state,
                result=result,
                acknowledged=result is not None and rng.random() < 0.5,
                # Ties on purpose: a retention walk orders by time, then key.
                updated_ns=rng.randrange(10) * 1_000,
            )
        )
    compacted = [c for c in made if c.result is not None and rng.random() < 0.3]
    ledger = _Ledger(
        {keys.call_key(c.ref): c for c in made if c not in compacted},
        {
            keys.call_key(c.ref): retention.tombstone(c, 50_000 + i)
            for i, c in enumerate(compacted)
        },
    )
    return made, ledger


def _filled(store: Store) -> _Ledger:
    made, ledger = _ledger(random.Random(_seed()))  # noqa: S311 - not a secret

    def fill(view: WriteView) -> None:
        for call in made:
            view.write_call(None, call)
        for key, tomb in ledger.tombs.items():
            stored = view.load_call_at(key)
            assert stored is not None
            view.compact_call(stored, tomb)

    store.submit(fill).result(30)
    return ledger


def _both(store: Store, read: str, *args: object, **kwargs: object) -> Any:
    """The view's `read` on a snapshot and inside a write (a walk as a
    list): the same, or the test fails."""

    def fn(view: ReadView) -> object:
        found = getattr(view, read)(*args, **kwargs)
        return list(found) if isinstance(found, Iterator) else found

    snapshot = store.read(fn)
    written = store.submit(fn).result(30)
    assert snapshot == written
    return snapshot


def _seed() -> int:
    seed = random.randrange(2**32)  # noqa: S311 - a test seed
    print(f"seed={seed}")
    return seed


def _retained(ledger: _Ledger, acknowledged: bool) -> list[bytes]:
    due = [
        (c.updated_ns, k)
        for k, c in ledger.calls.items()
        if c.state is State.COMMITTED
        and c.result is not None
        and c.acknowledged is acknowledged
    ]
    return [k for _, k in sorted(due)]


def test_the_calls_by_state_and_by_key(store: Store) -> None:
    """Each state's keys, of every namespace or one, resumed after a key;
    a run's records, and what a plan shows of them, with and without rows."""
    ledger = _filled(store)
    stored = sorted(ledger.calls)
    for state in STATES:
        for namespace in (None, "a"):
            wanted = [
                k
                for k in stored
                if ledger.calls[k].state is state
                and (namespace is None or keys.namespace_of(k) == namespace)
            ]
            got = _both(store, "calls_in_state", state, namespace)
            assert got == wanted, (state, namespace)
            if wanted:
                middle = wanted[len(wanted) // 2]
                after = _both(store, "calls_in_state", state, namespace, after=middle)
                assert after == [k for k in wanted if k > middle]
    for namespace, run in (("a", "r1"), ("b", "r2")):
        prefix = keys.run_prefix(namespace, run)
        run_keys = [k for k in stored if k.startswith(prefix)]
        listed = _both(store, "calls", prefix)
        assert listed == [(k, ledger.calls[k]) for k in run_keys]
        for rows in (True, False):
            shown = _both(store, "plan", prefix, rows=rows)
            assert [k for k, _ in shown] == run_keys
            for key, item in shown:
                call = ledger.calls[key]
                row = plan_rows.encode(call, _summarize) if rows else None
                if row is not None:
                    assert item == row
                else:
                    assert isinstance(item, ToolCall), item
                    assert (item.ref, item.revision) == (call.ref, call.revision)
            if len(run_keys) > 2:
                middle = run_keys[1]
                rest = _both(store, "plan", prefix, after=middle, rows=rows)
                assert rest == shown[2:]


def test_what_retention_may_compact_and_the_tombstones(store: Store) -> None:
    """The records a pass may compact, per acknowledged flag, by last change
    then key, resumed after a place; a compacted call is found as its
    tombstone; tombstones expire oldest first, a bounded number at a time."""
    ledger = _filled(store)
    for acknowledged in (True, False):
        wanted = _retained(ledger, acknowledged)
        walk = _both(store, "retained", acknowledged=acknowledged)
        assert isinstance(walk, list)
        assert [k for _, k in walk] == wanted, acknowledged
        if len(walk) > 3:
            place = walk[2][0]
            rest = _both(store, "retained", acknowledged=acknowledged, after=place)
            assert rest == walk[3:]
    for key, tomb in ledger.tombs.items():
        assert _both(store, "find_call", tomb.ref) == (None, tomb)
        assert _both(store, "load_call_at", key) is None
    for call in list(ledger.calls.values())[:5]:
        assert _both(store, "find_call", call.ref) == (call, None)
    if ledger.tombs:
        oldest = min(t.compacted_ns for t in ledger.tombs.values())
        gone = store.submit(lambda v: v.expire_tombstones(oldest + 1, 10)).result(30)
        assert gone == (1, False)
        left = store.submit(lambda v: v.expire_tombstones(10**9, 1)).result(30)
        assert left == ((1, True) if len(ledger.tombs) > 1 else (0, False))
        by_age = sorted(ledger.tombs.values(), key=lambda t: t.compacted_ns)
        for i, tomb in enumerate(by_age):
            found = (None, None) if i < 2 else (None, tomb)
            assert _both(store, "find_call", tomb.ref) == found


def test_a_record_a_newer_daemon_made_is_listed_as_its_refusal(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A walk hands a record of an unknown key scheme on as the refusal,
    for the walk's reader to skip or raise; the records after it still
    come."""
    asked = support.spec("newer", namespace="a")
    newer = rules.prepare(None, asked, Now(1, 1, 1), Policy()).call
    older = rules.prepare(
        None, support.spec("older", namespace="a"), Now(1, 1, 1), Policy()
    ).call

    def fill(view: WriteView) -> None:
        for call in (newer, older):
            view.write_call(None, call)

    store.submit(fill).result(30)
    monkeypatch.setattr(
        "sidecar.ledger.model.KEY_SCHEMES", frozenset({newer.key_scheme + 1})
    )
    prefix = keys.run_prefix("a", "run-1")
    for walk in (
        lambda v: list(v.calls(prefix)),
        lambda v: list(v.plan(prefix)),
    ):
        found = store.read(walk)
        assert [k for k, _ in found] == sorted(
            keys.call_key(CallRef("a", "run-1", c)) for c in ("newer", "older")
        )
        assert all(isinstance(item, UnsupportedKeyScheme) for _, item in found)


def test_the_records_of_each_state_are_counted_as_stored(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metrics' counts by state (`collectors.count_states`) are the
    model's, compacted calls left out. PostgreSQL's server counts them in
    one statement, where a walk takes one a state and batch (fails before:
    a scrape walked every committed key, a batch at a time)."""
    ledger = _filled(store)
    wanted = dict.fromkeys(State, 0)
    for call in ledger.calls.values():
        wanted[call.state] += 1
    statements: list[str] = []
    rows = PgReadView.rows

    def counted(view: PgReadView, query: LiteralString, params: Params) -> Any:
        statements.append(query)
        return rows(view, query, params)

    monkeypatch.setattr(PgReadView, "rows", counted)
    assert count_states(store) == wanted
    if isinstance(store, PostgresStore):
        assert len(statements) == 1, statements
