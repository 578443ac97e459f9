"""Many client processes racing on one tool call: each round they wait for
one another, then send the same request at once; `violations` says in which
rounds not exactly one of them held the attempt.

The processes are forked from a server that has imported this module and
gRPC once (`forkserver`), so 32 of them start in a moment on a loaded
machine; this module imports no daemon code, which they do not need.
"""

from __future__ import annotations

import multiprocessing.synchronize
import queue
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.queues import Queue
from typing import Any

import grpc
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc


@dataclass(frozen=True, slots=True)
class Outcome:
    worker: int
    round: int
    decision: pb.Decision.ValueType
    holds_attempt: bool


def worker(  # noqa: PLR0917 - multiprocessing passes arguments by position
    index: int,
    target: str,
    mode: str,
    rounds: int,
    barrier: multiprocessing.synchronize.Barrier,
    out: Queue[Any],
) -> None:
    """One client process: each round, wait for all others, then send the
    same prepare-and-start (mode "prepare") or start (mode "start")."""
    with grpc.insecure_channel(target) as channel:
        stub = ledger_pb2_grpc.ToolLedgerStub(channel)
        grpc.channel_ready_future(channel).result(timeout=30)
        for r in range(rounds):
            ref = pb.CallRef(run_id="race", call_id=f"call-{r}")
            barrier.wait(timeout=60)
            if mode == "prepare":
                request = pb.PrepareToolRequest(
                    ref=ref,
                    tool_name="charge_card",
                    input=pb.Payload(json='{"amount": 100}'),
                    start=True,
                )
                answer = stub.PrepareTool(request, timeout=30)
                out.put(Outcome(index, r, answer.decision, answer.attempt_held))
            else:
                started = stub.StartTool(pb.StartToolRequest(ref=ref), timeout=30)
                held = started.decision == pb.DECISION_EXECUTE
                out.put(Outcome(index, r, started.decision, held))


def run(targets: Sequence[str], mode: str, rounds: int, workers: int) -> list[Outcome]:
    """What `workers` client processes (`worker`), spread over `targets` in
    turn, were answered in `rounds` rounds; every process must exit cleanly."""
    ctx = multiprocessing.get_context("forkserver")
    # Ignored when the server already runs: its workers import what they need.
    ctx.set_forkserver_preload([__name__])
    barrier = ctx.Barrier(workers)
    out: Queue[Any] = ctx.Queue()
    procs = [
        ctx.Process(
            target=worker,
            args=(i, targets[i % len(targets)], mode, rounds, barrier, out),
        )
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    outcomes: list[Outcome] = []
    try:
        while len(outcomes) < workers * rounds:
            outcomes.append(out.get(timeout=120))
    except queue.Empty:
        pass
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return outcomes


def violations(outcomes: Sequence[Outcome], rounds: int, workers: int) -> list[str]:
    """Rounds in which not exactly one caller holds the attempt while all
    the others are told IN_PROGRESS."""
    by_round: dict[int, list[Outcome]] = {r: [] for r in range(rounds)}
    for o in outcomes:
        by_round[o.round].append(o)
    found = []
    for r, got in by_round.items():
        holders = [o for o in got if o.holds_attempt]
        others = {o.decision for o in got if not o.holds_attempt}
        if (
            len(got) != workers
            or len(holders) != 1
            or others - {pb.DECISION_IN_PROGRESS}
        ):
            found.append(
                f"round {r}: {len(got)} answers, {len(holders)} hold the attempt, "
                f"others {sorted(pb.Decision.Name(d) for d in others)}"
            )
    return found


def counts(outcomes: Sequence[Outcome]) -> Mapping[str, int]:
    tally: dict[str, int] = {}
    for o in outcomes:
        name = pb.Decision.Name(o.decision)
        tally[name] = tally.get(name, 0) + 1
    return tally
