"""effectd's safe tool call, A/B between source trees, interleaved: calls/s
and the CPU time per call of the daemon and of the callers; optionally split
by layer with py-spy.

    .venv/bin/python bench/hotpath.py --tree base=/path/to/old/checkout \
        --tree new=. --callers 1,32 --runs 3
    .venv/bin/python bench/hotpath.py --tree new=. --callers 1,32 \
        --runs 1 --py-spy /path/to/py-spy --profile-dir /tmp/prof

The effectd side of `bench/peers.py` alone, for iterating on the hot path
on a shared machine: each tree (a checkout of this repository) gets its own
daemon, started from that tree's `sidecar` on its defaults (LMDB, fsync on,
Unix socket) in a fresh temporary directory, and its callers import that
tree's Python client; the harness is `bench/peer_harness.py` (first and
duplicate phases, each validated per key). Runs are interleaved (run 1 of
every tree at every caller count, then run 2, the order of the trees
reversed every other run) and every tree after the first is reported as a
ratio to the first, run by run, so both sides of a ratio saw the same moment
of the machine.

The CPU budget: next to the calls per second, the daemon's CPU time per
call in each phase (from /proc/<pid>/stat between the harness's marks) and
the callers' (each caller process's own, summed: its gRPC threads too),
which a machine shared with other work disturbs much less; with `perf stat`
counting instructions here, the daemon's instructions per call too.

With --py-spy, each daemon is recorded in the first run between the
harness's marks of each phase, into --profile-dir as raw collapsed stacks,
and its CPU per call is split by layer (`hotpath_profile`: serving,
boundary, translation, rules, records, commit, other threads); with one
caller, the caller's process is recorded too. It prints the daemons' RSS 1 s
after start. Everything started is stopped by its PID.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hotpath_profile
import peer_stats

HERE = Path(__file__).resolve().parent
HARNESS = HERE / "peer_harness.py"
START_TIMEOUT_S = 30.0
RUN_TIMEOUT_S = 900.0


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--tree",
        action="append",
        required=True,
        help="NAME=PATH of a checkout; the first is the baseline",
    )
    p.add_argument("--callers", default="1,32", help="caller counts, comma-separated")
    p.add_argument("--ops", type=int, default=300, help="keys with one caller")
    p.add_argument(
        "--ops-many", type=int, default=30, help="keys per caller with several"
    )
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--py-spy", type=Path, help="py-spy to profile with")
    p.add_argument("--profile-dir", type=Path, help="where the profiles go")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples/s")
    p.add_argument("--json", type=Path, help="write every run's numbers here")
    p.add_argument(
        "--input-bytes", type=int, default=0, help="bytes added to each input"
    )
    args = p.parse_args(argv)
    args.callers = [int(c) for c in args.callers.split(",")]
    return args


@functools.cache
def write_client(tree: Path) -> None:
    """Writes `tree`'s synchronous Python client modules: build output of
    the client's generator (`clients/python/unasync.py`), which a new
    checkout or worktree does not hold until make or a build ran. A tree
    from before the generator moved there has them committed."""
    generator = tree / "clients" / "python" / "unasync.py"
    if generator.is_file():
        subprocess.run([sys.executable, str(generator)], check=True, cwd=tree)


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that imports `tree`'s daemon and client first (that
    client's synchronous modules written)."""
    write_client(tree)
    env = dict(os.environ)
    paths = [str(tree), str(tree / "clients" / "python" / "src")]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    # A new ledger in the fresh data directory; in the environment rather
    # than as --init, which a tree from before the flag would refuse.
    env["EFFECTD_INIT"] = "true"
    return env


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@contextlib.contextmanager
def daemon(
    tree: Path,
    workdir: Path,
    *,
    wrapper: list[str] | None = None,
    start_timeout: float = START_TIMEOUT_S,
    flags: tuple[str, ...] = (),
) -> Iterator[tuple[str, int]]:
    """`tree`'s daemon on its defaults, and `flags`; (target, pid). Stopped
    by its PID. `wrapper` runs it under another program (valgrind), whose
    PID it is."""
    data, logfile = workdir / "data", workdir / "effectd.log"
    workdir.mkdir()
    argv = [*(wrapper or []), sys.executable, "-m", "sidecar", "serve"]
    argv += ["--data-dir", str(data), *flags]
    with logfile.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=tree, env=tree_env(tree)
        )
    try:
        deadline = time.monotonic() + start_timeout
        while " ready on " not in logfile.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon of {tree} did not start: {logfile}")
            time.sleep(0.05)
        yield f"unix:{data}/effectd.sock", proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(start_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Profiles:
    """py-spy on the given PIDs between a phase's start and end marks."""

    def __init__(
        self, py_spy: Path, out: Path, pids: dict[str, int], rate: int
    ) -> None:
        self.py_spy, self.out, self.pids, self.rate = py_spy, out, pids, rate
        self.procs: list[subprocess.Popen[bytes]] = []
        self.suffix = ""

    def on_mark(self, mark: str) -> None:
        phase, _, edge = mark.partition(" ")
        if edge == "start":
            for who, pid in self.pids.items():
                argv = [str(self.py_spy), "record", "--pid", str(pid)]
                argv += ["--format", "raw", "--nolineno", "--threads"]
                argv += ["--rate", str(self.rate)]
                argv += ["--nonblocking"]
                if who == "caller":
                    argv += ["--idle"]  # its wall time: waiting is the point
                else:
                    # The thread holding the interpreter: its user CPU (the
                    # system's, syscalls, is a row of its own).
                    argv += ["--gil"]
                output = self.out / f"{who}-{phase}{self.suffix}.txt"
                argv += ["--output", str(output)]
                self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL))
        elif edge == "end":
            self.stop()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs = []


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def instructions(pid: int) -> subprocess.Popen[str] | None:
    """`perf stat` counting the instructions of `pid` until SIGINT, or None
    where perf cannot count them (no hardware counters in a VM)."""
    if shutil.which("perf") is None:
        return None
    probe = subprocess.run(
        ["perf", "stat", "-x", ",", "-e", "instructions", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0 or "not supported" in probe.stderr:
        return None
    argv = ["perf", "stat", "-x", ",", "-e", "instructions", "-p", str(pid)]
    return subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)


def counted(perf: subprocess.Popen[str] | None) -> float:
    """The instructions `instructions` counted, once stopped; NaN for none."""
    if perf is None:
        return float("nan")
    perf.send_signal(signal.SIGINT)
    _, err = perf.communicate(timeout=30)
    for line in err.splitlines():
        value, _, rest = line.partition(",")
        if "instructions" in rest and value.strip().isdigit():
            return float(value)
    return float("nan")


class Marks:
    """Follows the harness's phase marks: the daemon's CPU seconds and
    instructions over each phase, and the profiles."""

    def __init__(self, pid: int, profiles: Profiles | None) -> None:
        self.pid, self.profiles = pid, profiles
        self.cpu: dict[str, float] = {}
        self.system: dict[str, float] = {}
        self.instr: dict[str, float] = {}
        self.perf: subprocess.Popen[str] | None = None

    def on_mark(self, mark: str) -> None:
        phase, _, edge = mark.partition(" ")
        user, system = cpu_seconds(self.pid)
        now = user + system
        self.cpu[phase] = now - self.cpu[phase] if edge == "end" else now
        self.system[phase] = system - self.system[phase] if edge == "end" else system
        if edge == "start":
            self.perf = instructions(self.pid)
        else:
            self.instr[phase] = counted(self.perf)
            self.perf = None
        if self.profiles is not None:
            self.profiles.on_mark(mark)

    def stop(self) -> None:
        if self.perf is not None:
            counted(self.perf)
            self.perf = None
        if self.profiles is not None:
            self.profiles.stop()


def harness(  # noqa: PLR0917 (a script's helper)
    tree: Path,
    target: str,
    daemon_pid: int,
    callers: int,
    ops: int,
    tag: str,
    profiles: Profiles | None,
    input_bytes: int = 0,
) -> dict[str, Any]:
    """One configuration, in its own process group (stopped by its PID); each
    phase's numbers get the daemon's CPU milliseconds per call (and its
    instructions, where perf counts them), which a busy machine disturbs
    less than the calls per second; the harness adds the callers' own."""
    argv = [sys.executable, str(HARNESS), "effectd", "--target", target]
    argv += ["--callers", str(callers), "--ops", str(ops), "--tag", tag]
    argv += ["--input-bytes", str(input_bytes)]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=tree_env(tree),
    )
    if profiles is not None:
        profiles.suffix = f"-c{callers}"
        if callers == 1:
            profiles.pids["caller"] = proc.pid
        else:
            profiles.pids.pop("caller", None)
    last = ""
    marks = Marks(daemon_pid, profiles)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("mark "):
                marks.on_mark(line.split(" ", 1)[1].strip())
            elif line.strip():
                last = line
        proc.wait(RUN_TIMEOUT_S)
    finally:
        marks.stop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if not last:
        raise RuntimeError(f"the harness exited {proc.returncode}")
    result: dict[str, Any] = json.loads(last)
    for phase, numbers in result.items():
        calls = callers * ops
        numbers["daemon_cpu_ms"] = 1000 * marks.cpu.get(phase, math.nan) / calls
        numbers["daemon_sys_ms"] = 1000 * marks.system.get(phase, math.nan) / calls
        numbers["daemon_instructions"] = marks.instr.get(phase, math.nan) / calls
        numbers.setdefault("caller_cpu_ms", float("nan"))
    return result


