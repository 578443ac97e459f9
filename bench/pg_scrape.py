"""What a metrics scrape costs a daemon of the shared store, by ledger size.

`effectd_ledger_calls{state}` is read at every scrape of every daemon. On
PostgreSQL the server counts the records of each state in one statement
(`api.CountsStates`); the alternative, what a store without it does, walks
the keys of every state a batch at a time, the committed ones included.
Both on one database of its own (created on EFFECTD_BENCH_POSTGRES, default
postgresql://127.0.0.1:5432/test, dropped after), filled with CALLS
committed records (copies of one saved by the store, made by the server)
and a few open ones; ROUNDS interleaved rounds, the daemon's CPU and the wall
time of each, and their ratio.

    python bench/pg_scrape.py [--calls 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from databases import scratch, url_of

from sidecar.ledger import rules
from sidecar.ledger.fingerprint import fingerprint
from sidecar.ledger.model import (
    CallRef,
    Effect,
    Outcome,
    Payload,
    PayloadKind,
    Result,
    State,
)
from sidecar.ledger.policy import Policy
from sidecar.ledger.rules import Now, PrepareSpec
from sidecar.observability.collectors import count_states
from sidecar.storage.api import ReadView, WriteView
from sidecar.storage.postgres import schema
from sidecar.storage.postgres.store import PostgresOptions, PostgresStore

SERVER = os.environ.get("EFFECTD_BENCH_POSTGRES", "postgresql://127.0.0.1:5432/test")
OPEN = 50
INPUT = Payload(PayloadKind.JSON, b'{"to": "a@example.com"}')
T = TypeVar("T")
# Copies of the one committed record, each under a key and call id of its own.
_COPIES = """
INSERT INTO effectd_calls (k, namespace, run_id, call_id, state, revision,
    attempt, lease_expires_ns, created_ns, updated_ns, acknowledged,
    retained_ns, doc, plan, tomb, compacted_ns)
SELECT k || convert_to(lpad(i::text, 9, '0'), 'UTF8'), namespace, run_id,
    call_id || lpad(i::text, 9, '0'), state, revision, attempt,
    lease_expires_ns, created_ns, updated_ns, acknowledged, retained_ns, doc,
    plan, tomb, compacted_ns
FROM effectd_calls, generate_series(1, %s) AS i WHERE k = %s
"""


class Walked:
    """The store as one without its own count: every state walked."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    def read(self, fn: Callable[[ReadView], T]) -> T:
        return self._store.read(fn)


def _filled(store: PostgresStore, url: str, calls: int) -> dict[State, int]:
    made = []
    for i in range(OPEN + 1):
        asked = PrepareSpec(
            ref=CallRef("default", "run-1", f"c{i}"),
            tool_name="send_email",
            effect=Effect.SIDE_EFFECT,
            input=INPUT,
            fingerprint=fingerprint(INPUT),
            require_approval=False,
            start=False,
            lease_ms=0,
        )
        call = rules.prepare(None, asked, Now(1, 1, 1), Policy()).call
        if i == 0:
            result = Result(Outcome.OK, None, "", "", "{}")
            call = dataclasses.replace(call, state=State.COMMITTED, result=result)
        made.append(call)

    def save(view: WriteView) -> bytes:
        for call in made:
            view.write_call(None, call)
        found = view.calls_in_state(State.COMMITTED)
        return next(iter(found))

    template = store.submit(save).result(60)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_COPIES, (calls - 1, template))
        conn.execute("VACUUM ANALYZE effectd_calls")
    wanted = dict.fromkeys(State, 0)
    wanted[State.PREPARED] = OPEN
    wanted[State.COMMITTED] = calls
    return wanted


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return (time.process_time() - cpu) * 1000, (time.perf_counter() - wall) * 1000


def measure(url: str, calls: int, rounds: int) -> dict[str, tuple[float, float]]:
    """On the migrated, empty store at `url`: the median daemon CPU and wall
    ms of one scrape's counts, by way ("count", "walk"), each checked
    against what was stored first."""
    store = PostgresStore(url, PostgresOptions())
    try:
        wanted = _filled(store, url, calls)
        ways: dict[str, Callable[[], object]] = {
            "count": lambda: count_states(store),
            "walk": lambda: count_states(Walked(store)),  # type: ignore[arg-type]
        }
        for counted in ways.values():
            assert counted() == wanted
        took: dict[str, list[tuple[float, float]]] = {w: [] for w in ways}
        for _ in range(rounds):
            for named, fn in ways.items():
                took[named].append(_timed(fn))
    finally:
        store.close()
    return {
        way: (
            statistics.median(c for c, _ in runs),
            statistics.median(w for _, w in runs),
        )
        for way, runs in took.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with scratch(SERVER, "effectd_scrape") as name:
        url = url_of(SERVER, name)
        schema.migrate_url(url)
        medians = measure(url, args.calls, args.rounds)
    print(f"one scrape's counts by state, {args.calls:,} committed records:")
    for way, (cpu, wall) in medians.items():
        print(f"  {way:5}  daemon CPU {cpu:9.1f} ms   wall {wall:9.1f} ms")
    (cpu_c, wall_c), (cpu_w, wall_w) = medians["count"], medians["walk"]
    print(
        f"  walk / count: daemon CPU x{cpu_w / max(cpu_c, 0.01):.0f}, "
        f"wall x{wall_w / max(wall_c, 0.01):.1f} (medians of {args.rounds} rounds)"
    )


if __name__ == "__main__":
    main()
