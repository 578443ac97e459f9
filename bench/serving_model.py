"""Which gRPC serving model should effectd use? Measured in one run.

    python bench/serving_model.py [--seconds 3] [--rounds 3] [--warmup 0.5]
                                  [--no-pin] [--variants abcde]

Every server variant runs in its own process(es) on a Unix socket in a
temporary directory, all started up front. A separate client process
(grpc.aio, 1 and 32 calls in flight) measures calls/s, p50 and p99 in
time-bounded windows; the server CPU per call is read from /proc/<pid>/stat
around each window. Each point is measured in --rounds short windows whose
order rotates, so a slow moment of this shared VM (or of its disk) hits all
variants alike. Variants:

  a  grpc.aio echo
  b  sync grpc.server(ThreadPoolExecutor(16)) echo
  c  grpc.aio + durable LMDB compare-and-swap through one writer thread
     with group commit (the handler awaits asyncio.wrap_future)
  d  sync thread-pool server + the same writer (the handler blocks on the
     concurrent.futures.Future)
  e  two grpc.aio processes over one LMDB environment, each with its own
     group-commit writer (LMDB serialises the writers across processes);
     the client alternates calls over both sockets, since SO_REUSEPORT does
     not balance Unix sockets and balances TCP only per connection

The echo servers then serve 64 concurrent long-lived server streams (a chunk
every 10 ms, like a proxied LLM provider stream) to show how many streams
each model holds at once. After the servers stop, the durable variants are
checked: the revisions stored in LMDB must add up to the acknowledged writes.
Only the ratios printed for one run are comparable. By default the servers
are pinned to the first CPU and the client to the second (a sidecar given
one core next to its agent).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import queue
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import grpc.aio
import lmdb

SERVICE = "bench.Bench"
CALL = f"/{SERVICE}/Call"
STREAM = f"/{SERVICE}/Stream"
STATS = f"/{SERVICE}/Stats"

INFLIGHT = (1, 32)
SYNC_WORKERS = 16
MAX_BATCH = 256
MAP_SIZE = 1 << 30
STREAMS = 64
STREAM_CHUNKS = 20
STREAM_INTERVAL_S = 0.010
CALL_TIMEOUT_S = 10.0
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
MAX_SERVER_LIFETIME_S = 600.0

# Request: 16-byte key, expected revision, 64-byte value. Reply: status, revision.
REQUEST_HEAD = struct.Struct(">16sQ")
REPLY = struct.Struct(">BQ")
REVISION = struct.Struct(">Q")
OK, CONFLICT, FAILED = 0, 1, 2
VALUE = b"v" * 64
ECHO_REQUEST = REQUEST_HEAD.pack(b"echo", 0) + VALUE
CHUNK = b"c" * 64
DESCRIPTION = "Which gRPC serving model should effectd use? Measured in one run."

AioContext: TypeAlias = "grpc.aio.ServicerContext[bytes, bytes]"
Unary: TypeAlias = "grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]"


@dataclasses.dataclass(frozen=True)
class Variant:
    key: str
    name: str
    model: str  # "aio" or "sync"
    durable: bool
    procs: int = 1


VARIANTS = (
    Variant("a", "aio echo", "aio", durable=False),
    Variant("b", "sync echo", "sync", durable=False),
    Variant("c", "aio + LMDB", "aio", durable=True),
    Variant("d", "sync + LMDB", "sync", durable=True),
    Variant("e", "2 x aio + LMDB", "aio", durable=True, procs=2),
)


def find_variant(key: str) -> Variant:
    for variant in VARIANTS:
        if variant.key == key:
            return variant
    raise SystemExit(f"unknown variant {key!r}")


def pin(cpu: int | None) -> None:
    """Pins this process (and the threads it starts later) to one CPU."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


# -- server side --------------------------------------------------------------


def open_env(path: str) -> lmdb.Environment:
    return lmdb.open(
        path, map_size=MAP_SIZE, sync=True, metasync=True, lock=True, max_dbs=0
    )


def compare_and_swap(txn: lmdb.Transaction[bytes], request: bytes) -> bytes:
    """Bumps the key's revision if the request expects the current one."""
    key, expected = REQUEST_HEAD.unpack_from(request)
    current = txn.get(key)
    revision = int(REVISION.unpack_from(current)[0]) if current is not None else 0
    if expected != revision:
        return REPLY.pack(CONFLICT, revision)
    txn.put(key, REVISION.pack(revision + 1) + request[REQUEST_HEAD.size :])
    return REPLY.pack(OK, revision + 1)