def summary(path: Path) -> str:
    """The top frames of one profile, as text."""
    p = peer_stats.top_frames(path.read_text().splitlines(), n=12)
    lines = [f"{path.name}: {p.samples} samples"]
    for title, part in (
        ("threads", p.threads),
        ("self", p.self_time),
        ("total, sidecar/", p.own_code),
    ):
        lines.append(f"  {title}:")
        lines += [f"    {share:6.1%}  {frame}" for frame, share in part]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    trees = {
        name: Path(path).resolve()
        for name, path in (t.split("=", 1) for t in args.tree)
    }
    records: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="effectd-hotpath-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        running = {
            name: stack.enter_context(daemon(tree, Path(tmp) / name))
            for name, tree in trees.items()
        }
        time.sleep(1.0)  # the daemons settle after start-up
        for name, (_, pid) in running.items():
            print(f"{name}: daemon pid {pid}, idle RSS {rss_mb(pid):.1f} MB")
        for run in range(1, args.runs + 1):
            order = list(trees) if run % 2 else list(trees)[::-1]
            for callers in args.callers:
                ops = args.ops if callers == 1 else args.ops_many
                for name in order:
                    target, pid = running[name]
                    profiles = None
                    if args.py_spy is not None and run == 1:
                        out = (args.profile_dir or Path(tmp)) / name
                        out.mkdir(parents=True, exist_ok=True)
                        profiles = Profiles(
                            args.py_spy, out, {"daemon": pid}, args.rate
                        )
                    tag = f"{name}-r{run}-c{callers}-{time.time_ns()}"
                    result = harness(
                        trees[name],
                        target,
                        pid,
                        callers,
                        ops,
                        tag,
                        profiles,
                        args.input_bytes,
                    )
                    for phase, numbers in result.items():
                        at = {"tree": name, "run": run, "callers": callers}
                        records.append({**at, "phase": phase, "ops": ops, **numbers})
                        print(progress(records[-1]), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=1))
    report(records, list(trees), args)
    if args.py_spy is not None and args.profile_dir is not None:
        layers(records, args.profile_dir, args.rate)
        for path in sorted(args.profile_dir.glob("*/*.txt")):
            print(f"\n{path.parent.name}/{summary(path)}")
    return 0 if all(r["valid"] for r in records) else 1


