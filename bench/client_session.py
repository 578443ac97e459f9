"""The Python client's two transports, measured in one run: unary calls
against the ledger session stream, for the sync `Client` and the
`AsyncClient`, at 1 caller and 32 callers (threads, or tasks).

    python bench/client_session.py [--seconds 2] [--rounds 3] [--no-pin]

Two operations through the client's public methods, against one daemon
(its own process, defaults: LMDB with fsync, the Unix socket):

  read       GetToolCall of a stored call: one round trip, no write
  lifecycle  PrepareTool(start) + CommitTool: two durable round trips

Each point runs in a fresh client process for --seconds after a short
warm-up, in --rounds rounds whose order of the four variants rotates, so a
slow moment of this shared machine hits all of them alike; a point's value
is the median of its rounds. By default the daemon is pinned to the first
CPU and the clients to the second (a sidecar beside its agent). Only the
ratios (session / unary, same client kind, same run) are comparable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from effectd_client import AsyncClient, Client

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("sync-unary", "sync-session", "aio-unary", "aio-session")
OPS = ("read", "lifecycle")
CALLERS = (1, 32)
WARMUP_S = 0.5


def _pin(cpu: int) -> None:
    if len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, {cpu})


def _summary(latencies: list[int], elapsed: float) -> dict[str, float]:
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] / 1e6

    return {"ops_s": len(latencies) / elapsed, "p50_ms": pct(0.5), "p99_ms": pct(0.99)}


def sync_load(
    session: bool, op: str, target: str, callers: int, seconds: float
) -> dict[str, float]:
    run = f"bench-sync-{os.getpid()}"
    with Client(target, session=session) as c:
        c.prepare_tool(run, "seed", "t", {"a": 1})
        counter = iter(range(1 << 62))
        lock = threading.Lock()
        latencies: list[int] = []
        warm = time.monotonic() + WARMUP_S
        deadline = warm + seconds

        def one(i: int) -> None:
            if op == "read":
                c.get_tool_call(run, "seed")
                return
            p = c.prepare_tool(run, str(i), "t", {"a": 1}, start=True)
            c.commit_tool(run, str(i), p.call.attempt, {})

        def loop() -> None:
            mine: list[int] = []
            while (now := time.monotonic()) < deadline:
                with lock:
                    i = next(counter)
                start = time.perf_counter_ns()
                one(i)
                if now >= warm:
                    mine.append(time.perf_counter_ns() - start)
            with lock:
                latencies.extend(mine)

        threads = [threading.Thread(target=loop) for _ in range(callers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return _summary(latencies, seconds)


async def aio_load(
    session: bool, op: str, target: str, callers: int, seconds: float
) -> dict[str, float]:
    run = f"bench-aio-{os.getpid()}"
    async with AsyncClient(target, session=session) as c:
        await c.prepare_tool(run, "seed", "t", {"a": 1})
        counter = iter(range(1 << 62))
        latencies: list[int] = []
        warm = time.monotonic() + WARMUP_S
        deadline = warm + seconds

        async def one(i: int) -> None:
            if op == "read":
                await c.get_tool_call(run, "seed")
                return
            p = await c.prepare_tool(run, str(i), "t", {"a": 1}, start=True)
            await c.commit_tool(run, str(i), p.call.attempt, {})

        async def loop() -> None:
            while (now := time.monotonic()) < deadline:
                start = time.perf_counter_ns()
                await one(next(counter))
                if now >= warm:
                    latencies.append(time.perf_counter_ns() - start)

        await asyncio.gather(*(loop() for _ in range(callers)))
    return _summary(latencies, seconds)


def _client(variant: str, op: str, target: str, n: int, seconds: float) -> None:
    kind, transport = variant.split("-")
    session = transport == "session"
    if kind == "sync":
        result = sync_load(session, op, target, n, seconds)
    else:
        result = asyncio.run(aio_load(session, op, target, n, seconds))
    print(json.dumps(result), flush=True)


def _load(
    variant: str, op: str, target: str, n: int, seconds: float, *, pin: bool
) -> dict[str, float]:
    args = [__file__, "--client", variant, op, target, str(n), str(seconds)]
    if pin:
        args.append("--pin-client")
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=seconds * 4 + 60,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _daemon(data_dir: str, pin: bool) -> subprocess.Popen[str]:
    """The daemon, once ready; its log drained so a full pipe never stalls it."""
    preexec: Callable[[], None] | None = (lambda: _pin(0)) if pin else None
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "serve", "--data-dir", data_dir, "--init"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec,  # noqa: PLW1509 - only sets the CPU affinity
    )
    assert proc.stderr is not None
    while "ready" not in proc.stderr.readline():
        if proc.poll() is not None:
            raise RuntimeError("the daemon did not start")
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc


def _row(*cells: object) -> None:
    op, n, name, *numbers = cells
    print(f"{op!s:<10}{n!s:>4}  {name!s:<14}" + "".join(f"{x!s:>11}" for x in numbers))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--client", nargs=5, metavar=("V", "OP", "TARGET", "N", "S"))
    parser.add_argument("--pin-client", action="store_true")
    args = parser.parse_args()
    if args.client:
        if args.pin_client:
            _pin(1)
        variant, op, target, n, s = args.client
        _client(variant, op, target, int(n), float(s))
        return 0
    pin = not args.no_pin
    with tempfile.TemporaryDirectory(prefix="effectd-bench-", dir="/tmp") as tmp:
        daemon = _daemon(f"{tmp}/data", pin)
        try:
            target = f"unix:{tmp}/data/effectd.sock"
            print(
                f"client transports: {args.seconds:g} s a point, median of "
                f"{args.rounds} rounds, {os.cpu_count()} CPUs, pinned={pin}"
            )
            _row("op", "n", "variant", "ops/s", "p50 ms", "p99 ms")
            for op in OPS:
                for n in CALLERS:
                    rounds: dict[str, list[dict[str, float]]] = {
                        v: [] for v in VARIANTS
                    }
                    for r in range(args.rounds):
                        order = VARIANTS[r % 4 :] + VARIANTS[: r % 4]
                        for v in order:
                            rounds[v].append(
                                _load(v, op, target, n, args.seconds, pin=pin)
                            )
                    med = {
                        v: {
                            k: statistics.median(x[k] for x in rounds[v])
                            for k in ("ops_s", "p50_ms", "p99_ms")
                        }
                        for v in VARIANTS
                    }
                    for v in VARIANTS:
                        m = med[v]
                        _row(
                            op,
                            n,
                            v,
                            f"{m['ops_s']:.0f}",
                            f"{m['p50_ms']:.3f}",
                            f"{m['p99_ms']:.3f}",
                        )
                    for kind in ("sync", "aio"):
                        s, u = med[f"{kind}-session"], med[f"{kind}-unary"]
                        _row(
                            op,
                            n,
                            f"{kind} ratio",
                            f"{s['ops_s'] / u['ops_s']:.2f}x",
                            f"{s['p50_ms'] / u['p50_ms']:.2f}x",
                            f"{s['p99_ms'] / u['p99_ms']:.2f}x",
                        )
        finally:
            if daemon.stdin is not None:
                daemon.stdin.close()
            daemon.terminate()
            daemon.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