class Writer:
    """The only thread that writes: drains the queue into one transaction,
    commits once (one fsync), then resolves every waiting future."""

    def __init__(self, env: lmdb.Environment) -> None:
        self._env = env
        self._queue: queue.SimpleQueue[tuple[bytes, Future[bytes]] | None] = (
            queue.SimpleQueue()
        )
        self.commits = 0
        self.writes = 0
        self._thread = threading.Thread(target=self._run, name="writer", daemon=True)
        self._thread.start()

    def submit(self, request: bytes) -> Future[bytes]:
        future: Future[bytes] = Future()
        self._queue.put((request, future))
        return future

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(STOP_TIMEOUT_S)

    def stats(self) -> bytes:
        return json.dumps({"commits": self.commits, "writes": self.writes}).encode()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            self._commit(batch)

    def _commit(self, batch: list[tuple[bytes, Future[bytes]]]) -> None:
        try:
            with self._env.begin(write=True) as txn:
                replies = [compare_and_swap(txn, request) for request, _ in batch]
        except (lmdb.Error, struct.error):
            # Nothing was committed: every caller of the batch hears so.
            replies = [REPLY.pack(FAILED, 0)] * len(batch)
        self.commits += 1
        self.writes += len(batch)
        for (_, future), reply in zip(batch, replies, strict=True):
            future.set_result(reply)


def no_stats() -> bytes:
    return b'{"commits": 0, "writes": 0}'


def watch_stdin(on_eof: Callable[[], None]) -> None:
    """Calls on_eof when the parent closes our stdin (or dies)."""

    def run() -> None:
        sys.stdin.buffer.read()
        on_eof()

    threading.Thread(target=run, name="stdin-watch", daemon=True).start()


def aio_handlers(writer: Writer | None) -> grpc.GenericRpcHandler[bytes, bytes]:
    async def echo(request: bytes, context: AioContext) -> bytes:
        return request

    async def cas(request: bytes, context: AioContext) -> bytes:
        assert writer is not None
        return await asyncio.wrap_future(writer.submit(request))

    async def stream(request: bytes, context: AioContext) -> AsyncIterator[bytes]:
        yield CHUNK
        for _ in range(STREAM_CHUNKS - 1):
            await asyncio.sleep(STREAM_INTERVAL_S)
            yield CHUNK

    async def stats(request: bytes, context: AioContext) -> bytes:
        return writer.stats() if writer is not None else no_stats()

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Call": grpc.unary_unary_rpc_method_handler(
                echo if writer is None else cas
            ),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
            "Stats": grpc.unary_unary_rpc_method_handler(stats),
        },
    )


def sync_handlers(writer: Writer | None) -> grpc.GenericRpcHandler[bytes, bytes]:
    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        return request

    def cas(request: bytes, context: grpc.ServicerContext) -> bytes:
        assert writer is not None
        return writer.submit(request).result(CALL_TIMEOUT_S)

    def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        yield CHUNK
        for _ in range(STREAM_CHUNKS - 1):
            time.sleep(STREAM_INTERVAL_S)
            yield CHUNK

    def stats(request: bytes, context: grpc.ServicerContext) -> bytes:
        return writer.stats() if writer is not None else no_stats()

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Call": grpc.unary_unary_rpc_method_handler(
                echo if writer is None else cas
            ),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
            "Stats": grpc.unary_unary_rpc_method_handler(stats),
        },
    )


def bind(server: grpc.Server | grpc.aio.Server, address: str) -> None:
    if server.add_insecure_port(address) == 0:
        raise SystemExit(f"cannot bind {address}")


async def serve_aio(address: str, writer: Writer | None) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((aio_handlers(writer),))
    bind(server, address)
    await server.start()

    def on_eof() -> None:
        loop.call_soon_threadsafe(stop.set)

    watch_stdin(on_eof)
    print("READY", flush=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), MAX_SERVER_LIFETIME_S)
    await server.stop(0.5)


def serve_sync(address: str, writer: Writer | None) -> None:
    stop = threading.Event()
    pool = ThreadPoolExecutor(max_workers=SYNC_WORKERS)
    server = grpc.server(pool)
    server.add_generic_rpc_handlers((sync_handlers(writer),))
    bind(server, address)
    server.start()
    watch_stdin(stop.set)
    print("READY", flush=True)
    stop.wait(MAX_SERVER_LIFETIME_S)
    server.stop(0.5).wait(STOP_TIMEOUT_S)
    pool.shutdown(wait=False, cancel_futures=True)


