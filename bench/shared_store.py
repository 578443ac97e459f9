"""The lifecycle on the shared PostgreSQL store against LMDB, in one run.

One lifecycle is PrepareTool(start=True) + CommitTool over the Unix socket
(`bench/lifecycle.py`), with 1 and 32 calls in flight: one daemon on LMDB,
one daemon on PostgreSQL, and three daemons on one PostgreSQL database, the
32 callers spread over them (their numbers summed; one caller reaches the
first daemon only, beside two idle peers that renew their registrations);
and three more daemons on the same database with the per-namespace quotas
off, which then read no usage counters (every caller writes the namespace
`default`, so with quotas on the three daemons' transactions conflict on its
counters and run again).
Each round measures every point once, interleaved, so that a burst of other
work on the machine falls on all of them alike; the table gives the median
of the rounds and the ratios of those medians. The database is created for
the run on the server of EFFECTD_BENCH_POSTGRES (default
postgresql://127.0.0.1:5432/test) and dropped after. The machine's load
average is printed before and after: read the ratios, not the absolute
numbers, on a shared machine.

    python bench/shared_store.py [--seconds 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from databases import scratch, url_of
from lifecycle import _daemon, _load

from sidecar.storage.postgres import schema as pg_schema

SERVER = os.environ.get("EFFECTD_BENCH_POSTGRES", "postgresql://127.0.0.1:5432/test")


def _spread(targets: list[str], in_flight: int, seconds: float) -> dict[str, float]:
    """`in_flight` callers spread over `targets`, measured together."""
    shares = [in_flight // len(targets)] * len(targets)
    for i in range(in_flight - sum(shares)):
        shares[i] += 1
    picked = [(t, n) for t, n in zip(targets, shares, strict=True) if n]
    with concurrent.futures.ThreadPoolExecutor(len(picked)) as pool:
        results = list(
            pool.map(lambda tn: _load("lifecycle", tn[0], tn[1], seconds), picked)
        )
    return {
        "ops_s": sum(r["ops_s"] for r in results),
        "p50_ms": max(r["p50_ms"] for r in results),
        "p99_ms": max(r["p99_ms"] for r in results),
    }


POINTS = (
    "LMDB, 1 daemon",
    "PostgreSQL, 1 daemon",
    "PostgreSQL, 3 daemons",
    "PostgreSQL, 3, no quotas",
)
KEYS = ("ops_s", "p50_ms", "p99_ms")
RATIOS = (
    ("PostgreSQL, 1 daemon", "LMDB, 1 daemon", "PG 1 daemon / LMDB"),
    ("PostgreSQL, 3 daemons", "LMDB, 1 daemon", "PG 3 daemons / LMDB"),
    ("PostgreSQL, 3 daemons", "PostgreSQL, 1 daemon", "PG 3 / PG 1 daemon"),
    ("PostgreSQL, 3, no quotas", "PostgreSQL, 3 daemons", "PG 3 no quotas / quotas"),
)
NO_QUOTAS = ("--quota-open-calls", "0", "--quota-stored-bytes", "0")


def _row(*cells: object) -> None:
    n, name, *numbers = cells
    print(f"{n!s:>9} {name!s:<30}" + "".join(f"{x!s:>10}" for x in numbers))


def _load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _measure(
    targets: dict[str, list[str]], rounds: int, seconds: float
) -> dict[tuple[int, str], dict[str, float]]:
    """The median of `rounds` interleaved rounds of every point."""
    runs: dict[tuple[int, str], list[dict[str, float]]] = {}
    for _ in range(rounds):
        for n in (1, 32):
            for what in POINTS:
                runs.setdefault((n, what), []).append(
                    _spread(targets[what], n, seconds)
                )
    return {
        point: {k: statistics.median(r[k] for r in results) for k in KEYS}
        for point, results in runs.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with psycopg.connect(SERVER, autocommit=True) as admin:
        row = admin.execute("SHOW server_version").fetchone()
        server_version = row[0] if row else "?"
    with scratch(SERVER, "effectd_bench") as name:
        return _bench(args, url_of(SERVER, name), server_version)


def _bench(args: argparse.Namespace, url: str, server_version: str) -> int:
    procs: list[subprocess.Popen[str]] = []
    try:
        pg_schema.migrate_url(url)
        with tempfile.TemporaryDirectory(prefix="effectd-bench-", dir="/tmp") as tmp:
            procs.append(_daemon(f"{tmp}/lmdb"))
            for i in range(3):
                procs.append(
                    _daemon(f"{tmp}/pg{i}", "--store", url, "--daemon-id", f"pg{i}")
                )
            for i in range(3):
                procs.append(
                    _daemon(
                        f"{tmp}/pgq{i}",
                        "--store",
                        url,
                        "--daemon-id",
                        f"pgq{i}",
                        *NO_QUOTAS,
                    )
                )
            pg = [f"unix:{tmp}/pg{i}/effectd.sock" for i in range(3)]
            targets = {
                "LMDB, 1 daemon": [f"unix:{tmp}/lmdb/effectd.sock"],
                "PostgreSQL, 1 daemon": pg[:1],
                "PostgreSQL, 3 daemons": pg,
                "PostgreSQL, 3, no quotas": [
                    f"unix:{tmp}/pgq{i}/effectd.sock" for i in range(3)
                ],
            }
            print(
                f"effectd shared store bench: {args.rounds} rounds of "
                f"{args.seconds:g} s a point, medians; PostgreSQL "
                f"{server_version}, {os.cpu_count()} CPUs"
            )
            print(f"load average before: {_load_average()}")
            medians = _measure(targets, args.rounds, args.seconds)
            print(f"load average after:  {_load_average()}")
            _row("in flight", "what", "ops/s", "p50 ms", "p99 ms")
            for n in (1, 32):
                for what in POINTS:
                    r = medians[n, what]
                    _row(n, what, *(f"{r[k]:.2f}" for k in KEYS))
                for top, bottom, label in RATIOS:
                    a, b = medians[n, top], medians[n, bottom]
                    _row(n, f"ratio {label}", *(f"{a[k] / b[k]:.2f}" for k in KEYS))
    finally:
        for proc in procs:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.terminate()
            proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