def progress(r: dict[str, Any]) -> str:
    return (
        f"run {r['run']} {r['tree']:>8} {r['callers']:>2} callers {r['phase']:>5}: "
        f"{r.get('calls_s', 0):8.1f} calls/s "
        f"p50 {r.get('p50_ms', 0):6.2f} ms "
        f"p99 {r.get('p99_ms', 0):6.2f} ms "
        f"daemon CPU {r['daemon_cpu_ms']:5.2f} ms/call "
        f"(sys {r['daemon_sys_ms']:4.2f}) "
        f"caller CPU {r.get('caller_cpu_ms', float('nan')):5.2f}"
        + ("" if r["valid"] else " INVALID")
    )


def _median(rows: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows if r.get(key) == r.get(key)]
    return statistics.median(values) if values else float("nan")


def report(
    records: list[dict[str, Any]], names: list[str], args: argparse.Namespace
) -> None:
    """The CPU budget (medians of the runs) and each tree's same-run ratios
    to the first."""
    base = names[0]
    print(f"\nmedians of {args.runs} interleaved runs; ratios run by run to {base}")
    print(
        f"{'phase':>5} {'callers':>7} {'tree':>8} {'calls/s':>9} {'p50 ms':>7} "
        f"{'p99 ms':>8} {'daemon CPU ms/call':>19} {'caller CPU ms/call':>19} "
        f"{'daemon instr/call':>18}"
    )
    for callers in args.callers:
        for phase in peer_stats.PHASES:
            mine = [
                r
                for r in records
                if r["phase"] == phase and r["callers"] == callers and r["valid"]
            ]
            by = {(r["tree"], r["run"]): r for r in mine}
            for name in names:
                own = [r for r in mine if r["tree"] == name]
                if not own:
                    continue
                line = (
                    f"{phase:>5} {callers:>7} {name:>8} "
                    f"{_median(own, 'calls_s'):9.1f} {_median(own, 'p50_ms'):7.2f} "
                    f"{_median(own, 'p99_ms'):8.2f} "
                    f"{_median(own, 'daemon_cpu_ms'):19.3f} "
                    f"{_median(own, 'caller_cpu_ms'):19.3f} "
                    f"{_median(own, 'daemon_instructions'):18,.0f}"
                )
                if name != base:
                    line += "  " + _ratios(own, by, base)
                print(line)


