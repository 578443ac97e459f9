"""The real daemon answers every operation exactly as the reference model of
the contract does, through restarts, lease expiries and retention windows
(issue 15, the model-based torture test).

`TORTURE_EXAMPLES` sets the number of random operation sequences (50 here,
thousands in `make torture-deep`), `TORTURE_STEPS` their length, and
`TORTURE_REPORT` a file to which the answers reached are written (one per
store: NAME-lmdb.json, NAME-postgres.json). On PostgreSQL,
`TORTURE_PG_EXAMPLES` (10 here).
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path

import hypothesis
import pytest
from hypothesis.stateful import run_state_machine_as_test

from tests.support import postgres
from tests.torture.harness import PostgresBackend
from tests.torture.machine import TortureMachine, settings

# The fast setting of `make test`: about a minute on a quiet machine.
FAST_EXAMPLES = 50
# Each daemon start on the shared store migrates a schema: fewer examples
# (`TORTURE_PG_EXAMPLES` for a deep run).
PG_FAST_EXAMPLES = 10


@pytest.mark.timeout(3600 * 6)
@pytest.mark.parametrize("store", ["lmdb", "postgres"])
def test_the_daemon_matches_the_model(store: str) -> None:
    """On each store: the shared one gets fewer examples in the fast setting
    (each daemon start migrates a schema)."""
    TortureMachine.tally.clear()
    machine: type[TortureMachine] = TortureMachine
    with ExitStack() as stack:
        if store == "postgres":
            url = stack.enter_context(postgres.database())
            backend = PostgresBackend(url)
            stack.callback(backend.close)

            class OnPostgres(TortureMachine):
                pass

            OnPostgres.backend = backend
            machine = OnPostgres
        if store == "lmdb":
            run(machine, settings(FAST_EXAMPLES), store)
        else:
            run(
                machine,
                settings(PG_FAST_EXAMPLES, variable="TORTURE_PG_EXAMPLES"),
                store,
            )


def run(machine: type[TortureMachine], chosen: hypothesis.settings, store: str) -> None:
    """Runs the state machine; prints (and writes) the answers it reached."""
    try:
        run_state_machine_as_test(machine, settings=chosen)
    finally:
        tally = dict(sorted(TortureMachine.tally.items()))
        print(json.dumps(tally, indent=1))
        report = os.environ.get("TORTURE_REPORT")
        if report:
            path = Path(report)
            path.with_name(f"{path.stem}-{store}{path.suffix}").write_text(
                json.dumps(tally, indent=1) + "\n"
            )
