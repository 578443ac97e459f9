"""One measured configuration of the peer comparison: a peer, a caller count.

    python bench/peer_harness.py effectd --target unix:/tmp/x/effectd.sock \
        --callers 32 --ops 50 --tag run-1
    python bench/peer_harness.py powertools --target 127.0.0.1:16380 ...

Run by `bench/peers.py`: effectd under the project's venv, Powertools under
the bench venv, so this file and `peer_stats` use the standard library only.
One caller runs in this process; more are forked processes, each with its own
client. Every caller, separated by barriers so no phase overlaps another:

    warm-up  --warm new keys, each called twice (not timed)
    first    --ops new keys: the key is claimed, the tool body runs, the
             result is stored
    dup      the same keys again: the stored result, the body must not run

With --input-bytes, each call's input carries that many more bytes (a
`pad` string), as a tool's real arguments would. Each phase is validated
per key: in `first` the body ran exactly once for every key, in `dup`
never, and every call returned its own key's result.
Stdout carries `mark <phase> start|end` lines (printed by caller 0 once all
callers passed the barrier, for a profiler to follow) and then one JSON line
with both phases' numbers.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing as mp
import sys
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from peer_stats import PHASES, percentile

WARM_KEY = 10_000_000  # warm-up keys sit far above the timed ones
BARRIER_TIMEOUT_S = 300.0

Call = Callable[[int], None]


class Barrier(Protocol):
    def wait(self, timeout: float | None = None) -> int: ...
    def abort(self) -> None: ...


def effectd_caller(
    target: str, tag: str, worker: int, ran: Counter[int], pad: str = ""
) -> Call:
    """The Python client's safe tool call (`Run`), default options."""
    # After the fork: each caller its own channel.
    from effectd_client import Client, Effect, Run  # noqa: PLC0415

    run = Run(Client(target), f"{tag}-w{worker}")

    def bench_tool(request: dict[str, Any]) -> dict[str, int]:
        ran[request["i"]] += 1  # the side effect: once per key
        return {"echo": request["i"]}

    tool = run.tool(effect=Effect.SIDE_EFFECT)(bench_tool)

    def call(i: int) -> None:
        got = tool.at(f"c{i}")(request={"i": i, "pad": pad} if pad else {"i": i})
        if got != {"echo": i}:
            raise AssertionError(f"key {i} returned {got!r}")

    return call


def powertools_caller(
    target: str, tag: str, worker: int, ran: Counter[int], pad: str = ""
) -> Call:
    """`idempotent_function` on the Redis persistence layer, outside Lambda."""
    # The Redis layer is deprecated for v4 (its replacement is an alias of
    # it), and outside Lambda Powertools warns once that it cannot know the
    # remaining time: both expected here.
    warnings.simplefilter("ignore", DeprecationWarning)
    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")
    idempotency = importlib.import_module("aws_lambda_powertools.utilities.idempotency")
    redis_layer = importlib.import_module(
        "aws_lambda_powertools.utilities.idempotency.persistence.redis"
    )
    host, port = target.rsplit(":", 1)
    # ssl defaults to True in the layer; use_local_cache stays False so every
    # duplicate is answered by Redis.
    layer = redis_layer.RedisCachePersistenceLayer(host=host, port=int(port), ssl=False)
    config = idempotency.IdempotencyConfig(
        expires_after_seconds=3600, use_local_cache=False
    )

    def bench_tool(request: dict[str, Any]) -> dict[str, int]:
        ran[request["i"]] += 1
        return {"echo": request["i"]}

    tool = idempotency.idempotent_function(
        data_keyword_argument="request", persistence_store=layer, config=config
    )(bench_tool)

    def call(i: int) -> None:
        request = {"run": tag, "w": worker, "i": i}
        got = tool(request={**request, "pad": pad} if pad else request)
        if got != {"echo": i}:
            raise AssertionError(f"key {i} returned {got!r}")

    return call


CALLERS = {"effectd": effectd_caller, "powertools": powertools_caller}


def mark(worker: int, text: str) -> None:
    if worker == 0:
        print(f"mark {text}", flush=True)


