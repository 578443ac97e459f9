"""One ledger at scale: a store of many records against an empty one.

Fills a store through the storage layer directly (`records.save_call` in
write transactions of `--batch` records, fsync OFF for the fill only),
then measures, with fsync ON (the daemon's default) for everything
measured:

- a retention pass over the full store (`RetentionService.compact`, which
  walks the retention index), next to what the pass read before the index:
  every COMMITTED record, decoded and judged (`full scan`);
- start-up: `Daemon.start()` in this process (open the store, settle the
  STARTED calls of an earlier incarnation, the retention pass, bind), the
  first time after the fill (it settles `--started` calls) and again
  (nothing to do); and a daemon process from spawn to "ready";
- PrepareTool (a new call, no start: one durable write) p50 over the Unix
  socket, against a daemon on the full store and one on an empty store,
  in rounds whose order alternates; the ratio is taken round by round
  (both sides of one ratio saw the same moment of the machine), then its
  median;
- Recover of one run of `--run-calls` committed calls, every page of 1000,
  through the generated stub and through the Python client
  (`Client.recover`, its conversion included);
- with `--upgrade`, the first open of the store as the daemon before plan
  rows left it (format 4), which writes the plan row of every COMMITTED
  record.

The store holds `--records` calls: runs of 100 committed, acknowledged
calls last changed a day ago, plus the big run (committed, not
acknowledged), `--started` STARTED calls of an earlier incarnation, and
`--due` acknowledged calls past the retention window. The store is made in
a temporary directory (`--dir` to choose where) and deleted at the end
unless `--keep`. The machine is shared and noisy: read the ratios.

    python bench/scale.py                    # 20,000 records, a fast check
    python bench/scale.py --records 1000000  # the 1M store of docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import lmdb
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc, recovery_pb2_grpc
from effectd.v1 import recovery_pb2 as rpb

from effectd_client import Client
from sidecar.clock import ManualClock, SystemClock
from sidecar.config import ServeConfig
from sidecar.ledger import retention
from sidecar.ledger.fingerprint import fingerprint, result_digest
from sidecar.ledger.model import (
    CallRef,
    Effect,
    Outcome,
    Payload,
    PayloadKind,
    Result,
    State,
    ToolCall,
)
from sidecar.ledger.policy import FixedPolicy
from sidecar.ledger.rules import PrepareSpec
from sidecar.ledger.validation import Limits
from sidecar.rpc.summaries import summarize
from sidecar.server import Daemon
from sidecar.services.ledger import LedgerService
from sidecar.services.recovery import RecoveryService
from sidecar.services.retention import RetentionService
from sidecar.storage import records
from sidecar.storage.api import ReadView, Table, WriteView
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore

ROOT = Path(__file__).resolve().parents[1]
NS = "default"
BIG_RUN = "big-run"
RUN_SIZE = 100
DAY_NS = 86_400 * 10**9
MAP_SIZE = 64 << 30
INPUT = Payload(PayloadKind.JSON, b'{"query": "weather in Lisbon", "units": "metric"}')
RESULT_BODY = b'{"temperature": 21.5, "sky": "clear", "source": "bench"}'


# -- the fill ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Templates:
    acknowledged: ToolCall
    unacknowledged: ToolCall
    started: ToolCall


def templates(tmp: Path) -> Templates:
    """Records made by the ledger itself on a throwaway store: the shapes the
    fill copies under other identities and times."""
    store = LmdbStore(tmp / "templates", LmdbOptions(map_size=16 << 20, sync=False))
    clock = ManualClock()
    policy = FixedPolicy()
    ledger = LedgerService(store, clock, Limits(), policy)
    recovery = RecoveryService(store, clock, Limits(), policy)
    body = Payload(PayloadKind.JSON, RESULT_BODY)
    result = Result(Outcome.OK, body, "", "", result_digest(Outcome.OK, body, "", ""))

    def spec(call_id: str) -> PrepareSpec:
        return PrepareSpec(
            ref=CallRef(NS, "t", call_id),
            tool_name="weather",
            effect=Effect.READ,
            input=INPUT,
            fingerprint=fingerprint(INPUT),
            require_approval=False,
            start=True,
            lease_ms=0,
        )

    async def make() -> Templates:
        done = []
        for call_id in ("a", "u"):
            held = (await ledger.prepare(spec(call_id))).call
            committed = await ledger.commit(
                held.ref,
                attempt=held.attempt,
                result=result,
                expected_revision=None,
            )
            done.append(committed.call)
        [acked] = await recovery.acknowledge(NS, "t", ["a"])
        open_call = (await ledger.prepare(spec("s"))).call
        return Templates(acked, done[1], open_call)

    try:
        return asyncio.run(make())
    finally:
        store.close()


@dataclasses.dataclass(frozen=True)
class Shape:
    records: int
    run_calls: int
    started: int
    due: int

    @property
    def plain(self) -> int:
        """Committed, acknowledged calls not due, in runs of RUN_SIZE."""
        return self.records - self.run_calls - self.started - self.due


def _calls(shape: Shape, t: Templates, now_ns: int) -> Iterator[ToolCall]:
    def copy(template: ToolCall, run_id: str, call_id: str, at_ns: int) -> ToolCall:
        return dataclasses.replace(
            template,
            ref=CallRef(NS, run_id, call_id),
            created_ns=at_ns,
            updated_ns=at_ns,
        )

    day_ago = now_ns - DAY_NS
    for i in range(shape.plain):
        run, call = divmod(i, RUN_SIZE)
        yield copy(t.acknowledged, f"r{run:07d}", f"c{call:03d}", day_ago + i)
    for i in range(shape.run_calls):
        yield copy(t.unacknowledged, BIG_RUN, f"c{i:06d}", day_ago + i)
    for i in range(shape.started):
        yield copy(t.started, f"s{i // RUN_SIZE:05d}", f"c{i:03d}", day_ago + i)
    for i in range(shape.due):
        yield copy(
            t.acknowledged,
            f"d{i // RUN_SIZE:05d}",
            f"c{i:03d}",
            now_ns - 8 * DAY_NS + i,
        )


def _save(view: WriteView, calls: list[ToolCall]) -> None:
    for call in calls:
        records.save_call(view, None, call)


def fill(path: Path, shape: Shape, t: Templates, batch: int) -> float:
    """Writes the store, fsync off; returns the seconds it took."""
    began = time.perf_counter()
    options = LmdbOptions(map_size=MAP_SIZE, sync=False, summarize=summarize)
    store = LmdbStore(path, options)
    try:
        pending: list[ToolCall] = []
        futures = []
        for call in _calls(shape, t, time.time_ns()):
            pending.append(call)
            if len(pending) == batch:
                futures.append(store.submit(functools.partial(_save, calls=pending)))
                pending = []
                # A bounded queue: the writer keeps up with the generator.
                if len(futures) > 4:
                    futures.pop(0).result()
        futures.append(store.submit(functools.partial(_save, calls=pending)))
        for future in futures:
            future.result()
    finally:
        store.close()
    return time.perf_counter() - began


# -- the measures --------------------------------------------------------------


def durable(path: Path) -> LmdbStore:
    return LmdbStore(path, LmdbOptions(map_size=MAP_SIZE, summarize=summarize))


def retention_pass(path: Path) -> tuple[float, int, int]:
    """The indexed pass: seconds, records compacted, index entries read."""
    store = durable(path)
    try:
        service = RetentionService(store, SystemClock(), FixedPolicy())
        began = time.perf_counter()
        done = asyncio.run(service.compact())
        return time.perf_counter() - began, done.compacted, done.examined
    finally:
        store.close()


def full_scan(path: Path) -> tuple[float, int]:
    """What the pass read before the index: every COMMITTED record, decoded
    and judged; seconds and records read."""
    store = durable(path)
    policy = FixedPolicy().current()
    prefix = records.state_prefix(State.COMMITTED)

    def scan(view: ReadView) -> int:
        now_ns = time.time_ns()
        count = 0
        for index_key, _ in view.scan(Table.CALL_STATES, prefix):
            call = records.load_call_at(view, index_key[len(prefix) :])
            assert call is not None
            retention.is_due(call, policy, now_ns)
            count += 1
        return count

    try:
        began = time.perf_counter()
        count = store.read(scan)
        return time.perf_counter() - began, count
    finally:
        store.close()


def upgrade(path: Path) -> float:
    """Takes the plan rows out and marks the store format 4, as the daemon
    before plan rows left it; returns the seconds the next open takes,
    which writes them again (`storage.lmdb.migration`)."""
    env = lmdb.open(str(path), max_dbs=len(Table), subdir=True, map_size=MAP_SIZE)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(Table.PLAN_ROWS.value.encode(), txn=txn))
        meta = env.open_db(Table.META.value.encode(), txn=txn)
        txn.put(b"format_version", b"4", db=meta)
    env.close()
    began = time.perf_counter()
    durable(path).close()
    return time.perf_counter() - began


def config(path: Path) -> ServeConfig:
    return ServeConfig(data_dir=path)


def start_in_process(path: Path) -> float:
    """Seconds `Daemon.start()` takes (open, settle, retention pass, bind)."""

    async def run() -> float:
        daemon = Daemon(config(path))
        began = time.perf_counter()
        await daemon.start()
        took = time.perf_counter() - began
        await daemon.stop(grace=0)
        return took

    return asyncio.run(run())


def spawn(path: Path, *, init: bool = False) -> tuple[subprocess.Popen[str], float]:
    """A daemon process on `path` (with `init`, a new, empty ledger there),
    once ready, and the seconds from spawn."""
    began = time.perf_counter()
    command = [sys.executable, "-m", "sidecar", "serve", "--data-dir", str(path)]
    proc = subprocess.Popen(
        [*command, "--init"] if init else command,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    said: list[str] = []
    while " ready on " not in (line := proc.stderr.readline()):
        said.append(line)
        if proc.poll() is not None:
            said.append(proc.stderr.read())
            raise RuntimeError(f"the daemon did not start: {''.join(said)[-2000:]}")
    took = time.perf_counter() - began
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc, took


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(timeout=60)


def prepares(target: str, run_id: str, count: int) -> list[float]:
    """Milliseconds of `count` PrepareTool calls of new calls, one at a time."""
    latencies = []
    with grpc.insecure_channel(target) as channel:
        stub = ledger_pb2_grpc.ToolLedgerStub(channel)
        for i in range(count):
            request = pb.PrepareToolRequest(
                ref=pb.CallRef(run_id=run_id, call_id=f"p{i:06d}"),
                tool_name="weather",
                effect=pb.EFFECT_READ,
                input=pb.Payload(json=INPUT.data.decode()),
            )
            began = time.perf_counter_ns()
            stub.PrepareTool(request, timeout=30)
            latencies.append((time.perf_counter_ns() - began) / 1e6)
    return latencies


def recover_times(target: str, repeats: int) -> tuple[list[float], list[float], int]:
    """Milliseconds of whole-plan recoveries of the big run, page by page:
    through the generated stub (the daemon and the wire) and through the
    Python client (its conversion to the client's types included); and the
    number of items."""
    raw, converted = [], []
    items = 0
    with grpc.insecure_channel(target) as channel:
        stub = recovery_pb2_grpc.RecoveryStub(channel)
        for _ in range(repeats):
            began = time.perf_counter_ns()
            token, items = "", 0
            while True:
                page = stub.Recover(
                    rpb.RecoverRequest(
                        run_id=BIG_RUN, page_size=1000, page_token=token
                    ),
                    timeout=60,
                )
                items += len(page.items)
                token = page.next_page_token
                if not token:
                    break
            raw.append((time.perf_counter_ns() - began) / 1e6)
    with Client(target) as client:
        for _ in range(repeats):
            began = time.perf_counter_ns()
            plan = client.recover(BIG_RUN)
            converted.append((time.perf_counter_ns() - began) / 1e6)
            assert len(plan.items) == items
    return raw, converted, items


def p50(values: list[float]) -> float:
    return statistics.median(values)


def measure_store(shape: Shape, big: Path, *, upgrading: bool) -> None:
    """The retention pass and the start-up, in this process."""
    took, compacted, examined = retention_pass(big)
    idle, _, idle_examined = retention_pass(big)
    print(
        f"  retention pass: {took * 1000:.0f} ms, {compacted:,} compacted, "
        f"{examined:,} index entries read; the next pass, nothing due: "
        f"{idle * 1000:.0f} ms, {idle_examined:,} read"
    )
    scanned, read = full_scan(big)
    print(
        f"  before the index, the pass read every COMMITTED record: "
        f"{scanned * 1000:.0f} ms for {read:,} (read only, nothing compacted)"
    )
    first = start_in_process(big)
    again = start_in_process(big)
    print(
        f"  start-up, Daemon.start(): {first * 1000:.0f} ms after the fill "
        f"(settles {shape.started:,}), {again * 1000:.0f} ms again"
    )
    if upgrading:
        took = upgrade(big)
        print(
            f"  the first open of the store as format 4, which writes the "
            f"plan rows: {took:.1f} s"
        )


def measure_daemons(args: argparse.Namespace, shape: Shape, big: Path) -> None:
    """PrepareTool and Recover against daemon processes."""
    empty = big.with_name("empty")
    empty.mkdir()
    procs = []
    try:
        big_proc, big_ready = spawn(big)
        procs.append(big_proc)
        empty_proc, empty_ready = spawn(empty, init=True)
        procs.append(empty_proc)
        print(
            f"  start-up, process spawn to ready: {big_ready * 1000:.0f} ms "
            f"(empty store: {empty_ready * 1000:.0f} ms)"
        )
        per_round = max(1, args.prepares // args.rounds)
        on_big: list[float] = []
        on_empty: list[float] = []
        ratios = []
        for r in range(args.rounds):
            # Which store goes first alternates from round to round.
            order = [("e", empty, on_empty), ("b", big, on_big)]
            got = {}
            for tag, path, into in order if r % 2 == 0 else order[::-1]:
                latencies = prepares(
                    f"unix:{path}/effectd.sock", f"{tag}{r}", per_round
                )
                into.extend(latencies)
                got[tag] = p50(latencies)
            ratios.append(got["b"] / got["e"])
        print(
            f"  PrepareTool p50: {p50(on_big):.2f} ms at {shape.records:,} "
            f"records, {p50(on_empty):.2f} ms empty; ratio {p50(ratios):.2f} "
            f"(the median of {args.rounds} rounds' ratios, "
            f"[{min(ratios):.2f}-{max(ratios):.2f}]; {per_round} calls per "
            f"round and store, alternating)"
        )
        raw, converted, items = recover_times(f"unix:{big}/effectd.sock", args.recovers)
        print(
            f"  Recover of a {items:,}-call run, every page of 1000 "
            f"({args.recovers} times): generated stub p50 {p50(raw):.0f} ms "
            f"(min {min(raw):.0f}), Python client p50 {p50(converted):.0f} ms "
            f"(min {min(converted):.0f})"
        )
    finally:
        for proc in procs:
            stop(proc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--run-calls", type=int, default=10_000)
    parser.add_argument("--started", type=int, default=1_000)
    parser.add_argument("--due", type=int, default=5_000)
    parser.add_argument("--prepares", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--recovers", type=int, default=7)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--upgrade",
        action="store_true",
        help="also time the upgrade of the store from format 4 (plan rows written)",
    )
    args = parser.parse_args()
    shape = Shape(args.records, args.run_calls, args.started, args.due)
    if shape.plain < 0:
        parser.error("--records: less than --run-calls + --started + --due")
    # The in-process daemons' start-up notices are not the measure.
    logging.getLogger("sidecar").setLevel(logging.ERROR)

    tmp = Path(tempfile.mkdtemp(prefix="effectd-scale-", dir=args.dir))
    big = tmp / "big"
    try:
        filled = fill(big, shape, templates(tmp), args.batch)
        size = (big / "data.mdb").stat().st_size
        print(
            f"store: {shape.records:,} records ({shape.run_calls:,} in one run, "
            f"{shape.started:,} STARTED of an earlier incarnation, {shape.due:,} "
            f"due), filled in {filled:.1f} s with fsync off; {size / 2**30:.2f} GiB"
        )
        print("measured with fsync on:")
        measure_store(shape, big, upgrading=args.upgrade)
        measure_daemons(args, shape, big)
    finally:
        if args.keep:
            print(f"kept: {tmp}")
        else:
            shutil.rmtree(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
