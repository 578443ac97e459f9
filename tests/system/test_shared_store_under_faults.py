"""A daemon on the shared store serving a load while its database
connections are terminated again and again (`pg_terminate_backend`, what a
database restart does to it): no acknowledged commit is lost, no call is
answered EXECUTE twice, and every error a client sees is UNAVAILABLE /
STORAGE_UNAVAILABLE saying whether the request may have been applied.
Run twice: the daemon reaching PostgreSQL directly, and through PgBouncer
in transaction mode (`pg_path`), whose server connections are the ones
terminated."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import replace

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1.ledger_pb2_grpc import ToolLedgerStub

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.testing import running_daemon
from tests.rpc.support import decode, prepare_request
from tests.support import postgres

pytestmark = pytest.mark.slow

WORKERS = 6
CALLS = 20
KILLS = 40
RESULT = b"receipt"


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.executes: Counter[str] = Counter()
        self.acknowledged: list[str] = []
        self.errors: Counter[str] = Counter()
        self.unclassified: list[str] = []

    def error(self, exc: grpc.RpcError) -> None:
        got = decode(exc)
        applied = got.metadata.get("mayHaveBeenApplied")
        with self.lock:
            if (
                got.code is grpc.StatusCode.UNAVAILABLE
                and got.reason == "STORAGE_UNAVAILABLE"
                and applied in ("true", "false")
            ):
                self.errors[applied] += 1
            else:
                self.unclassified.append(f"{got.code} {got.reason} {got.message}")


def _until_answered(tally: Tally, rpc: object, request: object) -> object:
    for _ in range(50):
        try:
            return rpc(request, timeout=30)  # type: ignore[operator]
        except grpc.RpcError as exc:
            tally.error(exc)
    raise AssertionError("no answer after 50 tries")


def _work(stub: ToolLedgerStub, worker: int, tally: Tally) -> None:
    for i in range(CALLS):
        call_id = f"w{worker}-c{i}"
        request = prepare_request(call_id=call_id, start=True)
        answer = _until_answered(tally, stub.PrepareTool, request)
        assert isinstance(answer, pb.PrepareToolResponse)
        if answer.decision != pb.DECISION_EXECUTE:
            continue  # an earlier try committed its start: its outcome is ours
        with tally.lock:
            tally.executes[call_id] += 1
        commit = pb.CommitToolRequest(
            ref=request.ref,
            attempt=answer.call.attempt,
            result=pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(raw=RESULT)),
        )
        _until_answered(tally, stub.CommitTool, commit)
        with tally.lock:
            tally.acknowledged.append(call_id)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_terminated_connections_lose_no_commit_and_execute_nothing_twice(
    config: ServeConfig, pg_url_via: str, pg_database: str, clock: ManualClock
) -> None:
    seed = random.randrange(1 << 32)  # noqa: S311 - a test seed
    print(f"seed {seed}")
    rng = random.Random(seed)  # noqa: S311 - when to kill
    tally = Tally()
    kills = 0
    stop = threading.Event()

    def killer() -> None:
        nonlocal kills
        deadline = time.monotonic() + 60
        while kills < KILLS and not stop.is_set() and time.monotonic() < deadline:
            time.sleep(rng.uniform(0.005, 0.05))
            kills += postgres.terminate("effectd", pg_database)

    with (
        running_daemon(replace(config, store=pg_url_via), clock) as daemon,
        grpc.insecure_channel(daemon.target) as channel,
    ):
        stub = ToolLedgerStub(channel)
        workers = [
            threading.Thread(target=_work, args=(stub, w, tally))
            for w in range(WORKERS)
        ]
        chaos = threading.Thread(target=killer)
        chaos.start()
        for t in workers:
            t.start()
        for t in workers:
            t.join(240)
        stop.set()
        chaos.join(60)
        lost = []
        for call_id in tally.acknowledged:
            got = stub.GetToolCall(
                pb.GetToolCallRequest(ref=prepare_request(call_id=call_id).ref),
                timeout=30,
            )
            if (
                got.call.state != pb.CALL_STATE_COMMITTED
                or got.call.result.payload.raw != RESULT
            ):
                lost.append(call_id)
    print(f"kills {kills}, errors {dict(tally.errors)}, acks {len(tally.acknowledged)}")
    assert kills > 0
    assert tally.unclassified == []
    assert lost == []
    assert [c for c, n in tally.executes.items() if n > 1] == []
    assert len(tally.acknowledged) == len(tally.executes)