def _ratios(
    own: list[dict[str, Any]],
    by: dict[tuple[str, int], dict[str, Any]],
    base: str,
) -> str:
    pairs = [(r, by[(base, r["run"])]) for r in own if (base, r["run"]) in by]
    if not pairs:
        return ""

    def of(key: str) -> list[float]:
        return [r[key] / b[key] for r, b in pairs if b[key]]

    calls = of("calls_s")
    return (
        f"calls/s x{statistics.median(calls):.2f} "
        f"[{min(calls):.2f}-{max(calls):.2f}], "
        f"daemon CPU x{statistics.median(of('daemon_cpu_ms')):.2f}, "
        f"caller CPU x{statistics.median(of('caller_cpu_ms')):.2f}"
    )


def layers(records: list[dict[str, Any]], profile_dir: Path, rate: int) -> None:
    """The daemon's CPU per call of the profiled run, split by layer in
    proportion to the py-spy samples of each."""
    print(
        "\nthe daemon's CPU per call by layer (ms; run 1): its user time in "
        "proportion to py-spy --gil samples, its system time (syscalls) apart"
    )
    heads = []
    cells = []
    for r in records:
        if r["run"] != 1 or not r["valid"]:
            continue
        path = profile_dir / r["tree"] / f"daemon-{r['phase']}-c{r['callers']}.txt"
        if not path.exists():
            continue
        counts = hotpath_profile.split(path.read_text().splitlines())
        heads.append(f"{r['tree']} {r['phase']} c{r['callers']}")
        cells.append(
            hotpath_profile.per_call(
                counts,
                rate=rate,
                calls=r["callers"] * r["ops"],
                cpu_ms=r["daemon_cpu_ms"] - r["daemon_sys_ms"],
            )
            | {"kernel": r["daemon_sys_ms"]}
        )
    print(f"{'layer':<14}" + "".join(f"{h:>22}" for h in heads))
    for name in (*hotpath_profile.LAYERS, "kernel"):
        print(f"{name:<14}" + "".join(f"{c[name]:>22.3f}" for c in cells))
    print(f"{'total':<14}" + "".join(f"{sum(c.values()):>22.3f}" for c in cells))


if __name__ == "__main__":
    raise SystemExit(main())
