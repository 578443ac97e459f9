"""At-most-one attempt across daemons (issue 14): three `effectd serve`
processes on one PostgreSQL store, each on its own Unix socket, and 32
client processes spread over them send the same prepare-and-start at once,
round after round. Exactly one caller per round holds the attempt, every
other one is told IN_PROGRESS, and each call ends with one attempt.

Run twice: the daemons reaching PostgreSQL directly, and through PgBouncer
in transaction mode (`pg_path`), which hands each transaction any server
connection of its pool.

The negative control is the same three daemons on a store whose READ COMMITTED
writes lock nothing (`tests.support.loose_store`): the same check catches
more than one EXECUTE in some round. `EFFECTD_RACE_ROUNDS` sets the rounds
(100 by default, as the issue asks), `EFFECTD_RACE_MODES` the requests that
race ("prepare", the default; "prepare,start" adds StartTool of a call
prepared before). The test fails, never skips, when PostgreSQL is not
reachable (the `pg_url` fixture).
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc

from tests.support import racers
from tests.support.processes import daemon_processes

# 32 processes and three daemons fill both cores: alone, after the other tests.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

WORKERS = 32
DAEMONS = 3
ROUNDS = int(os.environ.get("EFFECTD_RACE_ROUNDS", "100"))
CONTROL_ROUNDS = 10
# "prepare": prepare-and-start in one request; "start": StartTool of a call
# prepared before the race.
MODES = os.environ.get("EFFECTD_RACE_MODES", "prepare").split(",")


def _race(
    short_tmp: Path, url: str, module: str, mode: str, rounds: int
) -> tuple[list[racers.Outcome], list[str]]:
    """The answers of every round, and the calls not STARTED once after."""
    print(
        f"{WORKERS} client processes over {DAEMONS} daemons ({module}), "
        f"{rounds} rounds of {mode}"
    )
    dirs = [short_tmp / f"d{i}" for i in range(DAEMONS)]
    with daemon_processes(dirs, module, ("--store", url)) as daemons:
        if mode == "start":
            _prepare_all(daemons[0].target, rounds)
        outcomes = racers.run([d.target for d in daemons], mode, rounds, WORKERS)
        return outcomes, _not_started_once(daemons[-1].target, rounds)


def _prepare_all(target: str, rounds: int) -> None:
    with grpc.insecure_channel(target) as channel:
        stub = ledger_pb2_grpc.ToolLedgerStub(channel)
        for r in range(rounds):
            stub.PrepareTool(
                pb.PrepareToolRequest(
                    ref=pb.CallRef(run_id="race", call_id=f"call-{r}"),
                    tool_name="charge_card",
                    input=pb.Payload(json='{"amount": 100}'),
                ),
                timeout=30,
            )


def _not_started_once(target: str, rounds: int) -> list[str]:
    """Calls not started exactly once: one attempt, STARTED, or UNKNOWN once
    its lease ran out (a long run outlasts the default lease)."""
    found = []
    with grpc.insecure_channel(target) as channel:
        stub = ledger_pb2_grpc.ToolLedgerStub(channel)
        for r in range(rounds):
            ref = pb.CallRef(run_id="race", call_id=f"call-{r}")
            call = stub.GetToolCall(pb.GetToolCallRequest(ref=ref), timeout=30).call
            started = call.state in (pb.CALL_STATE_STARTED, pb.CALL_STATE_UNKNOWN)
            if not started or call.attempt != 1:
                found.append(f"call-{r}: {call.state} attempt {call.attempt}")
    return found


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", MODES)
def test_three_daemons_grant_one_attempt_per_round(
    short_tmp: Path, pg_url_via: str, mode: str
) -> None:
    """Per round, exactly one of 32 callers on 3 daemons gets EXECUTE (ADR-010 D3)."""
    outcomes, not_started_once = _race(short_tmp, pg_url_via, "sidecar", mode, ROUNDS)
    assert racers.violations(outcomes, ROUNDS, WORKERS) == []
    assert racers.counts(outcomes) == {
        "DECISION_EXECUTE": ROUNDS,
        "DECISION_IN_PROGRESS": ROUNDS * (WORKERS - 1),
    }
    assert not_started_once == []


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", MODES)
def test_negative_control_a_store_without_isolation_is_caught(
    short_tmp: Path, pg_url: str, mode: str
) -> None:
    """The same check fails for daemons whose writes lock nothing."""
    loose = "tests.support.loose_store"
    outcomes, _ = _race(short_tmp, pg_url, loose, mode, CONTROL_ROUNDS)
    found = racers.violations(outcomes, CONTROL_ROUNDS, WORKERS)
    print("\n".join(found))
    assert found, racers.counts(outcomes)
