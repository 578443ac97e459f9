"""The world a linearizability history is recorded in: the daemon process
(`Target`), stopped with SIGSTOP and SIGCONT, killed with SIGKILL and
started again on the same data directory; the live call ids and keys the
clients share (`Keys`); the history being recorded (`History`); and the
knobs of a run (`Knobs`).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.processes import DaemonProcess
from tests.torture.linearizability import Operation


@dataclass(frozen=True, slots=True)
class Knobs:
    seed: int
    seconds: float
    deadline_s: float = 1.0
    ledger_clients: int = 3
    checkpoint_clients: int = 3
    ops_per_key: int = 30
    live_keys: int = 2
    pauses: bool = True
    kills: bool = True


@dataclass(slots=True)
class History:
    ledger: list[Operation] = field(default_factory=list)
    checkpoints: list[Operation] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    tally: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, into: list[Operation], op: Operation | None, outcome: str) -> None:
        """Records `op` (None: a failed read, only counted)."""
        with self.lock:
            if op is not None:
                into.append(op)
            self.tally[outcome] += 1


class Target:
    """The daemon process, restarted on the same data directory; clients
    wait while it is down and reconnect to each new one."""

    def __init__(self, data_dir: Path, module: str, args: Sequence[str]) -> None:
        self.data_dir = data_dir
        self.module = module
        self.args = args
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.proc = DaemonProcess(data_dir, module, args)
        self.generation = 0
        self.up = threading.Event()
        self.up.set()

    def pause(self, seconds: float) -> None:
        os.kill(self.proc.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(self.proc.proc.pid, signal.SIGCONT)

    def restart(self) -> tuple[int, int]:
        """SIGKILL, then a new daemon: the interval it was down in."""
        self.up.clear()
        killed = time.monotonic_ns()
        self.proc.close()
        self.proc = DaemonProcess(self.data_dir, self.module, self.args)
        ready = time.monotonic_ns()
        self.generation += 1
        self.up.set()
        return killed, ready

    def close(self) -> None:
        os.kill(self.proc.proc.pid, signal.SIGCONT)
        self.proc.close()


class Keys:
    """The live call ids (or checkpoint keys) of one workload: each takes
    `limit` operations, then a fresh one takes its place. `hints` keep what
    the clients last saw of each, to build plausible requests."""

    def __init__(self, prefix: str, live: int, limit: int) -> None:
        self.prefix = prefix
        self.limit = limit
        self.made = 0
        self.live = [self._fresh() for _ in range(live)]
        self.counts: Counter[str] = Counter()
        self.hints: dict[str, Any] = {}
        # The input fingerprint of the calls (they share one input), once seen.
        self.fingerprint = ""
        self.lock = threading.Lock()

    def _fresh(self) -> str:
        self.made += 1
        return f"{self.prefix}{self.made}"

    def pick(self, rng: random.Random) -> str:
        with self.lock:
            index = rng.randrange(len(self.live))
            key = self.live[index]
            self.counts[key] += 1
            if self.counts[key] >= self.limit:
                self.live[index] = self._fresh()
            return key


@dataclass(frozen=True, slots=True)
class Run:
    """What every thread of one run shares."""

    target: Target
    history: History
    knobs: Knobs
    stop: threading.Event
