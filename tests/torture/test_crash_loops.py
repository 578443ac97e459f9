"""Crash loops with an external side-effect counter (issue 15): agents in
their own processes run tool calls through the safe tool call while the
daemon, or one agent, is killed with SIGKILL at random moments and started
again, and on PostgreSQL the daemon's connections are ended and the database
server itself restarted (immediate and fast stops of a private cluster,
`tests.support.pg_cluster`); after every cycle the store is compared with
what the agents executed and what the daemon acknowledged
(`tests.torture.crash_checks`), and on LMDB the files a daemon kill left are
verified (`crash_loop.lmdb_consistency`).

`TORTURE_CRASH_CYCLES` sets the cycles on LMDB (150 here, thousands in `make
torture-deep`), `TORTURE_CRASH_PG_CYCLES` on PostgreSQL (50 here),
`TORTURE_CRASH_SEED` the seed (printed), and `TORTURE_REPORT` a file to which
the figures are written (NAME-crash-lmdb.json, NAME-crash-postgres.json).
One PostgreSQL cycle in eight restarts the database; beyond the fast
setting's cycles, one restart in eight of those leaves it away for
`LONG_OUTAGE` seconds.

The negative controls: a daemon that answers before its commit (killed, on
LMDB; its database restarted, on PostgreSQL), and an agent that executes a
side effect the ledger handed to reconciliation; the same checks must catch
each.
"""

from __future__ import annotations

import functools
import json
import os
import random
from pathlib import Path

import pytest

from sidecar.storage.postgres import schema as pg_schema
from tests.support.pg_cluster import private_cluster
from tests.torture.crash_loop import RESTART_SHARE, LoopSpec, Outcome, run_loop

# The fast setting of `make test`: 200 cycles in all, about a minute on a
# quiet machine.
FAST_CYCLES = {"lmdb": 150, "postgres": 50}
VARIABLES = {"lmdb": "TORTURE_CRASH_CYCLES", "postgres": "TORTURE_CRASH_PG_CYCLES"}
# The loop's bound in time: a few seconds a cycle at the most, on a loaded
# machine.
SECONDS_PER_CYCLE = 3
# A long outage of the database, seconds: long enough for the daemon's
# connection pools to back off (`crash_database`).
LONG_OUTAGE = (5.0, 20.0)


def _cycles(store: str) -> int:
    return int(os.environ.get(VARIABLES[store]) or FAST_CYCLES[store])


TIMEOUT = 300 + SECONDS_PER_CYCLE * max(_cycles(s) for s in FAST_CYCLES)
# A control must be caught within this many cycles (each has caught in a
# few: its bug is met by most kills).
CONTROL_CYCLES = 60


def _seed() -> int:
    chosen = os.environ.get("TORTURE_CRASH_SEED")
    return int(chosen) if chosen else random.randrange(2**32)  # noqa: S311 - a test seed


def _report(store: str, outcome: Outcome, seed: int) -> None:
    figures = {"seed": seed, **outcome.figures.as_dict()}
    print(json.dumps(figures, indent=1))
    report = os.environ.get("TORTURE_REPORT")
    if report:
        path = Path(report)
        path.with_name(f"{path.stem}-crash-{store}{path.suffix}").write_text(
            json.dumps(figures, indent=1) + "\n"
        )


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("store", ["lmdb", "postgres"])
def test_every_promise_holds_through_kill_loops(store: str, short_tmp: Path) -> None:
    """No side effect twice, no acknowledged commit lost or changed, no
    revision back, no unsafe plan, LMDB's files sound: after every cycle."""
    seed = _seed()
    cycles = _cycles(store)
    print(f"crash loop on {store}: seed={seed} cycles={cycles}", flush=True)
    if store == "postgres":
        with private_cluster() as cluster:
            pg_schema.migrate_url(cluster.url)
            spec = LoopSpec(
                short_tmp,
                seed,
                cycles,
                store_url=cluster.url,
                drop_connections=functools.partial(cluster.terminate, "effectd"),
                restart_database=cluster.restart,
                long_outage=LONG_OUTAGE if cycles > FAST_CYCLES[store] else None,
            )
            outcome = run_loop(spec)
    else:
        outcome = run_loop(LoopSpec(short_tmp, seed, cycles))
    _report(store, outcome, seed)
    assert outcome.violations == []
    figures = outcome.figures
    assert figures.cycles == cycles
    # The loop met what it checks: kills of both kinds, executions,
    # acknowledged commits compared.
    assert figures.daemon_kills > 0
    assert figures.agent_kills > 0
    if store == "postgres":
        assert figures.database_restarts == round(cycles * RESTART_SHARE)
    assert figures.effects > 0
    assert figures.acknowledged > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("broken", "caught_by"),
    [
        # A lost acknowledged commit shows either as the commit gone, or,
        # when the lost write was the start, as its attempt run again.
        ("ack_before_commit", ("acknowledged", "executed twice")),
        ("reexecute_unknown", ("side effect executed 2 times",)),
    ],
)
def test_negative_control_is_caught(
    broken: str, caught_by: tuple[str, ...], short_tmp: Path
) -> None:
    """A daemon that answers before its commit loses an acknowledged write
    (a commit, or the start an agent executed on); an agent that ignores
    reconciliation runs a side effect twice: the loop's checks say so within
    a few cycles."""
    seed = _seed()
    print(f"crash loop control {broken}: seed={seed}", flush=True)
    spec = LoopSpec(
        short_tmp,
        seed,
        CONTROL_CYCLES,
        ack_before_commit=broken == "ack_before_commit",
        reexecute_unknown=broken == "reexecute_unknown",
        stop_on_violation=True,
    )
    outcome = run_loop(spec)
    print(f"caught at cycle {outcome.caught_at}: {outcome.violations[:3]}")
    assert any(marker in v for v in outcome.violations for marker in caught_by), (
        outcome.violations
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_database_restarts_catch_an_answer_before_commit(short_tmp: Path) -> None:
    """A PostgreSQL daemon that answers before its COMMIT returns
    (`tests.support.pg_ack_before_commit`), its database restarted at every
    cycle and never killed itself: the loop's checks find a write
    acknowledged that the database does not hold (a commit gone, or the lost
    start's attempt run again), within a few cycles."""
    seed = _seed()
    print(f"crash loop control pg_ack_before_commit: seed={seed}", flush=True)
    with private_cluster() as cluster:
        pg_schema.migrate_url(cluster.url)
        spec = LoopSpec(
            short_tmp,
            seed,
            CONTROL_CYCLES,
            store_url=cluster.url,
            restart_database=cluster.restart,
            restart_share=1.0,
            ack_before_commit=True,
            stop_on_violation=True,
        )
        outcome = run_loop(spec)
    print(f"caught at cycle {outcome.caught_at}: {outcome.violations[:3]}")
    assert outcome.figures.daemon_kills == 0
    caught_by = ("acknowledged", "executed twice")
    assert any(marker in v for v in outcome.violations for marker in caught_by), (
        outcome.violations
    )
