"""effectd on PostgreSQL against DBOS Transact on the same server, and effectd
with 1 to 4 daemons on one database, in one run (`make bench-shared`).

DBOS Transact (pinned in `PINS`) runs in a venv of its own, outside the
repository (`--state`, created once); it is never one of the project's
dependencies. Both sides get a database of their own on the server of
EFFECTD_BENCH_POSTGRES (default postgresql://127.0.0.1:5432/test), dropped
after. A tool call is, for effectd, PrepareTool(start) + the body +
CommitTool(acknowledge) through a daemon's Unix socket
(`bench/effectd_caller.py`: the Python client's sync `Client`, one process
per caller; `--effectd-caller unary`: grpc.aio unary calls); for DBOS, a
workflow per call started with `SetWorkflowID(key)` whose one step is the
body (`bench/dbos_caller.py`), one process per caller, each with
`DBOS.launch()`. A duplicate is the same call again. Every phase is
validated per key: in `first` the body ran exactly once, in `dup` never,
and every call answered its own key's result.

Rounds interleave every point (first, then dup, at 1 and 16 callers; then
effectd's first executions at 32 callers on 1, 2, 3 and 4 daemons), so a
burst of other work on the machine falls on all of them alike; the table
gives the median of the rounds and the ratios of the medians. Per call:
write commits and WAL bytes of each side's database (`pg_stat_database`,
`pg_walinspect`), the CPU milliseconds of effectd's daemons and of both
sides' database backends (/proc; DBOS runs inside its callers, whose CPU is
not counted), and effectd's re-runs per write commit (serialization
failures, deadlocks and unique violations in the server's log, when
readable).

The fast default (`make bench-shared`) runs 2 rounds of few keys; `--deep`
runs 5 rounds of three times as many. `--json` writes the medians,
`--plot` draws calls/s and p99 against daemons at 32 callers (a PNG, with
matplotlib of the bench venv: `bench/shared_plot.py`). Ratios are printed,
never asserted.

    python bench/versus_dbos.py [--deep] [--no-dbos] [--json F] [--plot F.png]
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from databases import scratch
from lifecycle import _daemon
from pg_cost import SERVER, Probe, _cpu_ms, _url, wal_kept

from sidecar.storage.postgres import schema

HERE = Path(__file__).resolve().parent
# The bench venv: DBOS, its driver, and matplotlib for `--plot`.
PINS = ("dbos==3.4.0", "psycopg[binary]==3.3.9", "matplotlib==3.11.2")
_Conn = psycopg.Connection[tuple[object, ...]]


def ensure_venv(venv: Path) -> Path:
    """The DBOS venv with `PINS` installed (once; again when they change)."""
    python = venv / "bin" / "python"
    stamp = venv / "effectd-bench-pins.txt"
    if python.exists() and stamp.exists() and stamp.read_text() == "\n".join(PINS):
        return python
    print(f"installing {', '.join(PINS)} into {venv}", flush=True)
    if not python.exists():
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "install", *PINS], check=True)
    stamp.write_text("\n".join(PINS))
    return python


@dataclass
class Phase:
    """One measured phase of one point: calls/s, latencies, costs per call."""

    calls: int
    seconds: float
    latencies: list[int]
    costs: dict[str, float] = field(default_factory=dict)

    @property
    def ops_s(self) -> float:
        return self.calls / self.seconds

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6


class Failed(Exception):
    """A phase did not validate."""


def _run_callers(
    commands: list[list[str]], phase: str, ready: Callable[[], None]
) -> Phase:
    """Starts the callers, waits until each is ready (warmed up), calls
    `ready`, lets them go together, and validates what they report."""
    procs = [
        subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for c in commands
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise Failed(f"a caller did not start: {line!r}")
        ready()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        reports = []
        for p in procs:
            out, _ = p.communicate(timeout=600)
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    want = 1 if phase == "first" else 0
    latencies: list[int] = []
    calls = 0
    for r in reports:
        bad = {k: n for k, n in r["bodies"].items() if n != want}
        if bad or r["wrong"]:
            raise Failed(f"{phase}: bodies {bad} answers {r['wrong'][:5]}")
        latencies += r["latencies"]
        calls += len(r["bodies"])
    began = min(r["began"] for r in reports)
    ended = max(r["ended"] for r in reports)
    return Phase(calls, ended - began, latencies)


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.token = secrets.token_hex(3)
        self.daemons: list[subprocess.Popen[str]] = []
        self.dbos_python: Path | None = None
        self.log = _server_log()

    def effectd_commands(
        self, callers: int, daemons: int, phase: str, prefix: str, count: int
    ) -> list[list[str]]:
        shares = [callers // daemons] * daemons
        for i in range(callers - sum(shares)):
            shares[i] += 1
        commands = []
        first = 0
        how = self.args.effectd_caller
        for d, share in enumerate(shares):
            # The client's callers are processes, one each, as DBOS's are.
            groups = [1] * share if how == "client" else [share] if share else []
            for group in groups:
                commands.append(
                    [
                        sys.executable,
                        str(HERE / "effectd_caller.py"),
                        f"unix:{self.tmp}/pg{d}/effectd.sock",
                        str(group),
                        phase,
                        prefix,
                        str(first),
                        str(count),
                        how,
                    ]
                )
                first += group * count
        return commands

    def dbos_commands(
        self, url: str, callers: int, phase: str, prefix: str, count: int
    ) -> list[list[str]]:
        assert self.dbos_python is not None
        return [
            [
                str(self.dbos_python),
                str(HERE / "dbos_caller.py"),
                url,
                f"caller{c}",
                phase,
                prefix,
                str(c * count),
                str(count),
            ]
            for c in range(callers)
        ]


def _server_log() -> Path | None:
    found = sorted(glob.glob("/var/log/postgresql/postgresql-*-main.log"))
    if found and os.access(found[-1], os.R_OK):
        return Path(found[-1])
    return None


def _reruns(log: Path | None, offset: int, database: str) -> int | None:
    if log is None:
        return None
    with log.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    # A transaction the store runs again: a serialization failure (under
    # SERIALIZABLE), a deadlock, or a unique violation (a key read absent,
    # inserted meanwhile by another daemon: READ COMMITTED with row locks).
    return sum(
        text.count(f"@{database} ERROR:  {what}")
        for what in (
            "could not serialize",
            "deadlock detected",
            "duplicate key value violates unique constraint",
        )
    )


def _measured(
    probe: Probe, pids: list[int], run: Callable[[Callable[[], None]], Phase]
) -> Phase:
    """`run(ready)` with the database's and the processes' counters around
    the calls it times: marked when `ready` is called, once the callers
    have warmed up (their warm-up keys and connections are not counted),
    and when it returns."""
    probe.admin.execute("SELECT 1")
    backends: list[int] = []
    before: dict[str, object] = {}
    cpu: dict[int, float] = {}

    def ready() -> None:
        backends.extend(probe.backends())
        before.update(probe.mark())
        cpu.update({p: _cpu_ms(p) for p in [*pids, *backends]})

    phase: Phase = run(ready)
    after = probe.mark()
    backends = sorted(set(backends) | set(probe.backends()))
    wal, writes = probe.wal(before["lsn"], after["lsn"])
    n = phase.calls
    phase.costs = {
        "commits": writes / n,
        "wal": wal / n,
        "daemon_ms": sum(_cpu_ms(p) - cpu.get(p, 0.0) for p in pids) / n,
        "pg_ms": sum(_cpu_ms(p) - cpu.get(p, 0.0) for p in backends) / n,
        "writes": writes,
    }
    return phase


def _median(phases: list[Phase], what: str) -> float:
    values = {
        "ops_s": [p.ops_s for p in phases],
        "p50": [p.pct(0.5) for p in phases],
        "p99": [p.pct(0.99) for p in phases],
    }.get(what) or [p.costs.get(what, float("nan")) for p in phases]
    return statistics.median(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deep", action="store_true", help="5 rounds, 3x the keys")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--keys-1", type=int, default=None, help="keys of 1 caller")
    parser.add_argument("--keys-16", type=int, default=None, help="keys per caller")
    parser.add_argument("--keys-32", type=int, default=None, help="keys per caller")
    parser.add_argument("--no-dbos", action="store_true")
    parser.add_argument(
        "--effectd-caller",
        choices=("client", "unary"),
        default="client",
        help="effectd's callers: the Python client's sync Client, one process "
        "each (its default transport), or grpc.aio unary calls, tasks of one "
        "process per daemon",
    )
    parser.add_argument("--json", type=Path, help="the medians, as JSON")
    parser.add_argument("--plot", type=Path, help="calls/s against daemons, PNG")
    parser.add_argument(
        "--state",
        type=Path,
        default=Path(
            os.environ.get("EFFECTD_BENCH_STATE")
            or Path(tempfile.gettempdir()) / "effectd-bench-dbos"
        ),
        help="where the DBOS venv is kept (outside the repository)",
    )
    args = parser.parse_args()
    scale = 3 if args.deep else 1
    for name, fast in (
        ("rounds", 2),
        ("keys_1", 150),
        ("keys_16", 15),
        ("keys_32", 10),
    ):
        if getattr(args, name) is None:
            deep = 5 if name == "rounds" else fast * scale
            setattr(args, name, deep if args.deep else fast)
    with (
        scratch(SERVER, "effectd_vs_e") as effectd_db,
        scratch(SERVER, "effectd_vs_d") as dbos_db,
        psycopg.connect(SERVER, autocommit=True) as admin,
    ):
        names = {"e": effectd_db, "d": dbos_db}
        for name in names.values():
            with psycopg.connect(_url(name), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        schema.migrate_url(_url(names["e"]))
        with (
            wal_kept(admin),
            tempfile.TemporaryDirectory(prefix="effectd-vs-", dir="/tmp") as t,
        ):
            _bench(args, admin, names, Path(t))
    return 0


def _bench(
    args: argparse.Namespace, admin: _Conn, names: dict[str, str], tmp: Path
) -> None:
    bench = Bench(args, tmp)
    e_url, d_url = _url(names["e"]), _url(names["d"])
    for i in range(4):
        bench.daemons.append(
            _daemon(f"{tmp}/pg{i}", "--store", e_url, "--daemon-id", f"pg{i}")
        )
    pids = [d.pid for d in bench.daemons]
    if not args.no_dbos or args.plot is not None:
        bench.dbos_python = ensure_venv(args.state / "venv")
    print(
        f"effectd ({args.effectd_caller} callers) against DBOS Transact "
        f"({PINS[0]}) on one PostgreSQL; {args.rounds} rounds, medians; load average "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()),
        flush=True,
    )
    with (
        psycopg.connect(e_url, autocommit=True) as e_own,
        psycopg.connect(d_url, autocommit=True) as d_own,
    ):
        e_probe, d_probe = (
            Probe(admin, names["e"], e_own),
            Probe(admin, names["d"], d_own),
        )
        results: dict[tuple[str, str, int], list[Phase]] = {}
        reruns: dict[int, list[float]] = {}
        try:
            for r in range(args.rounds):
                _round(
                    bench,
                    r,
                    probes=(e_probe, d_probe),
                    pids=pids,
                    results=results,
                    reruns=reruns,
                )
        finally:
            for d in bench.daemons:
                d.terminate()
            for d in bench.daemons:
                d.wait(timeout=30)
    _print(results, reruns)
    summary = _summary(results, reruns)
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    if args.plot is not None:
        data = tmp / "shared.json"
        data.write_text(json.dumps(summary))
        subprocess.run(
            [
                str(bench.dbos_python),
                str(HERE / "shared_plot.py"),
                str(data),
                str(args.plot),
            ],
            check=True,
        )
        print(f"plot: {args.plot}")


def _summary(
    results: dict[tuple[str, str, int], list[Phase]], reruns: dict[int, list[float]]
) -> dict[str, object]:
    """The medians of every point, and the re-runs, for `--json` and `--plot`."""
    points = []
    for (name, phase, callers), phases in results.items():
        point: dict[str, object] = {"point": name, "phase": phase, "callers": callers}
        for what in ("ops_s", "p50", "p99", *phases[0].costs):
            point[what] = _median(phases, what)
        point["ops_s_rounds"] = [p.ops_s for p in phases]
        points.append(point)
    return {
        "points": points,
        "reruns_per_write": {
            str(d): statistics.median(v) for d, v in sorted(reruns.items())
        },
        "loadavg": os.getloadavg(),
    }


def _round(
    bench: Bench,
    r: int,
    *,
    probes: tuple[Probe, Probe],
    pids: list[int],
    results: dict[tuple[str, str, int], list[Phase]],
    reruns: dict[int, list[float]],
) -> None:
    a = bench.args
    e_probe, d_probe = probes
    d_url = _url(d_probe.db)
    points: list[tuple[str, int, int]] = [("effectd 1d", 1, 1), ("effectd 1d", 16, 1)]
    points.append(("effectd 3d", 16, 3))
    if not a.no_dbos:
        points += [("DBOS", 1, 0), ("DBOS", 16, 0)]
    # A DBOS process first creates its schema alone.
    order = points if r % 2 == 0 else list(reversed(points))
    for name, callers, daemons in order:
        count = a.keys_1 if callers == 1 else a.keys_16
        prefix = f"r{r}{name[0]}{daemons}c{callers}".replace(" ", "")
        for phase in ("first", "dup"):
            if daemons:
                cmds = bench.effectd_commands(callers, daemons, phase, prefix, count)
                measured = _measured(
                    e_probe,
                    pids[:daemons],
                    functools.partial(_run_callers, cmds, phase),
                )
            else:
                cmds = bench.dbos_commands(d_url, callers, phase, prefix, count)
                measured = _measured(
                    d_probe, [], functools.partial(_run_callers, cmds, phase)
                )
                # DBOS runs in its callers, whose backends come and go with
                # them: neither is counted.
                measured.costs.pop("daemon_ms")
                measured.costs.pop("pg_ms")
            results.setdefault((name, phase, callers), []).append(measured)
    for daemons in (1, 2, 3, 4):
        prefix = f"r{r}s{daemons}"
        cmds = bench.effectd_commands(32, daemons, "first", prefix, a.keys_32)
        offset = bench.log.stat().st_size if bench.log is not None else 0
        measured = _measured(
            e_probe, pids[:daemons], functools.partial(_run_callers, cmds, "first")
        )
        failures = _reruns(bench.log, offset, e_probe.db)
        if failures is not None and measured.costs["writes"]:
            reruns.setdefault(daemons, []).append(failures / measured.costs["writes"])
        results.setdefault((f"effectd {daemons}d", "scale", 32), []).append(measured)


def _print(
    results: dict[tuple[str, str, int], list[Phase]], reruns: dict[int, list[float]]
) -> None:
    print(
        f"\n{'point':<13}{'phase':<6}{'callers':>8}{'calls/s':>9}{'p50 ms':>8}"
        f"{'p99 ms':>8}{'commits':>8}{'WAL B':>7}{'daemon ms':>10}{'PG ms':>7}"
    )
    for (name, phase, callers), phases in results.items():
        print(
            f"{name:<13}{phase:<6}{callers:>8}{_median(phases, 'ops_s'):>9.0f}"
            f"{_median(phases, 'p50'):>8.1f}{_median(phases, 'p99'):>8.1f}"
            f"{_median(phases, 'commits'):>8.2f}{_median(phases, 'wal'):>7.0f}"
            f"{_median(phases, 'daemon_ms'):>10.2f}{_median(phases, 'pg_ms'):>7.2f}"
        )
    print("\nratios of the medians (per round in brackets: min-max)")
    for phase, callers, e in (
        ("first", 1, "effectd 1d"),
        ("first", 16, "effectd 1d"),
        ("first", 16, "effectd 3d"),
        ("dup", 1, "effectd 1d"),
        ("dup", 16, "effectd 1d"),
    ):
        _ratio(results, (e, phase, callers), ("DBOS", phase, callers), f"{e} / DBOS")
    one = ("effectd 1d", "scale", 32)
    for daemons in (2, 3, 4):
        _ratio(results, (f"effectd {daemons}d", "scale", 32), one, f"{daemons}d / 1d")
    for daemons, values in sorted(reruns.items()):
        print(
            f"serialization re-runs per write commit, {daemons} daemons at 32 "
            f"callers: {statistics.median(values):.3f}"
        )


def _ratio(
    results: dict[tuple[str, str, int], list[Phase]],
    top: tuple[str, str, int],
    bottom: tuple[str, str, int],
    label: str,
) -> None:
    if top not in results or bottom not in results:
        return
    per_round = [
        a.ops_s / b.ops_s for a, b in zip(results[top], results[bottom], strict=True)
    ]
    print(
        f"{label:<22}{top[1]:<6}{top[2]:>3} callers: "
        f"{_median(results[top], 'ops_s') / _median(results[bottom], 'ops_s'):.2f} "
        f"[{min(per_round):.2f}-{max(per_round):.2f}]"
    )


if __name__ == "__main__":
    raise SystemExit(main())
