"""The crash loop: a real daemon and agent processes on one store, killed
with SIGKILL at random moments and started again, checked after every cycle.

A cycle waits a random delay while the agents work, then kills either the
daemon (and starts it again on the same data) or one agent (and starts it
again on its run, which it resumes), or on PostgreSQL ends the daemon's
database connections (`pg_terminate_backend`), or restarts the database
server itself and waits for the daemon to serve again
(`tests.torture.crash_database`); then `crash_checks.Checker` compares the
store with the side-effect counter and the acknowledgement log the agents
wrote. On LMDB, the data files left by each daemon kill are also checked
(`lmdb_consistency`) before the daemon starts again.

Every process comes from a fork server that imported the daemon and the
client once (`multiprocessing`'s "forkserver": a clean process, no gRPC
state, forked per child), so a cycle costs a fork and the daemon's own
start, not an interpreter's start-up: hundreds of cycles fit in a test.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import lmdb
import lmdb.verify

from effectd_client import Client, EffectdError
from tests.torture import crash_agent
from tests.torture.crash_checks import Checker, Figures
from tests.torture.crash_database import DatabaseRestarts, RestartDatabase

# What a daemon's start would import (httpcore and h2 come with its provider
# transport, the PostgreSQL store on its first use): imported once, in the
# fork server.
PRELOAD = [
    "sidecar.cli",
    "sidecar.server",
    "sidecar.storage.postgres.store",
    "httpcore",
    "h2.connection",
    "effectd_client",
    "tests.torture.crash_broken",
    "tests.torture.crash_agent",
    "tests.torture.crash_loop",
]
READY_SECONDS = 60.0
# On PostgreSQL, the share of cycles that restart the database server.
RESTART_SHARE = 0.125
CHECK_TRIES = 50


def _redirect(log: Path) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)


def serve(argv: list[str], log: Path, ack_before_commit: bool) -> None:
    """A daemon child: `effectd serve` as the program runs it.
    `ack_before_commit`: BROKEN on purpose (`tests.torture.crash_broken`,
    a test module never installed)."""
    _redirect(log)
    # The daemon makes no outbound call here: its provider transport gets an
    # empty trust store instead of loading the system's (a third of a start).
    os.environ.pop("SSL_CERT_FILE", None)
    os.environ["SSL_CERT_DIR"] = str(log.parent / "no-certs")
    from sidecar import cli, server  # noqa: PLC0415 - preloaded, in the child
    from tests.torture import crash_broken as broken  # noqa: PLC0415

    daemon: type[server.Daemon] = server.Daemon
    if ack_before_commit and "--store" in argv:
        daemon = broken.AckBeforeCommitPgDaemon
    elif ack_before_commit:
        daemon = broken.AckBeforeCommitDaemon
    raise SystemExit(cli.main(argv, daemon_class=daemon))


def forkserver() -> multiprocessing.context.ForkServerContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


@dataclass(frozen=True, slots=True)
class LoopSpec:
    """One loop: its store, its size, and the broken parts of a control."""

    workdir: Path
    seed: int
    cycles: int
    store_url: str | None = None
    agents: int = 3
    calls_per_run: int = 6
    # Kill delays, seconds (uniform): short, so most kills land mid-call.
    delay: tuple[float, float] = (0.02, 0.3)
    # Every n-th check lists every record, not only the runs just active.
    full_check_every: int = 25
    ack_before_commit: bool = False
    reexecute_unknown: bool = False
    # Stop at the first cycle whose check fails (the controls).
    stop_on_violation: bool = False
    # On PostgreSQL: ends the daemon's database connections
    # (`pg_terminate_backend`); some cycles do that instead of a kill.
    drop_connections: Callable[[], int] | None = None
    # On PostgreSQL: stops the database server and starts it again; this
    # share of the cycles, at places drawn from the seed, do that.
    restart_database: RestartDatabase | None = None
    restart_share: float = RESTART_SHARE
    # How long the database stays away in a long outage, seconds; None: no
    # long outages (`crash_database.LONG_SHARE`).
    long_outage: tuple[float, float] | None = None


@dataclass(slots=True)
class AgentSlot:
    run_id: str
    process: multiprocessing.process.BaseProcess
    killed: bool = False


@dataclass(slots=True)
class Outcome:
    figures: Figures
    violations: list[str] = field(default_factory=list)
    # The cycle of the first violation (1-based), 0 if none.
    caught_at: int = 0


class Loop:
    def __init__(self, spec: LoopSpec) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)  # noqa: S311 - when to kill
        self.ctx = forkserver()
        self.data = spec.workdir / "data"
        self.data.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.target = f"unix:{self.data / 'effectd.sock'}"
        self.counter = spec.workdir / "counter.log"
        self.acks = spec.workdir / "acks.log"
        self.logs = spec.workdir / "logs"
        self.logs.mkdir(exist_ok=True)
        (spec.workdir / "no-certs").mkdir(exist_ok=True)
        self.daemon: multiprocessing.process.BaseProcess | None = None
        self.daemon_log = spec.workdir / "daemon.log"
        self.agents: list[AgentSlot] = []
        self.runs = 0
        self.checker = Checker(self.counter, self.acks)
        self.figures = self.checker.figures
        self.database: DatabaseRestarts | None = None
        self.restart_cycles: set[int] = set()
        if spec.restart_database is not None:
            self.database = DatabaseRestarts(
                spec.restart_database,
                self.target,
                self.rng,
                self.figures,
                spec.long_outage,
            )
            count = round(spec.cycles * spec.restart_share)
            self.restart_cycles = set(self.rng.sample(range(1, spec.cycles + 1), count))

    # -- processes -----------------------------------------------------------

    def start_daemon(self) -> None:
        argv = ["serve", "--data-dir", str(self.data)]
        if self.spec.store_url is not None:
            argv += ["--store", self.spec.store_url]
        self.daemon_log.touch()
        offset = self.daemon_log.stat().st_size
        self.daemon = self.ctx.Process(
            target=serve, args=(argv, self.daemon_log, self.spec.ack_before_commit)
        )
        self.daemon.start()
        give_up = time.monotonic() + READY_SECONDS
        while True:
            with self.daemon_log.open("rb") as f:
                f.seek(offset)
                if b" ready on " in f.read():
                    return
            if not self.daemon.is_alive() or time.monotonic() > give_up:
                raise RuntimeError(
                    f"daemon not ready (exit {self.daemon.exitcode}): "
                    + self.daemon_log.read_text(errors="replace")[-4000:]
                )
            time.sleep(0.005)

    def kill_daemon(self) -> None:
        assert self.daemon is not None
        self.daemon.kill()
        self.daemon.join(30)
        self.checker.killed_ns = time.time_ns()
        self.figures.daemon_kills += 1

    def start_agent(self, run_id: str, *, resumed: bool) -> AgentSlot:
        spec = crash_agent.AgentSpec(
            target=self.target,
            run_id=run_id,
            calls=self.spec.calls_per_run,
            counter=str(self.counter),
            acks=str(self.acks),
            log=str(self.logs / f"{run_id}.log"),
            resumed=resumed,
            reexecute_unknown=self.spec.reexecute_unknown,
        )
        process = self.ctx.Process(target=crash_agent.main, args=(spec,))
        process.start()
        return AgentSlot(run_id, process)

    def new_run(self) -> AgentSlot:
        self.runs += 1
        self.figures.runs += 1
        return self.start_agent(f"r{self.runs}", resumed=False)

    def refill(self) -> list[str]:
        """Replaces each agent whose run ended; an agent that failed on its
        own (not killed) is a violation, with its log."""
        found = []
        for i, slot in enumerate(self.agents):
            if slot.process.is_alive():
                continue
            slot.process.join(30)
            if slot.process.exitcode != 0:
                log = (self.logs / f"{slot.run_id}.log").read_text(errors="replace")
                found.append(
                    f"agent of {slot.run_id} exited {slot.process.exitcode}: "
                    + log[-3000:]
                )
            self.checker.ended(slot.run_id)
            self.agents[i] = self.new_run()
        while len(self.agents) < self.spec.agents:
            self.agents.append(self.new_run())
        return found

    def kill_agent(self) -> None:
        alive = [i for i, s in enumerate(self.agents) if s.process.is_alive()]
        if not alive:
            return
        i = self.rng.choice(alive)
        slot = self.agents[i]
        slot.process.kill()
        slot.process.join(30)
        self.figures.agent_kills += 1
        self.agents[i] = self.start_agent(slot.run_id, resumed=True)

    def stop(self) -> None:
        for slot in self.agents:
            if slot.process.is_alive():
                slot.process.kill()
            slot.process.join(30)
        if self.daemon is not None and self.daemon.is_alive():
            self.daemon.kill()
            self.daemon.join(30)

    # -- the cycles ----------------------------------------------------------

    def cycle(self, n: int) -> list[str]:
        found = self.refill()
        time.sleep(self.rng.uniform(*self.spec.delay))
        draw = self.rng.random()
        if n in self.restart_cycles:
            assert self.database is not None
            assert self.daemon is not None
            found += self.database.cycle(n, self.daemon.is_alive)
        elif self.spec.drop_connections is not None and draw < 0.2:
            self.figures.connections_dropped += self.spec.drop_connections()
        elif draw < 0.6:
            self.kill_daemon()
            if self.spec.store_url is None:
                problems, keys = lmdb_consistency(self.data)
                found += problems
                self.figures.lmdb_checks += 1
                self.figures.lmdb_keys_read += keys
            self.start_daemon()
        else:
            self.kill_agent()
        full = n % self.spec.full_check_every == 0
        found += self.check(full=full)
        self.figures.cycles += 1
        return found

    def check(self, *, full: bool) -> list[str]:
        active = {s.run_id for s in self.agents}
        for _ in range(CHECK_TRIES - 1):
            try:
                return self._check(active, full=full)
            except EffectdError as exc:
                # Storage unavailable for a moment (its connections just
                # ended): the answer says to try again.
                if exc.code.name != "UNAVAILABLE":
                    raise
                time.sleep(0.1)
        return self._check(active, full=full)

    def _check(self, active: set[str], *, full: bool) -> list[str]:
        with Client(self.target, timeout=30.0, session=False) as client:
            found = self.checker.check(client, active, full=full)
            if full and self.database is not None:
                found += self.database.probes.check(client)
            return found

    def finish(self) -> list[str]:
        """The last check: every agent stopped, every record listed."""
        for slot in self.agents:
            if slot.process.is_alive():
                slot.process.kill()
            slot.process.join(30)
        return self.check(full=True)


def lmdb_consistency(data: Path) -> tuple[list[str], int]:
    """LMDB's own view of the files a kill left: the offline structural
    verifier (both meta pages, reachability, key order, the free list),
    then every key of every database read through the library, read-only.
    The problems found, and how many keys were read."""
    found = [f"lmdb.verify: {p}" for p in lmdb.verify.verify(str(data))]  # type: ignore[no-untyped-call]
    env = lmdb.open(str(data), readonly=True, lock=False, max_dbs=64)
    keys = 0
    try:
        with env.begin() as txn:
            names = [key for key, _ in txn.cursor()]
            for name in names:
                db = env.open_db(name, txn=txn, create=False)
                keys += sum(1 for _ in txn.cursor(db))
    except lmdb.Error as exc:
        found.append(f"lmdb walk: {exc!r}")
    finally:
        env.close()
    return found, keys


def run_loop(spec: LoopSpec) -> Outcome:
    """Runs the loop; the figures and every violation found."""
    loop = Loop(spec)
    outcome = Outcome(loop.figures)
    try:
        loop.start_daemon()
        for n in range(1, spec.cycles + 1):
            found = loop.cycle(n)
            if found and not outcome.caught_at:
                outcome.caught_at = n
            outcome.violations += found
            if found and spec.stop_on_violation:
                return outcome
        outcome.violations += loop.finish()
        if outcome.violations and not outcome.caught_at:
            outcome.caught_at = spec.cycles
    finally:
        loop.stop()
    return outcome
