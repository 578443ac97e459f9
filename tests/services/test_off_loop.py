"""No O(n) work on the event loop: while VerifyAudit walks and hashes a long
audit chain, or ListToolCalls reads and decodes many records, the daemon
still answers small RPCs, because the scan runs on a worker thread
(`storage.scans`).

Each test holds the scan at its middle row until the small RPCs have been
answered, so the order of events is decided by the test, never by timing: a
small RPC counts when its answer arrives before the scan has read its last
row. The negative control runs the same scan on the event loop
(`OnLoopScans`, broken on purpose, as the daemon did before): then no small
RPC is answered until the scan has ended, and the hold ends by its own
bound. The size of the scan is a parameter (`EFFECTD_TEST_SCAN_ROWS`), small
by default; the small RPCs' latencies are printed, not asserted."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from effectd.v1 import admin_pb2, admin_pb2_grpc, ledger_pb2_grpc
from effectd.v1 import ledger_pb2 as pb
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.clock import ManualClock
from sidecar.composition import Services
from sidecar.config import ServeConfig
from sidecar.ledger import audit
from sidecar.ledger.audit import Action
from sidecar.ledger.model import ToolCall
from sidecar.ledger.policy import FixedPolicy
from sidecar.ledger.validation import Limits
from sidecar.seams import Seams
from sidecar.server import Daemon
from sidecar.services.ledger import LedgerService
from sidecar.services.operator import OperatorService
from sidecar.storage import records, table_ledger
from sidecar.storage.api import ReadView, Store, WriteView
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore
from sidecar.storage.scans import Scans
from sidecar.testing import running_daemon
from tests.rpc.support import prepare_request, ref
from tests.services.support import spec

T = TypeVar("T")

ROWS = int(os.environ.get("EFFECTD_TEST_SCAN_ROWS", "400"))
SMALL_RPCS = 5
# The hold's bound: reached only in the control, where the held scan keeps
# the loop from answering the RPCs that would let it go.
HOLD_SECONDS = 60.0
CONTROL_HOLD_SECONDS = 0.5
RPC_TIMEOUT = 120.0


class OnLoopScans(Scans):
    """BROKEN on purpose: runs every scan on the event loop, as the daemon
    did before scans had their threads."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self._on_loop_store = store

    async def read(self, fn: Callable[[ReadView], T]) -> T:
        return self._on_loop_store.read(fn)


class OnLoopDaemon(Daemon):
    def compose(self, store: Store) -> Services:
        services = super().compose(store)
        clock, limits, policy = self.seams.clock, self.config.limits, services.policy
        on_loop = OnLoopScans(store)
        return replace(
            services,
            ledger=LedgerService(store, clock, limits, policy, scans=on_loop),
            operator=OperatorService(
                store, clock, limits, policy=policy, scans=on_loop
            ),
        )


class Hold:
    """Counts the rows a scan reads, holds it at row `at` until `go` (or
    `seconds`), and says when it has read its last row, row `last`."""

    def __init__(self, *, at: int, last: int, seconds: float) -> None:
        self.at = at
        self.last = last
        self.seconds = seconds
        self.rows = 0
        self.reached = threading.Event()
        self.go = threading.Event()
        self.ended = threading.Event()
        self.released_by_go: bool | None = None

    def row(self) -> None:
        self.rows += 1
        if self.rows == self.at:
            self.reached.set()
            self.released_by_go = self.go.wait(self.seconds)
        if self.rows == self.last:
            self.ended.set()


def _fact(i: int) -> audit.Fact:
    return audit.Fact(
        at_ns=1_700_000_000_000_000_000 + i,
        actor="olga",
        action=Action.RECONCILE_NOT_EXECUTED,
        namespace="default",
        run_id="run",
        call_id=f"c{i}",
        revision_before=2,
        revision_after=3,
        state_before=None,
        state_after=None,
        reason="checked",
        evidence=f"no trace of call {i}",
    )


def _seed(data_dir: Path, *, entries: int, calls: int) -> None:
    """A store with an audit chain of `entries` and `calls` records, written
    before the daemon starts."""
    store = LmdbStore(data_dir, LmdbOptions(sync=False))
    try:
        for start in range(0, entries, 500):

            def chain(view: WriteView, start: int = start) -> None:
                for i in range(start, min(start + 500, entries)):
                    records.append_audit(view, _fact(i))

            store.submit(chain).result()
        ledger = LedgerService(store, ManualClock(), Limits(), FixedPolicy())
        for start in range(0, calls, 500):
            batch = [
                spec(f"c{i:05d}", start=False)
                for i in range(start, min(start + 500, calls))
            ]
            asyncio.run(ledger.prepare_many(batch))
    finally:
        store.close()