def caller(
    args: argparse.Namespace,
    worker: int,
    barrier: Barrier,
    report: Callable[[dict[str, Any]], None],
) -> None:
    """One caller's warm-up and phases; its numbers go to `report`."""
    out: dict[str, Any] = {"worker": worker}
    try:
        ran: Counter[int] = Counter()
        pad = "x" * args.input_bytes
        call = CALLERS[args.peer](args.target, args.tag, worker, ran, pad)
        for i in range(WARM_KEY, WARM_KEY + args.warm):
            call(i)
            call(i)
        for phase in PHASES:
            before = [ran[i] for i in range(args.ops)]
            barrier.wait(BARRIER_TIMEOUT_S)
            mark(worker, f"{phase} start")
            latencies: list[float] = []
            t0 = time.perf_counter()
            for i in range(args.ops):
                start = time.perf_counter_ns()
                call(i)
                latencies.append((time.perf_counter_ns() - start) / 1e6)
            t1 = time.perf_counter()
            barrier.wait(BARRIER_TIMEOUT_S)
            mark(worker, f"{phase} end")
            runs = [ran[i] - before[i] for i in range(args.ops)]
            out[phase] = {"t0": t0, "t1": t1, "ms": latencies, "runs": runs}
    except BaseException:  # reported; the configuration is then invalid
        out["error"] = traceback.format_exc(limit=8)
        barrier.abort()
    report(out)


def _in_process(
    args: argparse.Namespace, worker: int, barrier: Barrier, q: Any
) -> None:
    caller(args, worker, barrier, q.put)


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Runs every caller; returns their reports."""
    if args.callers == 1:
        reports: list[dict[str, Any]] = []
        caller(args, 0, threading.Barrier(1), reports.append)
        return reports
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(args.callers)
    queue = ctx.Queue()
    sys.stdout.flush()  # nothing buffered may be printed twice
    procs = [
        ctx.Process(target=_in_process, args=(args, w, barrier, queue), daemon=True)
        for w in range(args.callers)
    ]
    for p in procs:
        p.start()
    reports = []
    deadline = time.monotonic() + 3 * BARRIER_TIMEOUT_S
    while len(reports) < args.callers and time.monotonic() < deadline:
        try:
            reports.append(queue.get(timeout=1.0))
        except Exception:  # queue.Empty: check that someone is still alive
            if not any(p.is_alive() for p in procs):
                break
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    return reports


def summarize(
    reports: Sequence[dict[str, Any]], callers: int, ops: int
) -> dict[str, Any]:
    """Each phase's calls/s, p50, p99, and whether it was valid."""
    errors = [r["error"] for r in reports if "error" in r]
    if len(reports) < callers:
        errors.append(f"{len(reports)} of {callers} callers reported")
    result: dict[str, Any] = {}
    for phase in PHASES:
        if errors:
            result[phase] = {"valid": False, "problem": errors[0][-1500:]}
            continue
        parts = [r[phase] for r in reports]
        ms = sorted(x for p in parts for x in p["ms"])
        wall = max(p["t1"] for p in parts) - min(p["t0"] for p in parts)
        want = 1 if phase == "first" else 0
        wrong = sum(1 for p in parts for n in p["runs"] if n != want)
        result[phase] = {
            "valid": wrong == 0 and len(ms) == callers * ops,
            "problem": f"{wrong} keys ran the body other than {want} time(s)"
            if wrong
            else "",
            "calls": len(ms),
            "wall_s": wall,
            "calls_s": len(ms) / wall,
            "p50_ms": percentile(ms, 0.50),
            "p99_ms": percentile(ms, 0.99),
            "max_ms": ms[-1],
        }
    return result


def flush_redis(target: str) -> None:
    """Empties the private Redis (untimed), so runs stay apart and the AOF small."""
    redis = importlib.import_module("redis")
    host, port = target.rsplit(":", 1)
    admin = redis.Redis(host=host, port=int(port))
    admin.flushall()
    admin.close()  # no socket is carried into the forked callers


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peer", choices=sorted(CALLERS))
    parser.add_argument("--target", required=True)
    parser.add_argument("--callers", type=int, default=1)
    parser.add_argument("--ops", type=int, required=True, help="keys per caller")
    parser.add_argument("--warm", type=int, default=20)
    parser.add_argument("--tag", required=True, help="unique per run: keys differ")
    parser.add_argument(
        "--input-bytes", type=int, default=0, help="bytes added to each input"
    )
    args = parser.parse_args(argv)
    if args.peer == "powertools":
        flush_redis(args.target)
    result = summarize(measure(args), args.callers, args.ops)
    print(json.dumps(result), flush=True)
    return 0 if all(p["valid"] for p in result.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