def server_main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="serving_model.py _server")
    parser.add_argument("variant")
    parser.add_argument("address")
    parser.add_argument("--db")
    parser.add_argument("--cpu", type=int)
    args = parser.parse_args(argv)
    pin(args.cpu)
    variant = find_variant(args.variant)
    env = open_env(args.db) if variant.durable else None
    writer = Writer(env) if env is not None else None
    try:
        if variant.model == "aio":
            asyncio.run(serve_aio(args.address, writer))
        else:
            serve_sync(args.address, writer)
    finally:
        if writer is not None:
            writer.close()
        if env is not None:
            env.close()


# -- client side --------------------------------------------------------------


@dataclasses.dataclass
class LoadState:
    record: bool = False
    stop: bool = False
    latencies_ns: list[int] = dataclasses.field(default_factory=list)
    acked: int = 0
    refused: int = 0


async def call_loop(
    index: int, calls: Sequence[Unary], state: LoadState, cas: bool, nonce: bytes
) -> None:
    """One caller: sequential calls, alternating over the targets."""
    key = b"%s-%05d" % (nonce, index)
    expected = 0
    turn = index
    while not state.stop:
        request = REQUEST_HEAD.pack(key, expected) + VALUE if cas else ECHO_REQUEST
        started = time.perf_counter_ns()
        reply = await calls[turn % len(calls)](request, timeout=CALL_TIMEOUT_S)
        elapsed = time.perf_counter_ns() - started
        turn += 1
        if cas:
            status, expected = REPLY.unpack(reply)
            if status == OK:
                state.acked += 1
            else:
                state.refused += 1
        if state.record:
            state.latencies_ns.append(elapsed)


async def writer_stats(stats: Sequence[Unary]) -> tuple[int, int]:
    commits = writes = 0
    for call in stats:
        counters = json.loads(await call(b"", timeout=CALL_TIMEOUT_S))
        commits += int(counters["commits"])
        writes += int(counters["writes"])
    return commits, writes


