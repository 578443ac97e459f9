"""The lifecycle on the shared PostgreSQL store against LMDB, in one run.

One lifecycle is PrepareTool(start=True) + CommitTool over the Unix socket
(`bench/lifecycle.py`), with 1 and 32 calls in flight: one daemon on LMDB,
one daemon on PostgreSQL, and three daemons on one PostgreSQL database, the
32 callers spread over them (their numbers summed). The database is created
for the run on the server of EFFECTD_BENCH_POSTGRES (default
postgresql://127.0.0.1:5432/test) and dropped after. The machine is shared
and noisy: read the ratios, not the absolute numbers.

    python bench/shared_store.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import secrets
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lifecycle import _daemon, _load, _row

from sidecar.storage import pg_schema

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    name = f"effectd_bench_{secrets.token_hex(4)}"
    with psycopg.connect(SERVER, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = urllib.parse.urlunsplit(
        urllib.parse.urlsplit(SERVER)._replace(path="/" + name)
    )
    procs: list[subprocess.Popen[str]] = []
    try:
        pg_schema.migrate_url(url)
        with tempfile.TemporaryDirectory(prefix="effectd-bench-", dir="/tmp") as tmp:
            procs.append(_daemon(f"{tmp}/lmdb"))
            for i in range(3):
                procs.append(_daemon(f"{tmp}/pg{i}", "--store", url))
            lmdb = [f"unix:{tmp}/lmdb/effectd.sock"]
            pg = [f"unix:{tmp}/pg{i}/effectd.sock" for i in range(3)]
            print(f"effectd shared store bench: {args.seconds:g} s a point")
            _row("in flight", "what", "ops/s", "p50 ms", "p99 ms")
            keys = ("ops_s", "p50_ms", "p99_ms")
            for n in (1, 32):
                points = {
                    "LMDB, 1 daemon": _spread(lmdb, n, args.seconds),
                    "PostgreSQL, 1 daemon": _spread(pg[:1], n, args.seconds),
                    "PostgreSQL, 3 daemons": _spread(pg, n, args.seconds),
                }
                for what, r in points.items():
                    _row(n, what, *(f"{r[k]:.2f}" for k in keys))
                base = points["LMDB, 1 daemon"]
                for what in ("PostgreSQL, 1 daemon", "PostgreSQL, 3 daemons"):
                    r = points[what]
                    _row(
                        n,
                        f"ratio {what[12:]}/LMDB",
                        *(f"{r[k] / base[k]:.2f}" for k in keys),
                    )
    finally:
        for proc in procs:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.terminate()
            proc.wait(timeout=30)
        with psycopg.connect(SERVER, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
