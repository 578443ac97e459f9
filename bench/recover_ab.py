"""Recover of a 10,000-call run, A/B between source trees, interleaved.

The scale bench (`bench/scale.py`) measures one tree; on a shared machine
two of its runs minutes apart are not comparable. Here one store is filled
(as `bench/scale.py` fills it), copied once per tree, and each tree's
daemon serves its copy (a copy opened by a tree of a later store format is
upgraded at its open, which is timed; a tree of an earlier format gets a
copy without what it does not know: `--base-format 4` takes the plan rows
out). Then rounds alternate between the trees, each round one measuring
process per tree that imports that tree's Python client: `--recovers`
whole-plan recoveries through the generated stub (every page of 1000) and
through `Client.recover`, in wall time and in the measuring process's CPU
time. Every tree after the first is reported as a ratio to the first,
round by round, then the median. Everything started is stopped by its PID.

    .venv/bin/python bench/recover_ab.py --tree base=/path/to/old/checkout \\
        --base-format 4 --tree new=. --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import hotpath
import lmdb
import scale

from sidecar.storage.api import Table

MEASURE = r"""
import json, sys, time
import grpc
from effectd.v1 import recovery_pb2 as rpb, recovery_pb2_grpc
from effectd_client import Client
target, run, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = {"stub": [], "client": [], "client_cpu": []}
with grpc.insecure_channel(target) as channel:
    stub = recovery_pb2_grpc.RecoveryStub(channel)
    for _ in range(repeats):
        began, token, items = time.perf_counter(), "", 0
        while True:
            page = stub.Recover(
                rpb.RecoverRequest(run_id=run, page_size=1000, page_token=token),
                timeout=120,
            )
            items += len(page.items)
            token = page.next_page_token
            if not token:
                break
        out["stub"].append((time.perf_counter() - began) * 1000)
with Client(target, timeout=120) as client:
    for _ in range(repeats):
        began, cpu = time.perf_counter(), time.process_time()
        plan = client.recover(run)
        out["client"].append((time.perf_counter() - began) * 1000)
        out["client_cpu"].append((time.process_time() - cpu) * 1000)
        assert len(plan.items) == items
out["items"] = items
print(json.dumps(out))
"""


def tree_env(tree: Path) -> dict[str, str]:
    hotpath.write_client(tree)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tree), str(tree / "clients" / "python" / "src")]
    )
    return env


def as_format(path: Path, version: str) -> None:
    """Takes out what a store of format `version` does not have."""
    if version != "4":
        raise SystemExit("--base-format: only 4 (before plan rows) is known")
    env = lmdb.open(str(path), max_dbs=len(Table), subdir=True, map_size=scale.MAP_SIZE)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(Table.PLAN_ROWS.value.encode(), txn=txn))
        meta = env.open_db(Table.META.value.encode(), txn=txn)
        txn.put(b"format_version", version.encode(), db=meta)
    env.close()


def spawn(tree: Path, path: Path) -> tuple[subprocess.Popen[str], float]:
    began = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "serve", "--data-dir", str(path)],
        cwd=tree,
        env=tree_env(tree),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    while " ready on " not in proc.stderr.readline():
        if proc.poll() is not None:
            raise RuntimeError(f"the daemon of {tree} did not start")
    took = time.perf_counter() - began
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc, took


def measure(tree: Path, path: Path, repeats: int) -> dict[str, list[float]]:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            MEASURE,
            f"unix:{path}/effectd.sock",
            scale.BIG_RUN,
            str(repeats),
        ],
        cwd=tree,
        env=tree_env(tree),
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    )
    result: dict[str, list[float]] = json.loads(done.stdout)
    return result


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


Series = dict[str, dict[str, list[float]]]
_LABELS = (
    ("stub", "generated stub"),
    ("client", "Python client"),
    ("client_cpu", "client CPU"),
)


def report(trees: dict[str, Path], results: Series, ratios: Series) -> None:
    for name in trees:
        parts = []
        for key, label in _LABELS:
            values = results[name][key]
            parts.append(
                f"{label} p50 {statistics.median(values):.0f} ms "
                f"(min {min(values):.0f}; ratio "
                f"{statistics.median(ratios[name][key]):.2f})"
            )
        print(f"  {name}: " + ", ".join(parts))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", action="append", required=True, help="NAME=PATH")
    p.add_argument("--base-format", default=None, help="the first tree's format")
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--run-calls", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--recovers", type=int, default=3)
    args = p.parse_args()
    trees = {}
    for spec in args.tree:
        name, _, path = spec.partition("=")
        trees[name] = Path(path).resolve()
    shape = scale.Shape(args.records, args.run_calls, 0, 0)
    tmp = Path(tempfile.mkdtemp(prefix="effectd-recover-ab-"))
    procs = []
    try:
        filled = tmp / "filled"
        scale.fill(filled, shape, scale.templates(tmp), 10_000)
        paths = {}
        for i, name in enumerate(trees):
            paths[name] = tmp / name
            shutil.copytree(filled, paths[name])
            if i == 0 and args.base_format:
                as_format(paths[name], args.base_format)
        print(f"store: {args.records:,} records, a run of {args.run_calls:,}")
        for name, tree in trees.items():
            proc, took = spawn(tree, paths[name])
            procs.append(proc)
            print(f"  {name}: first open, spawn to ready {took * 1000:.0f} ms")
        results: Series = {
            n: {"stub": [], "client": [], "client_cpu": []} for n in trees
        }
        ratios: Series = {
            n: {"stub": [], "client": [], "client_cpu": []} for n in trees
        }
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(trees)[::-1]
            got = {}
            for name in order:
                got[name] = measure(trees[name], paths[name], args.recovers)
                for key in results[name]:
                    results[name][key].extend(got[name][key])
            first = next(iter(trees))
            for name in trees:
                for key in ratios[name]:
                    ratios[name][key].append(
                        statistics.median(got[name][key])
                        / statistics.median(got[first][key])
                    )
            print(f"  round {r + 1} done, load average {load()}")
        report(trees, results, ratios)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)
        shutil.rmtree(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
