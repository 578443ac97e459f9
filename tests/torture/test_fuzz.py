"""Fuzzing of decode, validate and dispatch for every RPC of every service,
through a real daemon on each store, LMDB and PostgreSQL (issue 15 item 5):
requests drawn from the message descriptors (`tests/torture/protofuzz.py`),
raw bytes mangled from them, and session streams of such messages, in random
sequences against one daemon whose records they keep changing. Nothing may
be answered UNKNOWN or INTERNAL, nothing may hang, every refusal carries its
ErrorInfo reason with the code of the error table, and a refused request
writes nothing (`tests/torture/fuzzing.py` checks each answer).

The fast setting (`make test`) sends requests for `FAST_SECONDS` of the
store at most; `TORTURE_FUZZ_EXECS` asks for at least that many (`make
torture-deep`: 100,000, with `TORTURE_FUZZ_MUTANTS` 9 mutants of each drawn
request), on PostgreSQL `TORTURE_FUZZ_PG_EXECS` if set, and `TORTURE_REPORT`
gets the figures of each store (NAME-fuzz-lmdb.json,
NAME-fuzz-postgres.json). The seed is printed; `TORTURE_FUZZ_SEED` replays
one. A failing input is written to `TORTURE_FUZZ_FAILURE` (default: a file
in the temporary directory); keep it under `tests/torture/corpus/`, where
`test_the_corpus_is_answered_well` replays every file.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import hypothesis
import psycopg
import pytest
from effectd.v1 import ledger_pb2 as pb
from hypothesis import HealthCheck
from hypothesis import strategies as st

from sidecar.ledger.checkpoints import Op
from sidecar.rpc import checkpoints as rpc_checkpoints
from sidecar.rpc import convert
from tests.rpc.support import assert_serving
from tests.support import pg_writes, postgres
from tests.torture import fuzzing, protofuzz

METHODS = fuzzing.methods()
UNARY = sorted(p for p in METHODS if p != fuzzing.SESSION)
CORPUS = Path(__file__).parent / "corpus"
# Each request on PostgreSQL is a few round trips more: a shorter run there.
FAST_SECONDS = {"lmdb": 30.0, "postgres": 20.0}
WANTED = {
    "lmdb": int(os.environ.get("TORTURE_FUZZ_EXECS") or 0),
    "postgres": int(
        os.environ.get("TORTURE_FUZZ_PG_EXECS")
        or os.environ.get("TORTURE_FUZZ_EXECS")
        or 0
    ),
}
SEED = int(
    os.environ.get("TORTURE_FUZZ_SEED") or random.SystemRandom().randrange(1 << 32)
)
# Examples of one Hypothesis run; runs repeat until the time or count is met.
ROUND = 10
MAX_STEPS = 6
# Mutants sent after each drawn request (cheap: no Hypothesis draw).
MUTANTS = int(os.environ.get("TORTURE_FUZZ_MUTANTS") or 3)

Step = tuple[str, list[bytes]]


def steps(
    paths: list[str], pools: protofuzz.Pools, session: bool = True
) -> st.SearchStrategy[list[Step]]:
    """A sequence of requests: each to one RPC, or a session of a few
    messages."""
    unary = st.sampled_from(paths).flatmap(
        lambda path: protofuzz.requests(METHODS[path].input_type, pools).map(
            lambda drawn: (path, [drawn[1]])
        )
    )
    choices = [unary]
    if session:
        message = protofuzz.requests(pb.SessionRequest.DESCRIPTOR, pools)
        choices.append(
            st.lists(message, min_size=1, max_size=4).map(
                lambda drawn: (fuzzing.SESSION, [data for _, data in drawn])
            )
        )
    return st.lists(st.one_of(choices), min_size=1, max_size=MAX_STEPS)


def failure_file() -> Path:
    named = os.environ.get("TORTURE_FUZZ_FAILURE")
    if named:
        return Path(named)
    return Path(tempfile.gettempdir()) / f"effectd-fuzz-failure-{os.getpid()}.json"


def run_step(target: fuzzing.Target, step: Step) -> list[str]:
    path, messages = step
    if path == fuzzing.SESSION:
        return target.session(messages)
    return target.send(path, METHODS[path], messages[0])


def corpus_entry(step: Step, problems: list[str]) -> dict[str, Any]:
    path, messages = step
    return {
        "method": path,
        "messages": [base64.b64encode(m).decode() for m in messages],
        "problems": problems,
    }


def mutants(rng: random.Random, step: Step, sequence: list[Step]) -> list[Step]:
    """`MUTANTS` variants of a step: one of its messages mutated, spliced with
    a message of another step to the same RPC, if any."""
    path, messages = step
    others = [m for p, ms in sequence for m in ms if p == path] or [b""]
    found = []
    for _ in range(MUTANTS):
        changed = list(messages)
        i = rng.randrange(len(changed))
        changed[i] = protofuzz.mutant(rng, changed[i], rng.choice(others))
        found.append((path, changed))
    return found


@dataclass(slots=True)
class Found:
    step: Step
    problems: list[str]


def fuzz(
    target: fuzzing.Target,
    *,
    seconds: float,
    executions: int = 0,
    paths: list[str] | None = None,
    session: bool = True,
    seed: int = SEED,
    progress: Callable[[], object] | None = None,
    keep: bool = True,
) -> Found | None:
    """Sends random sequences until `seconds` have passed and at least
    `executions` requests were sent (whichever comes last when both are
    given), or a problem is found: the request that found it."""
    pools = fuzzing.with_sandbox_pools(target.root)
    strategy = steps(paths or UNARY, pools, session)
    stop = time.monotonic() + seconds
    found: list[Found] = []

    def done() -> bool:
        sent = target.figures.executions
        if executions:
            return sent >= executions
        return time.monotonic() > stop

    for round_number in range(1_000_000):
        if done():
            break

        @hypothesis.seed(seed + round_number)
        @hypothesis.settings(
            max_examples=ROUND,
            deadline=None,
            database=None,
            # No shrinking: the failing request is written whole as it was
            # sent, and shrinking would replay the daemon for minutes.
            phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @hypothesis.given(strategy, st.integers(0, (1 << 32) - 1))
        def one(sequence: list[Step], mutation_seed: int) -> None:
            if found:
                # Hypothesis runs the failing example again: it fails alike
                # (the daemon's state moved on; it might not fail again).
                raise AssertionError(f"{found[-1].step[0]}: {found[-1].problems}")
            if done():
                return
            rng = random.Random(mutation_seed)  # noqa: S311 - not a secret
            for step in sequence:
                for sent in [step, *mutants(rng, step, sequence)]:
                    problems = run_step(target, sent)
                    if problems:
                        found.append(Found(sent, problems))
                        if keep:
                            failure_file().write_text(
                                json.dumps(corpus_entry(sent, problems), indent=1)
                                + "\n"
                            )
                        raise AssertionError(f"{sent[0]}: {problems}")

        try:
            one()
            if progress is not None:
                progress()
        except AssertionError:
            if not found:
                raise
            return found[-1]
    return None


def write_report(
    store: str, figures: fuzzing.Figures, elapsed: float, found: Found | None
) -> dict[str, Any]:
    """The run's figures on `store`, written beside `TORTURE_REPORT` (after
    each round, so that a run stopped early leaves them)."""
    report = {
        "store": store,
        "seed": SEED,
        "executions": figures.executions,
        "seconds": round(elapsed, 1),
        "per_second": round(figures.executions / max(elapsed, 1e-9)),
        "mutants_per_request": MUTANTS,
        "skipped_backups_outside_the_sandbox": figures.skipped,
        "failures": 0 if found is None else 1,
        "by_answer": dict(sorted(figures.by_answer.items())),
        "by_method": dict(sorted(figures.by_method.items())),
    }
    named = os.environ.get("TORTURE_REPORT")
    if named:
        path = Path(named)
        path.with_name(f"{path.stem}-fuzz-{store}{path.suffix}").write_text(
            json.dumps(report, indent=1) + "\n"
        )
    return report


@pytest.fixture(scope="module", params=postgres.BOTH)
def target(request: pytest.FixtureRequest) -> Iterator[fuzzing.Target]:
    """The fuzzed daemon of each store; on PostgreSQL, a schema of its own."""
    with contextlib.ExitStack() as stack:
        store = None
        if request.param == "postgres":
            database = request.getfixturevalue("pg_database")
            store = stack.enter_context(postgres.schema(database))
        yield stack.enter_context(fuzzing.fuzzed_daemon(store=store))


def test_every_service_and_rpc_is_fuzzed() -> None:
    """The descriptors give every RPC of every service (a control that the
    discovery works), and a request can be drawn for each."""
    services = {path.rsplit("/", 2)[1] for path in METHODS}
    assert services >= {
        "effectd.v1.ToolLedger",
        "effectd.v1.Recovery",
        "effectd.v1.RetryPolicy",
        "effectd.v1.Checkpoints",
        "effectd.v1.Provider",
        "effectd.v1.Admin",
        "grpc.health.v1.Health",
    }
    assert len(METHODS) >= 28
    assert fuzzing.SESSION in METHODS


@pytest.mark.timeout(6 * 3600)
def test_fuzzed_requests_are_answered_well_and_refusals_write_nothing(
    target: fuzzing.Target,
) -> None:
    """Random requests to every RPC and random session streams: no UNKNOWN,
    INTERNAL or hang, every refusal with its ErrorInfo, no write by a
    refusal (fast: `FAST_SECONDS`; deep: `TORTURE_FUZZ_EXECS` requests)."""
    store = target.store
    wanted = WANTED[store]
    print(f"{store}: seed {SEED} (TORTURE_FUZZ_SEED), wanted {wanted} executions")
    started = time.monotonic()
    # Every RPC at least once, whatever the draws: its empty request.
    swept = {p: run_step(target, (p, [b""])) for p in METHODS}
    assert {p: found for p, found in swept.items() if found} == {}

    def report(found: Found | None = None) -> dict[str, Any]:
        elapsed = time.monotonic() - started
        return write_report(store, target.figures, elapsed, found)

    found = fuzz(
        target,
        seconds=0.0 if wanted else FAST_SECONDS[store],
        executions=wanted,
        progress=report,
    )
    print(json.dumps(report(found), indent=1))
    assert found is None, (
        f"{found.step[0]}: {found.problems}; the input is in {failure_file()}"
    )
    assert set(target.figures.by_method) >= set(METHODS), "an RPC was never sent"
    assert_serving(target.channel)


def _corpus() -> list[Path]:
    return sorted(CORPUS.glob("*.json"))


@pytest.mark.parametrize("entry", _corpus(), ids=lambda p: p.stem)
def test_the_corpus_is_answered_well(target: fuzzing.Target, entry: Path) -> None:
    """Each kept input (a failure the fuzz found once, or a seed) is
    answered without a problem."""
    kept = json.loads(entry.read_text())
    messages = [base64.b64decode(m) for m in kept["messages"]]
    assert run_step(target, (kept["method"], messages)) == []
    assert_serving(target.channel)


def test_the_postgres_count_sees_every_committed_row_and_no_rolled_back_one(
    pg_url: str,
) -> None:
    """The count that says a refusal wrote nothing on PostgreSQL counts each
    row a committed transaction inserted, updated or deleted, in any of the
    store's tables, and nothing of a transaction rolled back."""
    kv = "INSERT INTO effectd_meta (k, v) VALUES ('fz', 'x')"
    with (
        pg_writes.counted(pg_url) as count,
        psycopg.connect(pg_url, autocommit=True) as conn,
    ):
        assert count() == 0
        with conn.transaction():
            conn.execute(kv)
            conn.execute("INSERT INTO effectd_usage (namespace, shard) VALUES ('n', 0)")
        assert count() == 2
        with contextlib.suppress(psycopg.errors.UniqueViolation), conn.transaction():
            conn.execute("UPDATE effectd_meta SET v = 'y' WHERE k = 'fz'")
            conn.execute(kv)  # fails: the update rolls back with it
        assert count() == 2
        conn.execute("UPDATE effectd_meta SET v = v WHERE k = 'fz'")
        conn.execute("DELETE FROM effectd_usage")
        assert count() == 4


