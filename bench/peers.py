"""effectd against AWS Lambda Powertools idempotency on durable Redis, one run.

    make bench-peers        # or: .venv/bin/python bench/peers.py [options]

Installs what it needs: redis-server from Debian's packages if it is missing
(apt-get, as root), and a separate bench venv (default under --state, never
inside the repository) with pinned aws-lambda-powertools[redis,aws-sdk],
redis-py, matplotlib and py-spy; the project's dependencies stay as they are.
Then it starts, each in a fresh temporary directory, a private redis-server
on a free 127.0.0.1 port with `--appendonly yes --appendfsync always` (it
fsyncs before it answers a write) and the daemon from the project's venv on
its defaults (LMDB, fsync on, Unix socket), and drives both through one
harness (`bench/peer_harness.py`): 1 caller and 32 caller processes, a
`first` and a `duplicate` phase, each validated per key. The configurations
run --runs times, interleaved (run 1 of all of them, then run 2, the order of
the two peers alternating), and the ratios pair the two peers of one run.
It prints the table, the issue 27 targets (reported, never asserted), the
daemon's RSS idle and under the 32-process load, writes a PNG plot, and with
--profile records the daemon with py-spy during one more 32-process first
phase. Everything it started is stopped by PID. It exits 1 if a phase did
not validate. Each option has an environment twin: PEERS_RUNS (--runs),
PEERS_OPS_1, PEERS_OPS_32, PEERS_STATE, PEERS_VENV, PEERS_PLOT, PEERS_PROFILE
and PEERS_MARKDOWN=1.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import peer_stats

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
HARNESS = HERE / "peer_harness.py"
PINS = (
    "aws-lambda-powertools[redis,aws-sdk]==3.37.0",
    # Powertools' idempotency package imports its DynamoDB layer, hence boto3
    # ([aws-sdk]) although Redis is the store.
    "redis==8.1.0",
    "boto3==1.44.8",
    "matplotlib==3.11.2",
    "py-spy==0.4.3",
)
START_TIMEOUT_S = 30.0
RUN_TIMEOUT_S = 900.0


def env_default(name: str, default: str) -> str:
    return os.environ.get(f"PEERS_{name}", default)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=int(env_default("RUNS", "3")))
    p.add_argument(
        "--ops-1",
        type=int,
        default=int(env_default("OPS_1", "1000")),
        help="keys per phase with 1 caller",
    )
    p.add_argument(
        "--ops-32",
        type=int,
        default=int(env_default("OPS_32", "50")),
        help="keys per caller and phase with 32 callers",
    )
    p.add_argument(
        "--state",
        type=Path,
        default=Path(env_default("STATE", f"{tempfile.gettempdir()}/effectd-peers")),
        help="the bench venv and the last run's results, logs and plot",
    )
    p.add_argument("--venv", type=Path, default=os.environ.get("PEERS_VENV"))
    p.add_argument("--plot", type=Path, default=os.environ.get("PEERS_PLOT"))
    p.add_argument(
        "--profile",
        type=int,
        default=int(env_default("PROFILE", "0")),
        metavar="OPS",
        help="py-spy the daemon over one more 32-process first phase of OPS "
        "keys per caller (0: no profile)",
    )
    p.add_argument(
        "--markdown", action="store_true", default=bool(env_default("MARKDOWN", ""))
    )
    args = p.parse_args(argv)
    args.venv = args.venv or args.state / "venv"
    args.plot = args.plot or args.state / "last" / "peers.png"
    for path in (args.state, args.venv):
        if path.resolve().is_relative_to(ROOT):
            p.error(f"{path} is inside the repository")
    return args


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def ensure_redis_server() -> None:
    if shutil.which("redis-server") and shutil.which("redis-cli"):
        return
    log("installing redis-server from Debian's packages")
    subprocess.run(["apt-get", "update"], check=True)
    subprocess.run(["apt-get", "install", "-y", "redis-server"], check=True)


def ensure_venv(venv: Path) -> Path:
    """The bench venv with PINS installed (once; re-done when PINS change)."""
    python = venv / "bin" / "python"
    stamp = venv / "peers-pins.txt"
    if stamp.exists() and stamp.read_text() == "\n".join(PINS):
        return python
    log(f"installing the peers' packages into {venv}")
    if not python.exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "install", *PINS], check=True)
    stamp.write_text("\n".join(PINS))
    return python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def started(
    args: list[str], logfile: Path, **kw: Any
) -> Iterator[subprocess.Popen[bytes]]:
    """A process of ours, stopped by its PID on the way out."""
    with logfile.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, **kw)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log(f"stopped pid {proc.pid} ({Path(args[0]).name})")


def wait_until(
    ready: Callable[[], bool], what: str, proc: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start")
        time.sleep(0.05)


@contextlib.contextmanager
def redis(workdir: Path) -> Iterator[tuple[str, int]]:
    """A private redis-server, AOF fsync'ed on every write; (target, pid)."""
    port = free_port()
    workdir.mkdir()
    argv = ["redis-server", "--bind", "127.0.0.1", "--port", str(port)]
    argv += ["--protected-mode", "yes", "--dir", str(workdir), "--save", ""]
    argv += ["--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no"]
    with started(argv, workdir / "redis.log") as proc:

        def ours() -> bool:
            # The port is checked to answer with our PID: not another server
            # that took the port in between.
            info = subprocess.run(
                ["redis-cli", "-h", "127.0.0.1", "-p", str(port), "info", "server"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            return f"process_id:{proc.pid}" in info.split()

        wait_until(ours, "redis-server", proc)
        log(f"redis-server pid {proc.pid} on 127.0.0.1:{port}, appendfsync always")
        yield f"127.0.0.1:{port}", proc.pid


@contextlib.contextmanager
def effectd(workdir: Path) -> Iterator[tuple[str, int]]:
    """The daemon from the project's venv on its defaults; (target, pid)."""
    data, logfile = workdir / "data", workdir / "effectd.log"
    workdir.mkdir()
    argv = [sys.executable, "-m", "sidecar", "serve", "--data-dir", str(data), "--init"]
    with started(argv, logfile, cwd=ROOT) as proc:
        wait_until(lambda: " ready on " in logfile.read_text(), "effectd", proc)
        log(f"effectd pid {proc.pid} on {data}/effectd.sock, LMDB fsync on")
        yield f"unix:{data}/effectd.sock", proc.pid


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class PeakRss:
    """Samples a process's RSS every 100 ms while in use; keeps the peak."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, rss_mb(self.pid))


@dataclasses.dataclass(frozen=True, slots=True)
class Peer:
    """What the harness drives: a peer's name, the venv's python, its server."""

    name: str
    python: Path
    target: str


def harness(
    peer: Peer,
    callers: int,
    ops: int,
    *,
    tag: str,
    on_mark: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """One configuration, in its own process group (stopped by its PID)."""
    argv = [str(peer.python), str(HARNESS), peer.name, "--target", peer.target]
    argv += ["--callers", str(callers), "--ops", str(ops), "--tag", tag]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    timer = threading.Timer(RUN_TIMEOUT_S, os.killpg, (proc.pid, signal.SIGKILL))
    timer.start()
    try:
        assert proc.stdout is not None
        last = ""
        for line in proc.stdout:
            if line.startswith("mark "):
                on_mark(line.split(" ", 1)[1].strip())
            elif line.strip():
                last = line
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if not last:
        fail = {"valid": False, "problem": f"the harness exited {proc.returncode}"}
        return dict.fromkeys(peer_stats.PHASES, fail)
    result: dict[str, Any] = json.loads(last)
    return result


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServerCpu:
    """The server's CPU time over each phase, between the harness's marks:
    the daemon's for effectd, redis-server's for Powertools."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seconds: dict[str, float] = {}

    def on_mark(self, mark: str) -> None:
        phase, _, edge = mark.partition(" ")
        now = cpu_seconds(self.pid)
        self.seconds[phase] = now - self.seconds[phase] if edge == "end" else now

    def per_call(self, phase: str, calls: int) -> float:
        return 1000 * self.seconds.get(phase, float("nan")) / calls


class Profiler:
    """py-spy on the daemon between the marks of the first phase."""

    def __init__(self, py_spy: Path, pid: int, output: Path) -> None:
        self.py_spy, self.pid, self.output = py_spy, pid, output
        self.proc: subprocess.Popen[bytes] | None = None

    def on_mark(self, mark: str) -> None:
        if mark == "first start":
            argv = [str(self.py_spy), "record", "--pid", str(self.pid), "--format"]
            argv += ["raw", "--nolineno", "--threads", "--nonblocking", "--output"]
            self.proc = subprocess.Popen(
                [*argv, str(self.output)], stdout=subprocess.DEVNULL
            )
        elif mark == "first end":
            self.stop()

    def stop(self) -> None:
        """Ends the recording (py-spy writes its file on SIGINT), if on."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


VERSIONS = """
import sys
from importlib.metadata import PackageNotFoundError, version
for name in sys.argv[1:]:
    try:
        print(f"{name} {version(name)}")
    except PackageNotFoundError:
        pass
"""


def versions(bench_py: Path) -> str:
    """redis-server's, and the packages' of both venvs."""
    found = [
        subprocess.run(
            [str(py), "-c", VERSIONS, *names],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split("\n")
        for py, names in (
            (bench_py, ("aws-lambda-powertools", "redis", "boto3")),
            (Path(sys.executable), ("effectd", "grpcio", "lmdb")),
        )
    ]
    server = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True, check=False
    ).stdout.split(" sha=")[0]
    return ", ".join([server, *(n for names in found for n in names if n)])


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return (
        f"{os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def load_average() -> float:
    """The 1-minute load average: the work of others on a shared machine."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def fdatasync_ms(directory: Path, n: int = 200) -> tuple[float, float]:
    """p50 and p99 of a 128 B append + fdatasync there: what a durable write
    costs on this disk, for AOF and LMDB alike."""
    path = directory / "fsync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    took = []
    try:
        for _ in range(n):
            start = time.perf_counter()
            os.write(fd, b"x" * 128)
            os.fdatasync(fd)
            took.append((time.perf_counter() - start) * 1e3)
    finally:
        os.close(fd)
        path.unlink()
    took.sort()
    return peer_stats.percentile(took, 0.5), peer_stats.percentile(took, 0.99)


def measure(
    args: argparse.Namespace, bench_py: Path, work: Path
) -> tuple[list[dict[str, Any]], float, float, Path | None]:
    """Every run of every configuration; returns (records, RSS idle MB,
    peak RSS under 32 callers MB, the profile's file)."""
    records: list[dict[str, Any]] = []
    with (
        redis(work / "redis") as (redis_at, redis_pid),
        effectd(work / "effectd") as daemon,
    ):
        effectd_at, pid = daemon
        servers = {"effectd": pid, "powertools": redis_pid}
        peers = {
            "effectd": Peer("effectd", Path(sys.executable), effectd_at),
            "powertools": Peer("powertools", bench_py, redis_at),
        }
        time.sleep(1.0)  # the daemon settles after start-up
        idle, loaded = rss_mb(pid), 0.0
        for run in range(1, args.runs + 1):
            order = peer_stats.PEERS if run % 2 else peer_stats.PEERS[::-1]
            for callers in peer_stats.CALLERS:
                ops = args.ops_1 if callers == 1 else args.ops_32
                for name in order:
                    tag = f"r{run}-c{callers}-{time.time_ns()}"
                    load = load_average()
                    server = ServerCpu(servers[name])
                    with PeakRss(pid) as peak:
                        result = harness(
                            peers[name], callers, ops, tag=tag, on_mark=server.on_mark
                        )
                    if name == "effectd" and callers > 1:
                        loaded = max(loaded, peak.peak)
                    for phase, numbers in result.items():
                        at = {
                            "run": run,
                            "peer": name,
                            "callers": callers,
                            "load": load,
                        }
                        numbers["server_cpu_ms"] = server.per_call(phase, callers * ops)
                        records.append({**at, "phase": phase, **numbers})
                        log(progress(records[-1]))
        profile = None
        if args.profile:
            profile = work / "profile.txt"
            profiler = Profiler(bench_py.parent / "py-spy", pid, profile)
            log(f"profiling the daemon (pid {pid}), 32 procs, first phase")
            tag = f"profile-{time.time_ns()}"
            try:
                harness(
                    peers["effectd"],
                    32,
                    args.profile,
                    tag=tag,
                    on_mark=profiler.on_mark,
                )
            finally:
                profiler.stop()
    return records, idle, loaded, profile


def progress(r: dict[str, Any]) -> str:
    head = f"run {r['run']} {r['peer']:<10} {r['callers']:>2} callers {r['phase']:<5}"
    if not r.get("valid"):
        return f"{head} INVALID: {r.get('problem', '')}"
    return (
        f"{head} {r['calls_s']:8.0f} calls/s  p50 {r['p50_ms']:6.2f} ms  "
        f"p99 {r['p99_ms']:6.2f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    ensure_redis_server()
    args.state.mkdir(parents=True, exist_ok=True)
    bench_py = ensure_venv(args.venv)
    last = args.state / "last"
    shutil.rmtree(last, ignore_errors=True)
    last.mkdir()
    about = machine()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="effectd-peers-") as tmp:
        fsync_p50, fsync_p99 = fdatasync_ms(Path(tmp))
        records, idle, loaded, profile = measure(args, bench_py, Path(tmp))
        if profile is not None and profile.exists():
            shutil.copy(profile, last / "profile.txt")
    elapsed = time.monotonic() - began
    results = last / "results.json"
    meta = {"machine": about, "versions": versions(bench_py), "runs": args.runs}
    meta |= {"ops_1": args.ops_1, "ops_32": args.ops_32, "rss_idle_mb": idle}
    meta |= {"rss_loaded_mb": loaded, "seconds": round(elapsed)}
    meta |= {"fdatasync_ms": [round(fsync_p50, 3), round(fsync_p99, 3)]}
    loads = [r["load"] for r in records if "load" in r]
    meta |= {"load": [min(loads, default=0.0), max(loads, default=0.0)]}
    results.write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    report(meta, records, last / "profile.txt", markdown=args.markdown)
    plot = subprocess.run(
        [str(bench_py), str(HERE / "peer_plot.py"), str(results), str(args.plot)],
        check=False,
    )
    print(f"plot: {args.plot}" if plot.returncode == 0 else "the plot failed")
    print(f"results: {results}")
    return 0 if all(r.get("valid") for r in records) else 1


def report(
    meta: dict[str, Any],
    records: list[dict[str, Any]],
    profile: Path,
    *,
    markdown: bool,
) -> None:
    rows = peer_stats.rows(records)
    print(
        f"\neffectd vs Powertools + Redis (AOF, appendfsync always); {meta['machine']}"
    )
    print(meta["versions"])
    print(
        "fdatasync of a 128 B append in the temporary directory: p50 "
        f"{meta['fdatasync_ms'][0]:.3f} ms, p99 {meta['fdatasync_ms'][1]:.3f} ms; "
        f"1-minute load average before each configuration: {meta['load'][0]:.1f}"
        f" to {meta['load'][1]:.1f} (others' work on this machine)"
    )
    print(
        f"median of {meta['runs']} interleaved runs, [min-max] for calls/s and the "
        f"same-run ratio; p50/p99 per call in ms; keys per phase: {meta['ops_1']} "
        f"(1 caller), 32 x {meta['ops_32']} (32 procs); {meta['seconds']} s\n"
    )
    print(peer_stats.table(rows, markdown=markdown))
    print(
        "\nCPU ms per call (medians): the server's (effectd's daemon, "
        "redis-server) and the callers' (every caller process, summed)"
    )
    print(peer_stats.cpu_table(records, markdown=markdown))
    print(
        f"\ndaemon RSS: {meta['rss_idle_mb']:.1f} MB idle, "
        f"{meta['rss_loaded_mb']:.1f} MB peak under 32 procs"
    )
    print("targets (issue 27; reported, not asserted):")
    cpu = peer_stats.daemon_cpu(records)
    for t in peer_stats.targets(rows, meta["rss_idle_mb"], meta["rss_loaded_mb"], cpu):
        print(f"  {t.show()}")
    for r in records:
        if not r.get("valid"):
            print(
                f"INVALID: {r['peer']}, {r['callers']} callers, {r['phase']}: "
                f"{r.get('problem')}"
            )
    if profile.exists():
        p = peer_stats.top_frames(profile.read_text().splitlines())
        print(
            f"\nwhere the daemon's time goes ({p.samples} samples, py-spy, non-idle):"
        )
        for title, shares in (
            ("threads", p.threads),
            ("self time", p.self_time),
            ("total time, the daemon's functions", p.own_code),
        ):
            print(f"  {title}:")
            for frame, share in shares:
                print(f"    {share:6.1%}  {frame}")


if __name__ == "__main__":
    raise SystemExit(main())