def _config(short_tmp: Path) -> ServeConfig:
    return ServeConfig(
        data_dir=short_tmp / "data", init=True, settle_interval_seconds=1e9, sync=False
    )


def _daemon(config: ServeConfig, *, on_loop: bool) -> Daemon:
    return (OnLoopDaemon if on_loop else Daemon)(config, Seams(clock=ManualClock()))


def _small_rpcs_during(
    hold: Hold, small: Callable[[], object], label: str
) -> tuple[int, list[float]]:
    """Once the scan is held: how many of `SMALL_RPCS` were answered before
    it read its last row, and their latencies; then lets it go."""
    assert hold.reached.wait(RPC_TIMEOUT), "the scan never reached its row"
    answered = 0
    latencies = []
    for _ in range(SMALL_RPCS):
        began = time.perf_counter()
        small()
        latencies.append(time.perf_counter() - began)
        answered += not hold.ended.is_set()
    hold.go.set()
    print(
        f"{label}: {answered}/{SMALL_RPCS} answered during the scan; latency "
        f"max {max(latencies) * 1e3:.1f} ms"
    )
    return answered, latencies


@pytest.fixture
def patch(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, Any], None]:
    def put(name: str, value: Any) -> None:
        # A record walk decodes in `table_ledger`; the audit's in `records`.
        for module in (records, table_ledger):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, value)

    return put


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("on_loop", "answered_during"),
    [(False, SMALL_RPCS), (True, 0)],
    ids=["off-loop", "control-on-loop"],
)
def test_small_rpcs_are_answered_while_verify_audit_runs(
    short_tmp: Path,
    patch: Callable[[str, Any], None],
    on_loop: bool,
    answered_during: int,
) -> None:
    """GetToolCall is answered while VerifyAudit hashes a long chain; on the
    loop (the control), not one is answered before the walk ends."""
    config = _config(short_tmp)
    _seed(config.data_dir, entries=ROWS, calls=1)
    hold = Hold(
        at=ROWS // 2,
        last=ROWS,
        seconds=CONTROL_HOLD_SECONDS if on_loop else HOLD_SECONDS,
    )
    walk = records.scan_audit

    def held_walk(view: ReadView, after: int = 0) -> Iterator[tuple[int, bytes]]:
        for row in walk(view, after):
            yield row
            hold.row()

    with running_daemon(config, daemon=_daemon(config, on_loop=on_loop)) as d:
        patch("scan_audit", held_walk)
        with grpc.insecure_channel(d.target) as channel:
            admin = admin_pb2_grpc.AdminStub(channel)
            ledger = ledger_pb2_grpc.ToolLedgerStub(channel)
            verifying = admin.VerifyAudit.future(
                admin_pb2.VerifyAuditRequest(), timeout=RPC_TIMEOUT
            )
            answered, _ = _small_rpcs_during(
                hold,
                lambda: ledger.GetToolCall(
                    pb.GetToolCallRequest(ref=ref(run_id="run-1", call_id="c00000")),
                    timeout=RPC_TIMEOUT,
                ),
                f"GetToolCall, VerifyAudit of {ROWS} entries "
                f"{'on' if on_loop else 'off'} the loop",
            )
            verdict = verifying.result()
    assert (verdict.ok, verdict.entries_checked) == (True, ROWS)
    assert answered == answered_during
    assert hold.released_by_go is not on_loop


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("on_loop", "answered_during"),
    [(False, SMALL_RPCS), (True, 0)],
    ids=["off-loop", "control-on-loop"],
)
def test_small_rpcs_are_answered_while_a_listing_runs(
    short_tmp: Path,
    patch: Callable[[str, Any], None],
    on_loop: bool,
    answered_during: int,
) -> None:
    """Health is answered while ListToolCalls decodes a page of many records;
    on the loop (the control), not before the page is read."""
    calls = min(ROWS, 1000)  # one page
    config = _config(short_tmp)
    _seed(config.data_dir, entries=0, calls=calls)
    hold = Hold(
        at=calls // 2,
        last=calls,
        seconds=CONTROL_HOLD_SECONDS if on_loop else HOLD_SECONDS,
    )
    decode = records.decode_call

    def held_decode(raw: bytes, *, history: bool = True) -> ToolCall:
        call = decode(raw, history=history)
        hold.row()
        return call

    daemon = _daemon(config, on_loop=on_loop)
    with (
        running_daemon(config, daemon=daemon) as d,
        grpc.insecure_channel(d.target) as channel,
    ):
        ledger = ledger_pb2_grpc.ToolLedgerStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        # A first call warms the channel up before anything is held.
        ledger.PrepareTool(prepare_request(call_id="warm"), timeout=RPC_TIMEOUT)
        patch("decode_call", held_decode)
        listing = ledger.ListToolCalls.future(
            pb.ListToolCallsRequest(run_id="run-1", page_size=calls),
            timeout=RPC_TIMEOUT,
        )
        answered, _ = _small_rpcs_during(
            hold,
            lambda: health.Check(
                health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT
            ),
            f"Health, ListToolCalls of {calls} records "
            f"{'on' if on_loop else 'off'} the loop",
        )
        page = listing.result()
    assert len(page.calls) == calls
    assert answered == answered_during
    assert hold.released_by_go is not on_loop


