"""The daemon's instructions and CPU time per safe call, first and duplicate:
the steady A/B of effectd's own work per call.

    .venv/bin/python bench/hotpath_instructions.py --tree before=/path/to/main \
        --tree after=. --ops 200

Each tree (a checkout of this repository) gets its own daemon on its
defaults (LMDB, fsync on, Unix socket; `hotpath.daemon`), and one caller,
the Python client's safe tool call of `bench/peer_harness.py` (that tree's
client), drives it through the whole request boundary: gRPC's session
stream, the servicers, the services, the store. Two measurements per tree,
one after the other:

  instructions  the daemon under `valgrind --tool=callgrind
                --instr-atstart=no`: instrumentation is switched on after
                the warm-up, the counters are zeroed (`callgrind_control
                -z`) before each phase and dumped (`-d`) after it, every
                thread summed; the caller waits for each before it goes
                on. Instruction counts do not depend on the machine's load
                (two runs of one tree agree to ~0.1%); they do not see
                syscalls, thread switches or cache misses.
  CPU           the daemon on its own, user + system CPU seconds from
                /proc/<pid>/stat over each phase (--cpu-ops calls), which
                does see them, and which a shared machine disturbs more.

With `--postgres SERVER` each daemon runs on a new database of that
PostgreSQL server instead (its schema made by that tree's `effectd
migrate`; dropped after): the store's own work per call, in the daemon.

Phases: `first` --ops new keys (claimed, the body runs, the result is
committed and acknowledged: two session messages), then `dup` the same keys
again (the stored result from a read: one message). One caller, so a group
commit holds one call; at 32 callers the loop's and gRPC's work per message
is the same, the commits shared. Everything started is stopped by its PID.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hotpath

HERE = Path(__file__).resolve().parent
PHASES = ("first", "dup")
VALGRIND_START_S = 300.0


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", action="append", required=True, help="NAME=PATH")
    p.add_argument("--ops", type=int, default=200, help="calls per phase, counted")
    p.add_argument("--cpu-ops", type=int, default=1000, help="calls per phase, CPU")
    p.add_argument("--warm", type=int, default=30, help="warm-up keys (twice each)")
    p.add_argument("--no-cpu", action="store_true", help="instructions only")
    p.add_argument("--no-instructions", action="store_true", help="CPU only")
    p.add_argument("--keep", type=Path, help="keep the callgrind dumps here")
    p.add_argument("--json", type=Path, help="write the numbers here")
    p.add_argument(
        "--postgres",
        metavar="URL",
        help="each daemon on a new database of this PostgreSQL server",
    )
    return p.parse_args(argv)


# -- the caller: a child process importing the tree's client ---------------


def caller_main(target: str, ops: int, warm: int, tag: str) -> int:
    """Warm-up, then each phase between a `ready`/`go` and a `done`/`go`
    exchange with the parent on stdin/stdout."""
    sys.path.insert(0, str(HERE))
    import peer_harness  # noqa: PLC0415

    ran: Counter[int] = Counter()
    call = peer_harness.effectd_caller(target, tag, 0, ran)
    for i in range(peer_harness.WARM_KEY, peer_harness.WARM_KEY + warm):
        call(i)
        call(i)
    for phase in PHASES:
        print(f"ready {phase}", flush=True)
        sys.stdin.readline()
        for i in range(ops):
            call(i)
        print(f"done {phase}", flush=True)
        sys.stdin.readline()
        want = 1
        wrong = [i for i in range(ops) if ran[i] != want]
        if wrong:
            print(f"invalid {phase}: {len(wrong)} keys ran other than once")
            return 1
    print("ok", flush=True)
    return 0


# -- the parent -------------------------------------------------------------


@contextlib.contextmanager
def store_flags(tree: Path, server: str | None) -> Iterator[tuple[str, ...]]:
    """The daemon's store flags: none (LMDB in its data directory), or a new
    database of `server`, migrated by `tree`, dropped after."""
    if server is None:
        yield ()
        return
    from databases import scratch, url_of  # noqa: PLC0415 - psycopg

    with scratch(server, "effectd_instr") as name:
        url = url_of(server, name)
        subprocess.run(
            [sys.executable, "-m", "sidecar", "migrate", "--store", url],
            check=True,
            cwd=tree,
            env=hotpath.tree_env(tree),
            stdout=subprocess.DEVNULL,
            timeout=120,
        )
        yield ("--store", url)


def control(pid: int, *args: str) -> None:
    subprocess.run(
        ["callgrind_control", *args, str(pid)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=600,
    )


def totals(path: Path) -> int:
    """The instruction count of one callgrind dump."""
    for line in path.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def drive(tree: Path, target: str, *, ops: int, warm: int, on: Any) -> dict[str, Any]:
    """Runs the caller; `on(event, phase)` at each phase's edges."""
    argv = [sys.executable, __file__, "--caller", target, str(ops), str(warm)]
    argv.append(f"t{time.time_ns()}")
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=hotpath.tree_env(tree),
        start_new_session=True,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    out: dict[str, Any] = {}
    try:
        for line in proc.stdout:
            event, _, phase = line.strip().partition(" ")
            if event in {"ready", "done"}:
                got = on(event, phase)
                if got is not None:
                    out[phase] = got
                proc.stdin.write("go\n")
                proc.stdin.flush()
            elif event in {"invalid", "ok"}:
                out["valid"] = event == "ok"
        proc.wait(hotpath.RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out.setdefault("valid", False)
    return out


def instructions(tree: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    dumps = work / "callgrind"
    dumps.mkdir()
    wrapper = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
    wrapper += [f"--callgrind-out-file={dumps}/callgrind.out"]
    with (
        store_flags(tree, args.postgres) as flags,
        hotpath.daemon(
            tree,
            work / "daemon",
            wrapper=wrapper,
            start_timeout=VALGRIND_START_S,
            flags=flags,
        ) as (target, pid),
    ):
        seen: list[Path] = []

        def on(event: str, phase: str) -> int | None:
            if event == "ready":
                control(pid, "-i", "on")
                control(pid, "-z")
                return None
            before = set(dumps.iterdir())
            control(pid, "-d", phase)
            control(pid, "-i", "off")
            new = sorted(set(dumps.iterdir()) - before)
            seen.extend(new)
            return sum(totals(p) for p in new)

        got = drive(tree, target, ops=args.ops, warm=args.warm, on=on)
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            for p in seen:
                dest = args.keep / f"{tree.name}-{p.name}"
                dest.write_bytes(p.read_bytes())
    return {
        "valid": got["valid"],
        **{ph: got[ph] / args.ops for ph in PHASES if ph in got},
    }


def cpu(tree: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    with (
        store_flags(tree, args.postgres) as flags,
        hotpath.daemon(tree, work / "daemon-cpu", flags=flags) as (target, pid),
    ):
        time.sleep(1.0)
        start: dict[str, tuple[float, float]] = {}

        def on(event: str, phase: str) -> dict[str, float] | None:
            now = hotpath.cpu_seconds(pid)
            if event == "ready":
                start[phase] = now
                return None
            user = now[0] - start[phase][0]
            system = now[1] - start[phase][1]
            return {
                "cpu_ms": 1000 * (user + system) / args.cpu_ops,
                "sys_ms": 1000 * system / args.cpu_ops,
            }

        return drive(tree, target, ops=args.cpu_ops, warm=args.warm, on=on)


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--caller"]:
        target, ops, warm, tag = sys.argv[2:6]
        return caller_main(target, int(ops), int(warm), tag)
    args = parse(argv)
    trees = {
        name: Path(path).resolve()
        for name, path in (t.split("=", 1) for t in args.tree)
    }
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="effectd-instr-") as tmp:
        for name, tree in trees.items():
            work = Path(tmp) / name
            work.mkdir()
            row: dict[str, Any] = {}
            if not args.no_instructions:
                row["instructions"] = instructions(tree, work, args)
            if not args.no_cpu:
                row["cpu"] = cpu(tree, work, args)
            results[name] = row
            print(name, json.dumps(row), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    report(results)
    return 0 if all(_valid(r) for r in results.values()) else 1


def _valid(row: dict[str, Any]) -> bool:
    return all(part.get("valid", False) for part in row.values())


def report(results: dict[str, dict[str, Any]]) -> None:
    base = next(iter(results))
    print(
        f"\n{'tree':>10} {'phase':>5} {'instr/call':>12} {'vs ' + base:>9} "
        f"{'CPU ms/call':>12} {'(sys)':>6}"
    )
    for name, row in results.items():
        for phase in PHASES:
            instr = row.get("instructions", {}).get(phase, float("nan"))
            base_instr = results[base].get("instructions", {}).get(phase)
            ratio = f"x{instr / base_instr:.3f}" if base_instr else ""
            c = row.get("cpu", {}).get(phase, {})
            print(
                f"{name:>10} {phase:>5} {instr:12,.0f} {ratio:>9} "
                f"{c.get('cpu_ms', float('nan')):12.3f} "
                f"{c.get('sys_ms', float('nan')):6.3f}"
            )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
