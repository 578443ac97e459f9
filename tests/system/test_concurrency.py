"""At-most-one attempt: concurrent duplicates from separate client processes.

32 processes send the same prepare-and-start (or start) at once, round after
round: exactly one caller per round holds the attempt, every other caller
is told IN_PROGRESS. The racy ledger (read, then write blindly) is the
negative control: the same check must catch it.
"""

from __future__ import annotations

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc

from sidecar.config import ServeConfig
from sidecar.testing import running_daemon
from tests.support import race, racers

# 32 processes fill both cores: alone, after the other tests.
pytestmark = pytest.mark.serial

WORKERS = 32


def _race(target: str, mode: str, rounds: int) -> list[racers.Outcome]:
    return racers.run([target], mode, rounds, WORKERS)


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
                timeout=10,
            )


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("mode", "rounds"), [("prepare", 100), ("start", 100)])
def test_exactly_one_caller_holds_the_attempt(
    config: ServeConfig, mode: str, rounds: int
) -> None:
    """Per round, exactly one of 32 concurrent callers gets EXECUTE (ADR-010 D3)."""
    with running_daemon(config) as daemon:
        if mode == "start":
            _prepare_all(daemon.target, rounds)
        outcomes = _race(daemon.target, mode, rounds)
    assert racers.violations(outcomes, rounds, WORKERS) == []
    assert racers.counts(outcomes) == {
        "DECISION_EXECUTE": rounds,
        "DECISION_IN_PROGRESS": rounds * (WORKERS - 1),
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["prepare", "start"])
def test_negative_control_racy_ledger_is_caught(config: ServeConfig, mode: str) -> None:
    """The same check fails for a ledger that reads before it writes blindly."""
    rounds = 10
    with running_daemon(config, daemon=race.RacyDaemon(config)) as daemon:
        if mode == "start":
            _prepare_all(daemon.target, rounds)
        outcomes = _race(daemon.target, mode, rounds)
    assert racers.violations(outcomes, rounds, WORKERS), racers.counts(outcomes)