class WatchedScans(Scans):
    """`Scans` that say when a scan's caller was cancelled (its deadline
    passed)."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.watched_store = store
        self.cancelled = threading.Event()

    async def read(self, fn: Callable[[ReadView], T]) -> T:
        try:
            return await self.scan(fn)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def scan(self, fn: Callable[[ReadView], T]) -> T:
        return await super().read(fn)


class UnstoppableScans(WatchedScans):
    """BROKEN on purpose: a thread per scan that is never told to stop, so
    a scan whose caller has gone reads on to its end."""

    async def scan(self, fn: Callable[[ReadView], T]) -> T:
        return await asyncio.to_thread(self.watched_store.read, fn)


class WatchedDaemon(Daemon):
    def __init__(self, config: ServeConfig, scans: type[WatchedScans]) -> None:
        super().__init__(config, Seams(clock=ManualClock()))
        self._scans_type = scans
        self.watched: WatchedScans | None = None

    def compose(self, store: Store) -> Services:
        services = super().compose(store)
        self.watched = self._scans_type(store)
        operator = OperatorService(
            store,
            self.seams.clock,
            self.config.limits,
            policy=services.policy,
            scans=self.watched,
        )
        return replace(services, operator=operator)


# Long enough for the walk to reach its hold, which it does at once.
DEADLINE_SECONDS = 3.0


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("scans", "stops"),
    [(WatchedScans, True), (UnstoppableScans, False)],
    ids=["stoppable", "control-unstoppable"],
)
def test_a_verification_whose_deadline_passed_stops_at_its_next_entry(
    short_tmp: Path,
    patch: Callable[[str, Any], None],
    scans: type[WatchedScans],
    stops: bool,
) -> None:
    """Once VerifyAudit's deadline has passed, its walk hashes no further
    entry; a thread never told to stop (the control) walks to the end."""
    config = _config(short_tmp)
    _seed(config.data_dir, entries=ROWS, calls=0)
    hold = Hold(at=ROWS // 4, last=ROWS, seconds=HOLD_SECONDS)
    finished = threading.Event()
    walk = records.scan_audit

    def held_walk(view: ReadView, after: int = 0) -> Iterator[tuple[int, bytes]]:
        try:
            for row in walk(view, after):
                yield row
                hold.row()
        finally:
            finished.set()

    daemon = WatchedDaemon(config, scans)
    with running_daemon(config, daemon=daemon) as d:
        patch("scan_audit", held_walk)
        with grpc.insecure_channel(d.target) as channel:
            admin = admin_pb2_grpc.AdminStub(channel)
            verifying = admin.VerifyAudit.future(
                admin_pb2.VerifyAuditRequest(), timeout=DEADLINE_SECONDS
            )
            assert hold.reached.wait(RPC_TIMEOUT)
            with pytest.raises(grpc.RpcError) as failed:
                verifying.result()
            assert failed.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            assert daemon.watched is not None
            assert daemon.watched.cancelled.wait(RPC_TIMEOUT)
            hold.go.set()
            assert finished.wait(RPC_TIMEOUT)
    assert hold.rows == (hold.at if stops else ROWS)
