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
control is a daemon that answers before COMMIT
(`tests.support.pg_ack_before_commit`): the same check catches it.

A private cluster (`tests.support.pg_cluster`), never the shared server
other tests use; it fails, never skips, when it cannot be started.
"""

from __future__ import annotations

import json
import random
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
from sidecar.storage import pg_schema
from tests.support.pg_cluster import PrivateCluster, private_cluster
from tests.support.processes import ROOT, DaemonProcess

DAEMONS = 2
CLIENTS_PER_DAEMON = 2
# New executions awaited after each fault: the daemons serve again.
PROGRESS = 3
FAULTS = ("terminate", "fast", "terminate", "immediate", "fast", "immediate")
CONTROL_FAULTS = ("terminate", "immediate")


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    with private_cluster() as c:
        yield c


@dataclass
class Outcome:
    faults: list[str] = field(default_factory=list)
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


def _wait_for_progress(effects: Path, since: int, bound: float = 60.0) -> bool:
    """Whether PROGRESS more executions happened within `bound` seconds."""
    end = time.monotonic() + bound
    while time.monotonic() < end:
        if _lines(effects) >= since + PROGRESS:
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


def _start_daemons(
    stack: ExitStack, tmp: Path, module: str, args: Sequence[str]
) -> list[DaemonProcess]:
    """DAEMONS daemon processes, started at once; each closed by `stack`."""
    with ThreadPoolExecutor(DAEMONS) as pool:
        starting = [
            pool.submit(DaemonProcess, tmp / f"d{d}", module, args)
            for d in range(DAEMONS)
        ]
        for future in starting:
            with suppress(Exception):
                stack.callback(future.result().close)
    return [future.result() for future in starting]


def _under_faults(
    cluster: PrivateCluster, tmp: Path, module: str, faults: Sequence[str], seed: int
) -> Outcome:
    rng = random.Random(seed)  # noqa: S311 - when each fault lands
    url = _database(cluster, f"restart_{tmp.name.replace('-', '_')}")
    effects, stop = tmp / "effects", tmp / "stop"
    args = ("--store", url, "--settle-interval", "1")
    outcome = Outcome()
    with ExitStack() as stack:
        daemons = _start_daemons(stack, tmp, module, args)
        clients = []
        for d in range(DAEMONS):
            for c in range(CLIENTS_PER_DAEMON):
                prefix = f"d{d}c{c}"
                argv = [
                    *(sys.executable, "-m", "tests.support.pg_load_client"),
                    *(daemons[d].target, prefix, str(effects), str(stop)),
                    str(tmp / f"{prefix}.json"),
                ]
                proc = subprocess.Popen(argv, cwd=ROOT)
                stack.callback(proc.kill)
                clients.append((prefix, proc))
        assert _wait_for_progress(effects, 0), "no call executed before the faults"
        for kind in faults:
            time.sleep(rng.uniform(0.1, 0.6))
            before = _lines(effects)
            _fault(cluster, kind)
            outcome.faults.append(kind)
            if not _wait_for_progress(effects, before):
                outcome.stalled.append(kind)
        stop.touch()
        reports = []
        for prefix, proc in clients:
            assert proc.wait(timeout=150) == 0, f"client {prefix} failed"
            reports.append(json.loads((tmp / f"{prefix}.json").read_text()))
        for d, daemon in enumerate(daemons):
            assert daemon.proc.poll() is None, daemon.log()
            outcome.fresh.append(_fresh_call(daemon.target, effects, f"fresh-{d}"))
        _check(outcome, daemons[0].target, effects, reports)
        for daemon in daemons:
            daemon.terminate()
    print(
        f"seed {seed}: faults {outcome.faults}, acknowledged {outcome.acknowledged}, "
        f"errors {dict(outcome.errors)}, lost {len(outcome.lost)}, "
        f"twice {len(outcome.twice)}"
    )
    return outcome


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_restarts_lose_no_commit_and_execute_nothing_twice(
    cluster: PrivateCluster, short_tmp: Path
) -> None:
    seed = random.randrange(1 << 32)  # noqa: S311 - a test seed
    outcome = _under_faults(cluster, short_tmp, "sidecar", FAULTS, seed)
    assert outcome.faults == list(FAULTS)
    assert outcome.lost == []
    assert outcome.twice == []
    assert outcome.unclassified == []
    assert outcome.stalled == []
    assert outcome.fresh == [""] * DAEMONS
    assert outcome.acknowledged > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_negative_control_an_answer_before_commit_is_caught(
    cluster: PrivateCluster, short_tmp: Path
) -> None:
    seed = random.randrange(1 << 32)  # noqa: S311 - a test seed
    outcome = _under_faults(
        cluster, short_tmp, "tests.support.pg_ack_before_commit", CONTROL_FAULTS, seed
    )
    assert outcome.lost != [] or outcome.twice != []
