"""The database restarted under load (issue 14, "Faults"): daemon processes
on a private PostgreSQL cluster serve agent processes doing safe tool calls
(each execution appends a line to a side-effect file) while the cluster is
stopped, fast and immediate, and started again, several times, and the
daemons' connections are terminated (`pg_terminate_backend`) between.

Checked: every call the safe call acknowledged is COMMITTED with exactly the
bytes handed back, which are those of its one execution; no call executed
twice; every error a client saw is UNAVAILABLE / STORAGE_UNAVAILABLE with
`mayHaveBeenApplied`; the daemons serve again after each restart (new
executions follow it) and answer a fresh call at the end. The negative
control, a daemon that answers before COMMIT
(`tests.support.pg_ack_before_commit`) on a database of its own, serves its
own agents under the same faults in the same test: the same check must
catch it. Beside them, the same daemons reaching the cluster through
PgBouncer in transaction mode (`tests.support.pgbouncer`), on a database of
their own: PgBouncer stays up while the cluster goes away and comes back.

A private cluster (`tests.support.pg_cluster`), never the shared server
other tests use; it fails, never skips, when it cannot be started.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from effectd_client import Client, Run, State
from sidecar.storage.postgres import schema as pg_schema
from tests.support import pgbouncer
from tests.support.pg_cluster import PrivateCluster, private_cluster
from tests.support.processes import ROOT, DaemonProcess

pytestmark = pytest.mark.slow

DAEMONS = 2
CLIENTS_PER_DAEMON = 2
# New executions awaited after each fault: the daemons serve again.
PROGRESS = 3
FAULTS = ("terminate", "fast", "terminate", "immediate", "fast", "immediate")


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    with private_cluster() as c:
        yield c


@dataclass
class Outcome:
    acknowledged: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    unclassified: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    stalled: list[str] = field(default_factory=list)
    fresh: list[str] = field(default_factory=list)


def _database(cluster: PrivateCluster, name: str) -> str:
    with cluster.connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = cluster.url.rsplit("/", 1)[0] + "/" + name
    pg_schema.migrate_url(url)
    return url


def _executions(effects: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    if effects.exists():
        for line in effects.read_text().splitlines():
            call_id, token = line.split()
            found.setdefault(call_id, []).append(token)
    return found


def _lines(effects: Path) -> int:
    return len(effects.read_bytes().splitlines()) if effects.exists() else 0


def _wait_for_progress(
    effects: Path, since: int, progress: int = PROGRESS, bound: float = 60.0
) -> bool:
    """Whether `progress` more executions happened within `bound` seconds."""
    end = time.monotonic() + bound
    while time.monotonic() < end:
        if _lines(effects) >= since + progress:
            return True
        time.sleep(0.05)
    return False


def _fault(cluster: PrivateCluster, kind: str) -> None:
    """Every daemon connection ended (`pg_terminate_backend`), or the
    cluster stopped in the mode `kind` and started again."""
    if kind == "terminate":
        cluster.terminate("effectd")
    elif kind in ("fast", "immediate"):
        cluster.restart("fast" if kind == "fast" else "immediate")
    else:
        raise AssertionError(kind)


def _check(
    outcome: Outcome, target: str, effects: Path, reports: list[dict[str, Any]]
) -> None:
    executions = _executions(effects)
    outcome.twice = sorted(c for c, tokens in executions.items() if len(tokens) > 1)
    with Client(target, timeout=60) as client:
        for report in reports:
            outcome.errors.update(report["errors"])
            outcome.unclassified += report["unclassified"]
            for call_id, handed in report["acknowledged"].items():
                outcome.acknowledged += 1
                run_id = "run-" + call_id.rsplit("-", 1)[0]
                call = client.get_tool_call(run_id, call_id)
                tokens = executions.get(call_id, [])
                if (
                    call.state is not State.COMMITTED
                    or call.result is None
                    or call.result.raw != handed.encode()
                    or [f"{call_id}:{t}" for t in tokens] != [handed]
                ):
                    outcome.lost.append(f"{call_id}: {call.state.name}, {tokens}")


def _fresh_call(target: str, effects: Path, name: str) -> str:
    """A new safe call on a daemon, after the faults: '' if it executed and
    committed, else what went wrong."""
    with Client(target, timeout=60) as client:
        run = Run(client, "run-fresh")
        try:
            with run.call("send", {"id": name}, call_id=name, raw=True) as step:
                assert step.execute
                with effects.open("a") as f:
                    f.write(f"{name} fresh\n")
                step.set_result(f"{name}:fresh".encode())
        except Exception as exc:  # what is reported, not raised
            return f"{name}: {exc!r}"
    return ""


@dataclass
class Ledger:
    """Daemons of `module` on a database of their own, their agents, and
    what came of them."""

    name: str
    module: str
    daemons: int
    tmp: Path
    url: str = ""
    # Reached through this PgBouncer (None: directly).
    bouncer: pgbouncer.Bouncer | None = None
    # New executions awaited after each fault before the next.
    progress: int = PROGRESS
    processes: list[DaemonProcess] = field(default_factory=list)
    clients: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    outcome: Outcome = field(default_factory=Outcome)

    @property
    def effects(self) -> Path:
        return self.tmp / "effects"


def _start_daemons(stack: ExitStack, ledgers: Sequence[Ledger]) -> None:
    """Every ledger's daemon processes, started at once; each closed by
    `stack`."""
    with ThreadPoolExecutor(sum(ledger.daemons for ledger in ledgers)) as pool:
        starting = [
            (
                ledger,
                pool.submit(
                    DaemonProcess,
                    ledger.tmp / f"d{d}",
                    ledger.module,
                    ("--store", ledger.url, "--settle-interval", "1"),
                ),
            )
            for ledger in ledgers
            for d in range(ledger.daemons)
        ]
        for _, future in starting:
            with suppress(Exception):
                stack.callback(future.result().close)
    for ledger, future in starting:
        ledger.processes.append(future.result())


def _start_clients(stack: ExitStack, ledger: Ledger, stop: Path) -> None:
    for d, daemon in enumerate(ledger.processes):
        for c in range(CLIENTS_PER_DAEMON):
            prefix = f"d{d}c{c}"
            argv = [
                *(sys.executable, "-m", "tests.support.pg_load_client"),
                *(daemon.target, prefix, str(ledger.effects), str(stop)),
                str(ledger.tmp / f"{prefix}.json"),
            ]
            proc = subprocess.Popen(argv, cwd=ROOT)
            stack.callback(proc.kill)
            ledger.clients.append((prefix, proc))


def _finish(ledger: Ledger) -> None:
    """Collects the agents' reports, makes a fresh call on each daemon,
    checks the ledger against them; stops the daemons."""
    reports = []
    for prefix, proc in ledger.clients:
        try:
            code = proc.wait(timeout=150)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # its stacks, on the test's stderr
            time.sleep(1)
            logs = "\n".join(d.log()[-4000:] for d in ledger.processes)
            raise AssertionError(f"client {prefix} did not finish\n{logs}") from None
        assert code == 0, f"client {prefix} failed"
        reports.append(json.loads((ledger.tmp / f"{prefix}.json").read_text()))
    outcome = ledger.outcome
    for d, daemon in enumerate(ledger.processes):
        assert daemon.proc.poll() is None, daemon.log()
        outcome.fresh.append(_fresh_call(daemon.target, ledger.effects, f"fresh-{d}"))
    _check(outcome, ledger.processes[0].target, ledger.effects, reports)
    for daemon in ledger.processes:
        daemon.terminate()
    print(
        f"{ledger.name}: acknowledged {outcome.acknowledged}, "
        f"errors {dict(outcome.errors)}, lost {len(outcome.lost)}, "
        f"twice {len(outcome.twice)}, stalled after {outcome.stalled}"
    )


def _under_faults(
    cluster: PrivateCluster, ledgers: Sequence[Ledger], seed: int
) -> list[str]:
    """The agents of every ledger at work while FAULTS hit the cluster;
    returns the faults made."""
    rng = random.Random(seed)  # noqa: S311 - when each fault lands
    print(f"seed {seed}")
    stop = ledgers[0].tmp.parent / "stop"
    made = []
    with ExitStack() as stack:
        for ledger in ledgers:
            ledger.tmp.mkdir()
            suffix = ledger.tmp.parent.name.replace("-", "_")
            ledger.url = _database(cluster, f"{ledger.name}_{suffix}")
            if ledger.bouncer is not None:
                ledger.url = pgbouncer.through(ledger.url, ledger.bouncer)
        _start_daemons(stack, ledgers)
        for ledger in ledgers:
            _start_clients(stack, ledger, stop)
        for ledger in ledgers:
            assert _wait_for_progress(ledger.effects, 0), f"{ledger.name}: no call ran"
        for kind in FAULTS:
            time.sleep(rng.uniform(0.1, 0.6))
            before = [_lines(ledger.effects) for ledger in ledgers]
            _fault(cluster, kind)
            made.append(kind)
            for ledger, lines in zip(ledgers, before, strict=True):
                if not _wait_for_progress(ledger.effects, lines, ledger.progress):
                    ledger.outcome.stalled.append(kind)
        stop.touch()
        # The ledgers are independent: their agents end, and their checks
        # run, side by side.
        with ThreadPoolExecutor(len(ledgers)) as pool:
            for finished in [pool.submit(_finish, ledger) for ledger in ledgers]:
                finished.result()
    return made


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_restarts_lose_no_commit_and_execute_nothing_twice(
    cluster: PrivateCluster, short_tmp: Path
) -> None:
    """Directly and through PgBouncer; with, beside them under the same
    faults, the negative control: a daemon answering before COMMIT
    (`tests.support.pg_ack_before_commit`) on a database of its own, which
    the same check must catch."""
    with pgbouncer.bouncer("127.0.0.1", cluster.port) as bouncer:
        sound = Ledger("sound", "sidecar", DAEMONS, short_tmp / "sound")
        pooled = Ledger(
            "pooled", "sidecar", DAEMONS, short_tmp / "pooled", bouncer=bouncer
        )
        # The control is back at work after each fault once one more call
        # executed (its agents call without a pause, each write of its daemon
        # held open for the window, where the next fault lands); three, at
        # its pace, took it seconds a fault.
        broken = Ledger(
            "broken",
            "tests.support.pg_ack_before_commit",
            1,
            short_tmp / "broken",
            progress=1,
        )
        seed = random.randrange(1 << 32)  # noqa: S311 - a test seed
        ledgers = [sound, pooled, broken]
        assert _under_faults(cluster, ledgers, seed) == list(FAULTS)
    for outcome in (sound.outcome, pooled.outcome):
        assert outcome.lost == []
        assert outcome.twice == []
        assert outcome.unclassified == []
        assert outcome.stalled == []
        assert outcome.fresh == [""] * DAEMONS
        assert outcome.acknowledged > 0
    # The negative control.
    assert broken.outcome.lost != [] or broken.outcome.twice != []
