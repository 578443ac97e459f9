"""A daemon on the shared store, under load, while its tables are locked
past the statement timeout (issue 14, "Faults"): statements time out and
the read pool may run dry, and each request answers UNAVAILABLE /
STORAGE_UNAVAILABLE with `mayHaveBeenApplied=false`. The flag is checked
against the ledger: a start answered "not applied" is repeated once the
locks are gone, and the repeat must be EXECUTE (IN_PROGRESS would mean the
first was applied after all). The daemon serves on after each lock.

The negative control is a store that answers a timed-out request as not
applied and then applies it all the same: the check catches it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import grpc
import psycopg
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1.ledger_pb2_grpc import ToolLedgerStub

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.seams import Seams
from sidecar.server import Daemon
from sidecar.storage.api import Store
from sidecar.storage.postgres.faults import Again, Failed, unavailable
from sidecar.storage.postgres.store import (
    PostgresOptions,
    PostgresStore,
    _CallSave,
    _Item,
    _Outcome,
)
from sidecar.testing import running_daemon
from tests.rpc.support import decode, prepare_request

pytestmark = pytest.mark.slow

WORKERS = 6
READERS = 4
# EXCLUSIVE blocks writes only: starts reach the writer, whose statements
# time out. ACCESS EXCLUSIVE blocks reads too: they time out, and the read
# pool runs dry.
LOCKS = ("EXCLUSIVE", "ACCESS EXCLUSIVE")
LOCK_SECONDS = 2.5
OPTIONS = PostgresOptions(readers=2, statement_timeout=1.0, pool_timeout=0.3)
TABLES = (
    "effectd_calls, effectd_checkpoints, effectd_audit, effectd_meta, "
    "effectd_daemons, effectd_passes, effectd_usage"
)


class AppliesTimedOutLater(PostgresStore):
    """BROKEN on purpose: a timed-out batch, or a call's save sent alone, is
    answered as not applied, then run again until it commits."""

    def _save_alone(self, save: _CallSave, item: _Item) -> None:
        fn, future = item
        for tries in range(100):
            probe: Future[Any] = Future()
            super()._save_alone(save, (fn, probe))
            error = probe.exception()
            if tries == 0:
                if not (error is not None and "statement timeout" in str(error)):
                    _settle_as(future, probe)
                    return
                future.set_exception(error)
            elif error is None or "statement timeout" not in str(error):
                return  # the outcome goes nowhere
            time.sleep(0.1)

    def _attempt(self, batch: list[_Item], *, alone: bool = False) -> list[_Outcome]:
        try:
            return super()._attempt(batch, alone=alone)
        except Failed as failed:
            if "timed out" not in failed.message:
                raise
            message = failed.message
        for _, future in batch:
            future.set_exception(unavailable(message, applied=False))
        for _ in range(100):
            try:
                super()._attempt(batch, alone=alone)  # the outcomes go nowhere
                break
            except (Again, Failed):
                time.sleep(0.1)
        return []


def _settle_as(future: Any, probe: Future[Any]) -> None:
    error = probe.exception()
    if error is None:
        future.set_result(probe.result())
    else:
        future.set_exception(error)


class _Daemon(Daemon):
    def __init__(self, config: ServeConfig, clock: ManualClock, broken: bool) -> None:
        super().__init__(config, Seams(clock=clock))
        self._broken = broken

    def open_store(self) -> Store:
        assert self.config.store is not None
        cls = AppliesTimedOutLater if self._broken else PostgresStore
        return cls(self.config.store, OPTIONS)


@dataclasses.dataclass
class Tally:
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    kinds: Counter[str] = dataclasses.field(default_factory=Counter)
    unclassified: list[str] = dataclasses.field(default_factory=list)
    # Starts answered "not applied" whose repeat was not EXECUTE.
    applied_after_all: list[str] = dataclasses.field(default_factory=list)
    executed: int = 0

    def error(self, exc: grpc.RpcError) -> str | None:
        """The `mayHaveBeenApplied` of a classified error, else None."""
        got = decode(exc)
        applied = got.metadata.get("mayHaveBeenApplied")
        with self.lock:
            if (
                got.code is grpc.StatusCode.UNAVAILABLE
                and got.reason == "STORAGE_UNAVAILABLE"
                and applied in ("true", "false")
            ):
                kind = "other"
                if "statement timeout" in got.message or "timed out" in got.message:
                    kind = "timed out"
                elif "no PostgreSQL connection" in got.message:
                    kind = "pool"
                self.kinds[f"{kind}/applied={applied}"] += 1
                return applied
            self.unclassified.append(f"{got.code} {got.reason} {got.message}")
        return None


def _until_answered(tally: Tally, rpc: Callable[..., Any], request: object) -> Any:
    for _ in range(100):
        try:
            return rpc(request, timeout=30)
        except grpc.RpcError as exc:
            tally.error(exc)
            time.sleep(0.05)
    raise AssertionError("no answer after 100 tries")


def _work(
    stub: ToolLedgerStub,
    worker: int,
    tally: Tally,
    stop: threading.Event,
    commit: bool,
) -> None:
    """Prepare-and-start calls one after the other, each committed when
    `commit`; without, every write the workers send is a start."""
    for i in range(500):
        if stop.is_set():
            return
        call_id = f"w{worker}-{i}"
        request = prepare_request(call_id=call_id, start=True)
        not_applied = False
        for _ in range(100):
            try:
                answer = stub.PrepareTool(request, timeout=30)
                break
            except grpc.RpcError as exc:
                not_applied = tally.error(exc) == "false"
                time.sleep(0.05)
        else:
            raise AssertionError(f"{call_id}: no answer after 100 tries")
        if not (answer.decision == pb.DECISION_EXECUTE and answer.attempt_held):
            if not_applied:
                with tally.lock:
                    tally.applied_after_all.append(call_id)
            continue
        _until_answered(tally, stub.GetToolCall, pb.GetToolCallRequest(ref=request.ref))
        if commit:
            done = pb.CommitToolRequest(
                ref=request.ref,
                attempt=answer.call.attempt,
                result=pb.ToolResult(
                    outcome=pb.OUTCOME_OK, payload=pb.Payload(raw=b"r")
                ),
            )
            _until_answered(tally, stub.CommitTool, done)
        with tally.lock:
            tally.executed += 1


def _read(stub: ToolLedgerStub, tally: Tally, stop: threading.Event) -> None:
    """Listings, one after the other: with the other readers, more at once
    than the read pool holds (a listing reads in a worker thread)."""
    request = pb.ListToolCallsRequest(run_id="run", page_size=10)
    for _ in range(5000):
        if stop.is_set():
            return
        try:
            stub.ListToolCalls(request, timeout=30)
        except grpc.RpcError as exc:
            tally.error(exc)
        time.sleep(0.01)


def _executed(tally: Tally) -> int:
    with tally.lock:
        return tally.executed


def _progressed(tally: Tally, executed: int) -> bool:
    """Whether `executed` calls were executed within a bound."""
    return _wait_for(lambda: _executed(tally) >= executed)


def _wait_for(check: Callable[[], bool], bound: float = 60.0) -> bool:
    end = time.monotonic() + bound
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return False


def _under_locks(
    config: ServeConfig,
    pg_url: str,
    clock: ManualClock,
    *,
    broken: bool,
    locks: tuple[str, ...],
) -> tuple[Tally, list[bool]]:
    """The load through the table locks of the modes `locks`, one after
    the other; the tally, and whether the daemon served again after each."""
    tally, stop = Tally(), threading.Event()
    served_again = []
    shared = replace(config, store=pg_url)
    with (
        running_daemon(shared, daemon=_Daemon(shared, clock, broken)) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        stub = ToolLedgerStub(channel)
        workers = [
            threading.Thread(target=_work, args=(stub, w, tally, stop, not broken))
            for w in range(WORKERS)
        ] + [
            threading.Thread(target=_read, args=(stub, tally, stop))
            for _ in range(READERS)
        ]
        for t in workers:
            t.start()
        try:
            assert _wait_for(lambda: _executed(tally) >= WORKERS)
            for mode in locks:
                with _all_locked(pg_url, mode):
                    time.sleep(LOCK_SECONDS)
                    before = _executed(tally)
                served_again.append(_progressed(tally, before + WORKERS))
        finally:
            stop.set()
            for t in workers:
                t.join(60)
    print(f"executed {tally.executed}, errors {dict(tally.kinds)}")
    return tally, served_again


@contextmanager
def _all_locked(url: str, mode: str) -> Iterator[None]:
    """The store's tables locked in `mode` until exit. A write transaction
    of the daemon locks its tables in its own order (a new call's quota row
    before its call's row), so locking them all may deadlock with one, and
    PostgreSQL then fails one of the two: when it fails the test's, the
    test locks again."""
    for _ in range(20):
        with psycopg.connect(url) as blocker:
            try:
                blocker.execute(f"LOCK TABLE {TABLES} IN {mode} MODE")
            except psycopg.errors.DeadlockDetected:
                continue
            yield
            return
    raise AssertionError(f"the store's tables were never locked in {mode} mode")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_timeouts_and_a_dry_pool_answer_not_applied_truly(
    config: ServeConfig, pg_url: str, clock: ManualClock
) -> None:
    tally, served_again = _under_locks(config, pg_url, clock, broken=False, locks=LOCKS)
    assert tally.unclassified == []
    assert tally.applied_after_all == []
    assert served_again == [True] * len(LOCKS)
    assert {kind for kind in tally.kinds if kind.endswith("applied=true")} == set()
    # Listings run beside the point reads, which hold the event loop while
    # they wait: how often the pool runs dry here varies (printed); the store
    # test exhausts it deterministically.
    assert tally.kinds["timed out/applied=false"] > 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_negative_control_a_timed_out_request_applied_later_is_caught(
    config: ServeConfig, pg_url: str, clock: ManualClock
) -> None:
    # The workers only start calls here, so the batch that times out holds
    # starts, and a start applied after its "not applied" answer is what the
    # check can see (a commit applied late is answered alike on its repeat).
    tally, _ = _under_locks(config, pg_url, clock, broken=True, locks=LOCKS[:1])
    assert tally.applied_after_all != []
