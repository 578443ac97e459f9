"""effectd's safe tool call, A/B between source trees, interleaved; optionally
profiled with py-spy.

    .venv/bin/python bench/hotpath.py --tree base=/path/to/old/checkout \
        --tree new=. --callers 1 --ops 500 --runs 3
    .venv/bin/python bench/hotpath.py --tree new=. --callers 1 --ops 500 \
        --runs 1 --py-spy /path/to/py-spy --profile-dir /tmp/prof

The effectd side of `bench/peers.py` alone, for iterating on the hot path
on a shared machine: each tree (a checkout of this repository) gets its own
daemon, started from that tree's `sidecar` on its defaults (LMDB, fsync on,
Unix socket) in a fresh temporary directory, and its callers import that
tree's Python client; the harness is `bench/peer_harness.py` (first and
duplicate phases, each validated per key). Runs are interleaved (run 1 of
every tree, then run 2, the order reversed every other run) and every tree
after the first is reported as a ratio to the first, run by run, so both
sides of a ratio saw the same moment of the machine; next to the calls per
second, the daemon's CPU time per call in each phase, which a machine
shared with other work disturbs less.

With --py-spy, each daemon (and with one caller, the caller's process too,
idle samples included: its wall time per call) is recorded in the first run
between the harness's marks of each phase, into --profile-dir as raw
collapsed stacks, and summed up (`peer_stats.top_frames`). It prints the
daemons' RSS 1 s after start. Everything started is stopped by its PID.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    p.add_argument("--callers", type=int, default=1)
    p.add_argument("--ops", type=int, default=500, help="keys per caller")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--py-spy", type=Path, help="py-spy to profile with")
    p.add_argument("--profile-dir", type=Path, help="where the profiles go")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples/s")
    p.add_argument("--json", type=Path, help="write every run's numbers here")
    p.add_argument(
        "--input-bytes", type=int, default=0, help="bytes added to each input"
    )
    return p.parse_args(argv)


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that imports `tree`'s daemon and client first."""
    env = dict(os.environ)
    paths = [str(tree), str(tree / "clients" / "python" / "src")]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@contextlib.contextmanager
def daemon(tree: Path, workdir: Path) -> Iterator[tuple[str, int]]:
    """`tree`'s daemon on its defaults; (target, pid). Stopped by its PID."""
    data, logfile = workdir / "data", workdir / "effectd.log"
    workdir.mkdir()
    argv = [sys.executable, "-m", "sidecar", "serve", "--data-dir", str(data)]
    with logfile.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=tree, env=tree_env(tree)
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while " ready on " not in logfile.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon of {tree} did not start: {logfile}")
            time.sleep(0.05)
        yield f"unix:{data}/effectd.sock", proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
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
                output = self.out / f"{who}-{phase}.txt"
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


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def harness(  # noqa: PLR0917 (a script's helper)
    tree: Path,
    target: str,
    daemon_pid: int,
    args: argparse.Namespace,
    tag: str,
    profiles: Profiles | None,
) -> dict[str, Any]:
    """One configuration, in its own process group (stopped by its PID); each
    phase's numbers get the daemon's CPU milliseconds per call, which a busy
    machine disturbs less than the calls per second."""
    argv = [sys.executable, str(HARNESS), "effectd", "--target", target]
    argv += ["--callers", str(args.callers), "--ops", str(args.ops), "--tag", tag]
    argv += ["--input-bytes", str(args.input_bytes)]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=tree_env(tree),
    )
    if profiles is not None and args.callers == 1:
        profiles.pids["caller"] = proc.pid
    last = ""
    cpu: dict[str, float] = {}
    # With one caller, the harness process is the caller: its CPU too.
    client_cpu: dict[str, float] = {}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("mark "):
                mark = line.split(" ", 1)[1].strip()
                phase, _, edge = mark.partition(" ")
                now = cpu_seconds(daemon_pid)
                cpu[phase] = now - cpu[phase] if edge == "end" else now
                if args.callers == 1:
                    mine = cpu_seconds(proc.pid)
                    started = client_cpu.get(phase, 0.0)
                    client_cpu[phase] = mine - started if edge == "end" else mine
                if profiles is not None:
                    profiles.on_mark(mark)
            elif line.strip():
                last = line
        proc.wait(RUN_TIMEOUT_S)
    finally:
        if profiles is not None:
            profiles.stop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if not last:
        raise RuntimeError(f"the harness exited {proc.returncode}")
    result: dict[str, Any] = json.loads(last)
    for phase, numbers in result.items():
        calls = args.callers * args.ops
        numbers["daemon_cpu_ms"] = 1000 * cpu.get(phase, float("nan")) / calls
        numbers["client_cpu_ms"] = 1000 * client_cpu.get(phase, float("nan")) / calls
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
            for name in order:
                target, pid = running[name]
                profiles = None
                if args.py_spy is not None and run == 1:
                    out = (args.profile_dir or Path(tmp)) / name
                    out.mkdir(parents=True, exist_ok=True)
                    profiles = Profiles(args.py_spy, out, {"daemon": pid}, args.rate)
                tag = f"{name}-r{run}-{time.time_ns()}"
                result = harness(trees[name], target, pid, args, tag, profiles)
                for phase, numbers in result.items():
                    records.append(
                        {"tree": name, "run": run, "phase": phase, **numbers}
                    )
                    print(progress(name, run, phase, numbers), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=1))
    report(records, list(trees), args)
    if args.py_spy is not None and args.profile_dir is not None:
        for path in sorted(args.profile_dir.glob("*/*.txt")):
            print(f"\n{path.parent.name}/{summary(path)}")
    return 0 if all(r["valid"] for r in records) else 1


