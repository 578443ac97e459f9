"""The sync client's session written once, measured: the hand-written
threaded session against the asyncio session driven from threads.

    python bench/session_bridge.py [--seconds 2] [--rounds 3] [--no-pin]

The sync and asyncio sessions (`effectd_client._session`,
`_session_aio`) are written by hand, not generated: the asyncio one is built
on the event loop (futures, a reader task, writes under an `asyncio.Lock`),
the sync one on a queue grpc's sending thread reads, a reader thread and a
lock per caller. The one way to write the session once is the asyncio
session with the sync client's calls run on a loop thread of its own
(`asyncio.run_coroutine_threadsafe(...).result()`), the "bridge". This puts
both under the same load, GetToolCall of a stored call through the public
methods, 1 and 8 calling threads, each variant in a fresh client process for
--seconds after a warm-up, in rotating order, the median of --rounds:

  sync-session   `Client(session=True)`: the hand-written threaded session
  bridge         `AsyncClient(session=True)` on a loop thread, each call of a
                 calling thread handed to it and waited for

and prints calls/s and the client process's CPU per call (user + system),
with the bridge's ratio to the sync session. The daemon is its own process
(LMDB, Unix socket), pinned to the first CPU and the clients to the second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from effectd_client import AsyncClient, Client

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("sync-session", "bridge")
CALLERS = (1, 8)
WARMUP_S = 0.5


def _pin(cpu: int) -> None:
    if len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, {cpu})


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _measured(
    one: Callable[[], None], callers: int, seconds: float
) -> dict[str, float]:
    """Calls/s and CPU µs a call of `callers` threads calling `one`."""
    warm = time.monotonic() + WARMUP_S
    deadline = warm + seconds
    counts: list[int] = []
    lock = threading.Lock()
    ready = threading.Barrier(callers + 1)

    def loop() -> None:
        ready.wait()
        while time.monotonic() < warm:
            one()
        n = 0
        while time.monotonic() < deadline:
            one()
            n += 1
        with lock:
            counts.append(n)

    threads = [threading.Thread(target=loop) for _ in range(callers)]
    for t in threads:
        t.start()
    ready.wait()
    while time.monotonic() < warm:
        time.sleep(0.01)
    cpu = _cpu()
    for t in threads:
        t.join()
    cpu = _cpu() - cpu
    calls = sum(counts)
    return {"calls_s": calls / seconds, "cpu_us": cpu / max(calls, 1) * 1e6}


def sync_session(target: str, callers: int, seconds: float) -> dict[str, float]:
    run = f"bench-sync-{os.getpid()}"
    with Client(target, session=True) as c:
        c.prepare_tool(run, "seed", "t", {"a": 1})
        return _measured(
            lambda: _ignore(c.get_tool_call(run, "seed")), callers, seconds
        )


def bridge(target: str, callers: int, seconds: float) -> dict[str, float]:
    run = f"bench-bridge-{os.getpid()}"
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def opened() -> AsyncClient:
        return AsyncClient(target, session=True)

    c = asyncio.run_coroutine_threadsafe(opened(), loop).result()
    try:
        asyncio.run_coroutine_threadsafe(
            c.prepare_tool(run, "seed", "t", {"a": 1}), loop
        ).result()

        def one() -> None:
            call = c.get_tool_call(run, "seed")
            asyncio.run_coroutine_threadsafe(call, loop).result()

        return _measured(one, callers, seconds)
    finally:
        asyncio.run_coroutine_threadsafe(c.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()


def _ignore(_: Any) -> None:
    return None


def _load(
    variant: str, target: str, n: int, seconds: float, *, pin: bool
) -> dict[str, float]:
    args = [__file__, "--client", variant, target, str(n), str(seconds)]
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--client", nargs=4, metavar=("V", "TARGET", "N", "S"))
    parser.add_argument("--pin-client", action="store_true")
    args = parser.parse_args()
    if args.client:
        if args.pin_client:
            _pin(1)
        variant, target, n, s = args.client
        load = sync_session if variant == "sync-session" else bridge
        print(json.dumps(load(target, int(n), float(s))), flush=True)
        return 0
    pin = not args.no_pin
    with tempfile.TemporaryDirectory(prefix="effectd-bench-", dir="/tmp") as tmp:
        daemon = _daemon(f"{tmp}/data", pin)
        try:
            target = f"unix:{tmp}/data/effectd.sock"
            print(
                f"sync session against the bridge: {args.seconds:g} s a point, "
                f"median of {args.rounds} rounds, pinned={pin}"
            )
            print(f"{'n':>3}  {'variant':<14}{'calls/s':>10}{'CPU µs/call':>14}")
            for n in CALLERS:
                rounds: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
                for r in range(args.rounds):
                    order = VARIANTS[r % 2 :] + VARIANTS[: r % 2]
                    for v in order:
                        rounds[v].append(_load(v, target, n, args.seconds, pin=pin))
                med = {
                    v: {
                        k: statistics.median(x[k] for x in rounds[v])
                        for k in ("calls_s", "cpu_us")
                    }
                    for v in VARIANTS
                }
                for v in VARIANTS:
                    print(
                        f"{n:>3}  {v:<14}{med[v]['calls_s']:>10.0f}"
                        f"{med[v]['cpu_us']:>14.1f}"
                    )
                s, b = med["sync-session"], med["bridge"]
                print(
                    f"{n:>3}  {'bridge/sync':<14}{b['calls_s'] / s['calls_s']:>9.2f}x"
                    f"{b['cpu_us'] / s['cpu_us']:>13.2f}x"
                )
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