async def run_load(
    targets: Sequence[str], inflight: int, seconds: float, warmup: float, cas: bool
) -> dict[str, Any]:
    channels = [grpc.aio.insecure_channel(target) for target in targets]
    try:
        for channel in channels:
            await asyncio.wait_for(channel.channel_ready(), START_TIMEOUT_S)
        calls: list[Unary] = [c.unary_unary(CALL, None, None) for c in channels]
        stats: list[Unary] = [c.unary_unary(STATS, None, None) for c in channels]
        state = LoadState()
        nonce = os.urandom(4).hex().encode()
        tasks = [
            asyncio.create_task(call_loop(i, calls, state, cas, nonce))
            for i in range(inflight)
        ]
        await asyncio.sleep(warmup)
        commits0, writes0 = await writer_stats(stats)
        print("WINDOW_START", flush=True)
        state.record = True
        wall0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.sleep(seconds)
        state.record = False
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        print("WINDOW_END", flush=True)
        commits1, writes1 = await writer_stats(stats)
        state.stop = True
        await asyncio.wait_for(asyncio.gather(*tasks), CALL_TIMEOUT_S * 2)
    finally:
        for channel in channels:
            await channel.close(None)
    return {
        "latencies_us": [ns // 1000 for ns in state.latencies_ns],
        "wall": wall,
        "client_cpu": cpu,
        "commits": commits1 - commits0,
        "writes": writes1 - writes0,
        "acked": state.acked,
        "refused": state.refused,
    }


@dataclasses.dataclass
class StreamState:
    first_chunk_s: list[float] = dataclasses.field(default_factory=list)
    active: int = 0
    peak: int = 0
    chunks: int = 0


async def run_streams(target: str, count: int) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(target) as channel:
        await asyncio.wait_for(channel.channel_ready(), START_TIMEOUT_S)
        open_stream = channel.unary_stream(STREAM, None, None)
        state = StreamState()

        async def one() -> None:
            started = time.perf_counter()
            first = True
            async for _chunk in open_stream(ECHO_REQUEST, timeout=60.0):
                if first:
                    first = False
                    state.first_chunk_s.append(time.perf_counter() - started)
                    state.active += 1
                    state.peak = max(state.peak, state.active)
                state.chunks += 1
            state.active -= 1

        wall0 = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(one() for _ in range(count))), 60.0)
        wall = time.perf_counter() - wall0
    firsts = sorted(state.first_chunk_s)
    return {
        "streams": count,
        "peak_active": state.peak,
        "chunks": state.chunks,
        "wall_s": wall,
        "ideal_s": (STREAM_CHUNKS - 1) * STREAM_INTERVAL_S,
        "first_p50_ms": firsts[len(firsts) // 2] * 1e3,
        "first_max_ms": firsts[-1] * 1e3,
    }


def client_main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="serving_model.py _client")
    parser.add_argument("targets", nargs="+")
    parser.add_argument("--inflight", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--cas", action="store_true")
    parser.add_argument("--streams", type=int, default=0)
    parser.add_argument("--cpu", type=int)
    args = parser.parse_args(argv)
    pin(args.cpu)
    if args.streams:
        result = asyncio.run(run_streams(args.targets[0], args.streams))
    else:
        result = asyncio.run(
            run_load(args.targets, args.inflight, args.seconds, args.warmup, args.cas)
        )
    print("RESULT " + json.dumps(result), flush=True)


# -- orchestration ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
    seconds: float
    warmup: float
    rounds: int
    server_cpu: int | None
    client_cpu: int | None
    variants: tuple[Variant, ...]


@dataclasses.dataclass(frozen=True)
class Sample:
    """One measured window of one client run."""

    latencies_us: list[int]
    wall: float
    server_cpu: float
    client_cpu: float
    commits: int
    writes: int


@dataclasses.dataclass(frozen=True)
class Point:
    """The samples of one variant at one in-flight level, merged."""

    variant: Variant
    inflight: int
    rate: float
    p50_ms: float
    p99_ms: float
    server_cpu_us: float
    client_cpu_us: float
    batch: float

    @classmethod
    def merge(cls, variant: Variant, inflight: int, samples: list[Sample]) -> Point:
        latencies = sorted(x for s in samples for x in s.latencies_us)
        calls = max(1, len(latencies))
        commits = sum(s.commits for s in samples)
        return cls(
            variant=variant,
            inflight=inflight,
            rate=calls / sum(s.wall for s in samples),
            p50_ms=latencies[int(0.50 * calls)] / 1e3 if latencies else 0.0,
            p99_ms=latencies[int(0.99 * calls)] / 1e3 if latencies else 0.0,
            server_cpu_us=sum(s.server_cpu for s in samples) / calls * 1e6,
            client_cpu_us=sum(s.client_cpu for s in samples) / calls * 1e6,
            batch=sum(s.writes for s in samples) / commits if commits else 0.0,
        )


class Child:
    """A child process whose stdout lines arrive on a queue (bounded waits)."""

    def __init__(self, args: Sequence[str]) -> None:
        script = str(Path(__file__).resolve())
        self.proc = subprocess.Popen(
            [sys.executable, script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)  # EOF

    def expect(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise RuntimeError(f"child {self.proc.args!r} ended its output")
            if line.startswith(prefix):
                return line[len(prefix) :]
        raise RuntimeError(f"no {prefix.strip()!r} from child within {timeout} s")

    def stop(self) -> None:
        """Closes stdin (the child then stops itself); kills after a bound."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def cpu_seconds(pids: Sequence[int]) -> float:
    """utime + stime of the processes (all their threads), in seconds."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass
class Group:
    """The running server process(es) of one variant."""

    variant: Variant
    workdir: Path
    children: list[Child] = dataclasses.field(default_factory=list)
    acked: int = 0
    refused: int = 0

    @property
    def targets(self) -> list[str]:
        return [f"unix:{self.workdir / f'{i}.sock'}" for i in range(self.variant.procs)]

    @property
    def pids(self) -> list[int]:
        return [child.proc.pid for child in self.children]


@contextlib.contextmanager
def servers(variant: Variant, workdir: Path, cfg: Config) -> Iterator[Group]:
    workdir.mkdir()
    group = Group(variant, workdir)
    try:
        for target in group.targets:
            args = ["_server", variant.key, target]
            if variant.durable:
                args += ["--db", str(workdir / "db")]
            if cfg.server_cpu is not None:
                args += ["--cpu", str(cfg.server_cpu)]
            group.children.append(Child(args))
            # One at a time: opening an LMDB env concurrently can fail.
            group.children[-1].expect("READY", START_TIMEOUT_S)
        yield group
    finally:
        for child in group.children:
            child.stop()


def client_args(targets: Sequence[str], cfg: Config, *extra: str) -> list[str]:
    args = ["_client", *targets, *extra]
    if cfg.client_cpu is not None:
        args += ["--cpu", str(cfg.client_cpu)]
    return args


def measure(group: Group, inflight: int, cfg: Config) -> Sample:
    window = cfg.seconds / cfg.rounds
    extra = ["--inflight", str(inflight), "--seconds", str(window)]
    extra += ["--warmup", str(cfg.warmup)]
    if group.variant.durable:
        extra.append("--cas")
    client = Child(client_args(group.targets, cfg, *extra))
    try:
        client.expect("WINDOW_START", START_TIMEOUT_S + cfg.warmup + CALL_TIMEOUT_S)
        cpu0 = cpu_seconds(group.pids)
        client.expect("WINDOW_END", window + CALL_TIMEOUT_S)
        cpu1 = cpu_seconds(group.pids)
        result = json.loads(client.expect("RESULT ", CALL_TIMEOUT_S * 3))
    finally:
        client.stop()
    group.acked += int(result["acked"])
    group.refused += int(result["refused"])
    return Sample(
        latencies_us=[int(x) for x in result["latencies_us"]],
        wall=float(result["wall"]),
        server_cpu=cpu1 - cpu0,
        client_cpu=float(result["client_cpu"]),
        commits=int(result["commits"]),
        writes=int(result["writes"]),
    )


def measure_streams(target: str, cfg: Config) -> dict[str, Any]:
    client = Child(client_args([target], cfg, "--streams", str(STREAMS)))
    try:
        result: dict[str, Any] = json.loads(client.expect("RESULT ", 90.0))
    finally:
        client.stop()
    return result


def stored_revisions(db: Path) -> int:
    """Sum of all revisions in the environment = durable writes it holds."""
    with (
        lmdb.open(str(db), map_size=MAP_SIZE, readonly=True) as env,
        env.begin() as txn,
    ):
        return sum(int(REVISION.unpack_from(v)[0]) for _, v in txn.cursor())


def header(cfg: Config) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lib = ".".join(map(str, lmdb.version()))
    pinning = (
        f"servers on CPU {cfg.server_cpu}, client on CPU {cfg.client_cpu}"
        if cfg.server_cpu is not None
        else "unpinned"
    )
    return (
        f"{now}; Python {platform.python_version()}, grpcio {grpc.__version__}, "
        f"py-lmdb {lmdb.__version__} (LMDB {lib}); {os.cpu_count()} CPUs, "
        f"{pinning}; {cfg.seconds:g} s per point in {cfg.rounds} interleaved "
        f"windows, each after {cfg.warmup:g} s warm-up"
    )


def print_points(points: Sequence[Point]) -> None:
    base = {p.inflight: p for p in points if p.variant.key == "a"}
    print(
        f"\n{'variant':<18}{'in flight':>9}{'calls/s':>9}{'x aio echo':>11}"
        f"{'p50 ms':>8}{'p99 ms':>8}{'srv us/call':>12}{'x aio echo':>11}"
        f"{'cli us/call':>12}{'batch':>7}"
    )
    for p in points:
        ref = base.get(p.inflight)
        rate_x = f"{p.rate / ref.rate:.2f}" if ref else "-"
        cpu_x = f"{p.server_cpu_us / ref.server_cpu_us:.2f}" if ref else "-"
        batch = f"{p.batch:.1f}" if p.variant.durable else "-"
        print(
            f"{p.variant.key + ') ' + p.variant.name:<18}{p.inflight:>9}"
            f"{p.rate:>9.0f}{rate_x:>11}{p.p50_ms:>8.2f}{p.p99_ms:>8.2f}"
            f"{p.server_cpu_us:>12.0f}{cpu_x:>11}{p.client_cpu_us:>12.0f}{batch:>7}"
        )


def ratio_lines(points: Sequence[Point]) -> list[tuple[str, float]]:
    by = {(p.variant.key, p.inflight): p for p in points}
    pairs = (
        ("sync echo / aio echo", "b", "a"),
        ("sync+LMDB / aio+LMDB", "d", "c"),
        ("2 x aio+LMDB / aio+LMDB", "e", "c"),
    )
    out: list[tuple[str, float]] = []
    for label, num, den in pairs:
        for inflight in INFLIGHT:
            n, d = by.get((num, inflight)), by.get((den, inflight))
            if n is not None and d is not None:
                name = f"{label}, {inflight} in flight"
                out.append((f"{name}, calls/s", n.rate / d.rate))
                out.append(
                    (f"{name}, server CPU/call", n.server_cpu_us / d.server_cpu_us)
                )
    return out


def print_summary(
    points: Sequence[Point],
    streams: dict[str, dict[str, Any]],
    checks: Sequence[str],
) -> None:
    print_points(points)
    print("\nSame-run ratios:")
    for label, value in ratio_lines(points):
        print(f"  {label:<54}{value:6.2f}")
    if streams:
        print(
            f"\n{STREAMS} concurrent server streams, {STREAM_CHUNKS} chunks "
            f"every {STREAM_INTERVAL_S * 1e3:g} ms "
            f"(ideal {(STREAM_CHUNKS - 1) * STREAM_INTERVAL_S * 1e3:.0f} ms):"
        )
        for name, s in streams.items():
            print(
                f"  {name:<10} peak active {s['peak_active']:>3}/{s['streams']}"
                f"  all done {s['wall_s'] * 1e3:6.0f} ms  first chunk p50 "
                f"{s['first_p50_ms']:6.1f} ms, max {s['first_max_ms']:6.1f} ms"
            )
    print("\nDurability check (sum of stored revisions vs acknowledged writes):")
    for line in checks:
        print(f"  {line}")


def measure_all(groups: Sequence[Group], cfg: Config) -> list[Point]:
    """Rounds of short windows, rotating the order, so drift hits all alike."""
    samples: dict[tuple[str, int], list[Sample]] = {}
    for r in range(cfg.rounds):
        shift = r % len(groups)
        for group in [*groups[shift:], *groups[:shift]]:
            for inflight in INFLIGHT:
                key = (group.variant.key, inflight)
                samples.setdefault(key, []).append(measure(group, inflight, cfg))
        print(f"  round {r + 1}/{cfg.rounds} done", flush=True)
    return [
        Point.merge(group.variant, inflight, samples[(group.variant.key, inflight)])
        for group in groups
        for inflight in INFLIGHT
    ]


def check_ledger(group: Group) -> str:
    stored = stored_revisions(group.workdir / "db")
    ok = stored == group.acked and group.refused == 0
    return (
        f"{group.variant.name:<16} stored {stored}, acknowledged {group.acked}, "
        f"refused {group.refused}: {'OK' if ok else 'MISMATCH'}"
    )


def run(cfg: Config) -> int:
    print(header(cfg), flush=True)
    streams: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="effectd-bench-") as tmp:
        if len(tmp) > 80:
            raise SystemExit(f"temporary directory path too long for a socket: {tmp}")
        with contextlib.ExitStack() as stack:
            groups = [
                stack.enter_context(servers(v, Path(tmp) / v.key, cfg))
                for v in cfg.variants
            ]
            points = measure_all(groups, cfg)
            for group in groups:
                if not group.variant.durable:
                    result = measure_streams(group.targets[0], cfg)
                    streams[group.variant.model] = result
        # All servers have stopped: check what the durable variants stored.
        checks = [check_ledger(g) for g in groups if g.variant.durable]
    print_summary(points, streams, checks)
    return 0 if all(line.endswith("OK") for line in checks) else 1


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] == "_server":
        server_main(argv[1:])
        return 0
    if argv and argv[0] == "_client":
        client_main(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="measured seconds per point"
    )
    parser.add_argument("--rounds", type=int, default=3, help="windows per point")
    parser.add_argument("--warmup", type=float, default=0.5, help="per window")
    parser.add_argument("--no-pin", action="store_true", help="do not pin CPUs")
    parser.add_argument("--variants", default="abcde", help="subset, e.g. abcd")
    args = parser.parse_args(argv)
    if not 0 < args.seconds <= 60 or not 0 <= args.warmup <= 10:
        parser.error("--seconds must be in (0, 60], --warmup in [0, 10]")
    if not 1 <= args.rounds <= 10:
        parser.error("--rounds must be in [1, 10]")
    variants = tuple(v for v in VARIANTS if v.key in args.variants)
    if not variants:
        parser.error("--variants selects none of abcde")
    cpus = sorted(os.sched_getaffinity(0))
    pinned = not args.no_pin and len(cpus) >= 2
    cfg = Config(
        seconds=args.seconds,
        warmup=args.warmup,
        rounds=args.rounds,
        server_cpu=cpus[0] if pinned else None,
        client_cpu=cpus[1] if pinned else None,
        variants=variants,
    )
    return run(cfg)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
