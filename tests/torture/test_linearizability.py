"""Linearizability under faults (issue 15): concurrent clients on shared
call ids and checkpoint keys of a daemon process that is paused past their
deadline and killed, every history checked against the reference model per
call id and per key (`lin_specs`), with the checkpoint revision counter
checked across keys; and the negative controls: daemons that read, then
write without the write lock, must be caught.

On each store, `TORTURE_LIN_HISTORIES` histories (1 here) of
`TORTURE_LIN_SECONDS` seconds each (15 here, 10 on PostgreSQL), with
`TORTURE_LIN_CLIENTS` clients on the ledger and as many on checkpoints (3
here); `make torture-deep` runs more and longer ones and writes the figures
to `TORTURE_REPORT` (NAME-linearizability-STORE.json). The seed is printed;
`TORTURE_LIN_SEED` replays one. A partition whose search passes its bounds is
counted UNDECIDED (reported, not a failure); an ILLEGAL one fails the test.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.support import postgres
from tests.torture.histories import record_history
from tests.torture.lin_specs import CheckpointSpec, LedgerSpec, revision_order
from tests.torture.lin_world import History, Knobs
from tests.torture.linearizability import (
    Bounds,
    Result,
    Spec,
    Verdict,
    check,
    describe,
    partitions,
)

FAST_HISTORIES = 1
FAST_SECONDS = {"lmdb": 15.0, "postgres": 10.0}
# Client threads on the ledger, and as many on checkpoints.
FAST_CLIENTS = 3
# Each key takes at most `Knobs.ops_per_key` operations from the clients,
# plus those already in flight and the restarts around it.
BOUNDS = Bounds(max_ops=120, max_nodes=300_000, max_seconds=30.0)


def _seed() -> int:
    seed = int(os.environ.get("TORTURE_LIN_SEED") or random.randrange(2**32))  # noqa: S311 - a test seed
    print(f"linearizability seed: {seed} (TORTURE_LIN_SEED={seed} replays it)")
    return seed


def _check(history: Any) -> tuple[list[Verdict], list[str]]:
    verdicts = check(LedgerSpec(), history.ledger, BOUNDS)
    verdicts += check(CheckpointSpec(), history.checkpoints, BOUNDS)
    return verdicts, revision_order(history.checkpoints)


def _dump(tmp_path: Path, history: Any, verdict: Verdict) -> Path:
    """The rejected partition's history, one operation a line, in call order."""
    spec: Spec[Any] = CheckpointSpec()
    ops = history.checkpoints
    if isinstance(verdict.key, tuple):
        spec, ops = LedgerSpec(), history.ledger
    mine = sorted(partitions(spec, ops)[verdict.key], key=lambda op: op.call)
    path = tmp_path / "rejected-history.txt"
    path.write_text("".join(describe(op) + "\n" for op in mine))
    return path


def _tally(figures: Counter[str], history: History, verdicts: list[Verdict]) -> None:
    figures["histories"] += 1
    figures.update(history.tally)
    figures["operations"] += len(history.ledger) + len(history.checkpoints)
    figures["partitions"] += len(verdicts)
    figures.update(f"partitions_{v.result.value}" for v in verdicts)
    figures["largest_partition"] = max(
        [figures["largest_partition"], *(v.operations for v in verdicts)]
    )
    figures["states_explored"] += sum(v.explored for v in verdicts)
    # The record states the answers showed: what the load reached.
    figures.update(
        f"seen_{op.output[1][0]}"
        for op in history.ledger
        if op.ret is not None and op.output and op.output[1]
    )


@pytest.mark.slow
@pytest.mark.timeout(3600 * 6)
@pytest.mark.parametrize("store", postgres.BOTH)
def test_histories_under_pauses_and_kills_are_linearizable(
    tmp_path: Path, store: str, request: pytest.FixtureRequest
) -> None:
    """On each store; each history on a new one (a PostgreSQL schema)."""
    seed = _seed()
    histories = int(os.environ.get("TORTURE_LIN_HISTORIES", FAST_HISTORIES))
    seconds = float(os.environ.get("TORTURE_LIN_SECONDS", FAST_SECONDS[store]))
    clients = int(os.environ.get("TORTURE_LIN_CLIENTS", FAST_CLIENTS))
    figures: Counter[str] = Counter()
    for number in range(histories):
        with ExitStack() as stack:
            args: tuple[str, ...] = ()
            if store == "postgres":
                database = request.getfixturevalue("pg_database")
                args = ("--store", stack.enter_context(postgres.schema(database)))
            knobs = Knobs(
                seed + number,
                seconds,
                ledger_clients=clients,
                checkpoint_clients=clients,
            )
            history = record_history(knobs, tmp_path / f"h{number}", args=args)
        started = time.monotonic()
        verdicts, misordered = _check(history)
        figures["check_ms"] += int((time.monotonic() - started) * 1000)
        _tally(figures, history, verdicts)
        assert not history.unexpected, history.unexpected[:5]
        illegal = [v for v in verdicts if v.result is Result.ILLEGAL]
        if illegal:
            where = _dump(tmp_path, history, illegal[0])
            pytest.fail(f"seed {seed + number}: {illegal[0]}; the history: {where}")
        assert not misordered, f"seed {seed + number}: {misordered[:3]}"
    print(json.dumps(dict(sorted(figures.items())), indent=1))
    report = os.environ.get("TORTURE_REPORT")
    if report:
        path = Path(report)
        path.with_name(f"{path.stem}-linearizability-{store}{path.suffix}").write_text(
            json.dumps(dict(sorted(figures.items())), indent=1) + "\n"
        )
    # The faults happened and the histories hold answers and unknowns alike.
    assert figures["restarts"] >= histories
    assert figures["pauses"] >= histories
    assert figures["unknown"] > 0
    assert figures["partitions_linearizable"] > 0


CONTROLS = {
    # Writers racing on one checkpoint key.
    "tests.torture.racy_checkpoints": {"ledger_clients": 0, "checkpoint_clients": 4},
    # Agents racing to prepare and start one call.
    "tests.torture.racy_ledger": {"ledger_clients": 4, "checkpoint_clients": 0},
}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("module", list(CONTROLS))
def test_a_read_then_write_without_the_lock_is_caught(
    tmp_path: Path, module: str
) -> None:
    """Clients racing on one key of a daemon that reads, then writes without
    the write lock: some history of at most five rounds of a few seconds is
    rejected."""
    seed = _seed()
    knobs = Knobs(
        seed,
        seconds=4.0,
        live_keys=1,
        ops_per_key=25,
        pauses=False,
        kills=False,
        **CONTROLS[module],
    )
    for number in range(5):
        history = record_history(knobs, tmp_path / f"h{number}", module=module)
        verdicts, _ = _check(history)
        illegal = [v for v in verdicts if v.result is Result.ILLEGAL]
        if illegal:
            print(f"caught in round {number}: {illegal[0].explanation[:400]}")
            return
    pytest.fail(f"the histories of {module} were all accepted")