def progress(name: str, run: int, phase: str, numbers: dict[str, Any]) -> str:
    return (
        f"run {run} {name:>8} {phase:>5}: "
        f"{numbers.get('calls_s', 0):8.1f} calls/s "
        f"p50 {numbers.get('p50_ms', 0):6.2f} ms "
        f"p99 {numbers.get('p99_ms', 0):6.2f} ms "
        f"daemon CPU {numbers['daemon_cpu_ms']:5.2f} ms/call "
        f"client CPU {numbers['client_cpu_ms']:5.2f}"
        + ("" if numbers["valid"] else " INVALID")
    )


def report(
    records: list[dict[str, Any]], names: list[str], args: argparse.Namespace
) -> None:
    base = names[0]
    print(f"\n{args.callers} caller(s), {args.ops} keys each, {args.runs} runs")
    for phase in peer_stats.PHASES:
        by = {(r["tree"], r["run"]): r for r in records if r["phase"] == phase}
        for name in names:
            own = [r for (t, _), r in by.items() if t == name]
            line = (
                f"{phase:>5} {name:>8}: "
                f"{statistics.median(r['calls_s'] for r in own):8.1f} calls/s "
                f"p50 {statistics.median(r['p50_ms'] for r in own):6.2f} ms "
                f"daemon CPU "
                f"{statistics.median(r['daemon_cpu_ms'] for r in own):5.2f} ms/call "
                f"client CPU "
                f"{statistics.median(r['client_cpu_ms'] for r in own):5.2f}"
            )
            if name != base:
                ratios = [
                    r["calls_s"] / by[(base, r["run"])]["calls_s"]
                    for r in own
                    if (base, r["run"]) in by
                ]
                cpu = [
                    r["daemon_cpu_ms"] / by[(base, r["run"])]["daemon_cpu_ms"]
                    for r in own
                    if (base, r["run"]) in by
                ]
                client = [
                    r["client_cpu_ms"] / by[(base, r["run"])]["client_cpu_ms"]
                    for r in own
                    if (base, r["run"]) in by
                ]
                line += (
                    f"  calls/s x{statistics.median(ratios):.2f} of {base} "
                    f"[{min(ratios):.2f}-{max(ratios):.2f}], "
                    f"CPU/call x{statistics.median(cpu):.2f}, "
                    f"client x{statistics.median(client):.2f}"
                )
            print(line)


if __name__ == "__main__":
    raise SystemExit(main())