# -- negative controls: a broken daemon the fuzz must catch --------------------
# Each runs its own daemon, started after the bug is planted (a servicer's
# methods are bound when the daemon starts), and stops after a number of
# requests, not a time: the seed is fixed, so the search is the same each run.
CONTROL_EXECUTIONS = 8_000


def found_in(path: str, seed: int, store: str | None = None) -> Found | None:
    with fuzzing.fuzzed_daemon(store=store) as fresh:
        return fuzz(
            fresh,
            seconds=0,
            executions=CONTROL_EXECUTIONS,
            paths=[path],
            session=False,
            seed=seed,
            keep=False,
        )


@pytest.mark.timeout(900)
def test_negative_control_an_internal_answer_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With DecideRetry's deadline converted unchecked, the fuzz finds the
    INTERNAL answer of a deadline out of range."""
    monkeypatch.setattr(convert, "timestamp_ns", lambda _v, _f, ts: ts.ToNanoseconds())
    found = found_in("/effectd.v1.RetryPolicy/DecideRetry", seed=1)
    assert found is not None
    assert any(p.startswith("INTERNAL") for p in found.problems), found


@pytest.mark.timeout(900)
@pytest.mark.parametrize("store_kind", postgres.BOTH)
def test_negative_control_a_refusal_that_writes_is_found(
    monkeypatch: pytest.MonkeyPatch, store_url: str | None
) -> None:
    """On each store: with Checkpoints.Delete writing a checkpoint before it
    validates its request, the fuzz finds a refusal that wrote."""
    honest = rpc_checkpoints.Checkpoints.Delete

    async def writes_first(self: Any, request: Any, context: Any) -> Any:
        await self._checkpoints.txn("fz", [], [Op("planted", b"x")])
        return await honest(self, request, context)

    monkeypatch.setattr(rpc_checkpoints.Checkpoints, "Delete", writes_first)
    found = found_in("/effectd.v1.Checkpoints/Delete", seed=2, store=store_url)
    assert found is not None
    assert any("but wrote" in p for p in found.problems), found


@pytest.mark.timeout(900)
def test_negative_control_a_refusal_without_error_info_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With Checkpoints.Get aborting a key of a control character by hand (a
    status without details), the fuzz finds the refusal without ErrorInfo."""
    honest = rpc_checkpoints.Checkpoints.Get

    async def bare(self: Any, request: Any, context: Any) -> Any:
        if any(ord(c) < 32 for c in request.key):
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such key")
        return await honest(self, request, context)

    monkeypatch.setattr(rpc_checkpoints.Checkpoints, "Get", bare)
    found = found_in("/effectd.v1.Checkpoints/Get", seed=3)
    assert found is not None
    assert any("without effectd ErrorInfo" in p for p in found.problems), found
