"""The database restarts of the crash loop on PostgreSQL: the server (of a
private cluster, never the one other tests share) stopped while the agents
work, down a moment, and started again; then the loop waits, a bounded
while, until the daemon, which reconnects on its own, commits a write again,
and times how long that took.

Stopped in immediate mode (every server process ended at once, as a crash:
the next start replays the WAL) two times in three, in fast mode (open
transactions rolled back, sessions ended) otherwise. Down up to half a
second besides its stop and start, or, one restart in eight when the loop
asks for long outages, seconds: long enough for the daemon's connection
pools to back off.

The writes that tell the daemon serves again are checkpoint puts under
`probe/`, a new key each try (a try answered UNAVAILABLE may have been
applied). Each acknowledged one must keep its bytes and revision, and their
revisions must grow in the order they were acknowledged (one counter, never
back across a crash); any answer but UNAVAILABLE or DEADLINE_EXCEEDED while
the database is away is a violation (an INTERNAL, for one).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from effectd_client import Client, EffectdError
from tests.torture.crash_checks import Figures

StopMode = Literal["fast", "immediate"]
# Stops the database in the mode given, waits the seconds given, starts it
# again; returns once it accepts connections.
RestartDatabase = Callable[[StopMode, float], None]

MODES: tuple[StopMode, ...] = ("immediate", "immediate", "fast")
# How long the database stays down, seconds (uniform), besides its own stop
# and start: requests meet a refused connection, not only a broken one.
DOWN_SECONDS = (0.0, 0.5)
LONG_SHARE = 0.125
# The most the daemon may take to serve a write once the database is back.
SERVE_SECONDS = 60.0
PREFIX = "probe/"
RETRIED = ("UNAVAILABLE", "DEADLINE_EXCEEDED")


@dataclass(slots=True)
class Probes:
    """The probe writes acknowledged: key -> (revision, value)."""

    figures: Figures
    acked: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    last_revision: int = 0
    tries: int = 0

    def write(self, client: Client, name: str) -> list[str] | None:
        """One try: None if it was not acknowledged (the daemon not serving
        yet), else the violations its answer shows."""
        self.tries += 1
        key = f"{PREFIX}{name}/{self.tries}"
        value = key.encode() + b"\x00\xff"
        try:
            revision = client.put_checkpoint(key, value)
        except EffectdError as exc:
            if exc.code.name in RETRIED:
                return None
            return [f"probe put {key} answered {exc.code.name}: {exc}"]
        found = []
        if revision <= self.last_revision:
            found.append(
                f"probe put {key} acknowledged revision {revision} after "
                f"{self.last_revision}"
            )
        self.last_revision = max(self.last_revision, revision)
        self.acked[key] = (revision, value)
        self.figures.probe_writes += 1
        return found

    def check(self, client: Client) -> list[str]:
        """Every acknowledged probe put as it was acknowledged."""
        stored = {c.key: (c.revision, c.value) for c in client.list_checkpoints(PREFIX)}
        return [
            f"acknowledged probe put {key} (revision {revision}) is now "
            f"{stored.get(key)}"
            for key, (revision, value) in self.acked.items()
            if stored.get(key) != (revision, value)
        ]


@dataclass(slots=True)
class DatabaseRestarts:
    """Restarts the database and waits for the daemon at `target` to serve."""

    restart: RestartDatabase
    target: str
    rng: random.Random
    figures: Figures
    # How long a long outage lasts, seconds (uniform); None: none.
    long_outage: tuple[float, float] | None = None
    probes: Probes = field(init=False)

    def __post_init__(self) -> None:
        self.probes = Probes(self.figures)

    def cycle(self, n: int, daemon_alive: Callable[[], bool]) -> list[str]:
        """One restart while the agents work; the violations seen while the
        daemon came back, or that it did not."""
        mode = self.rng.choice(MODES)
        down = self.rng.uniform(*DOWN_SECONDS)
        if self.long_outage is not None and self.rng.random() < LONG_SHARE:
            down = self.rng.uniform(*self.long_outage)
            self.figures.long_outages += 1
        self.restart(mode, down)
        back = time.monotonic()
        self.figures.database_restarts += 1
        if mode == "immediate":
            self.figures.database_crashes += 1
        found = self._wait_serving(f"c{n}", daemon_alive)
        elapsed_ms = round((time.monotonic() - back) * 1000)
        self.figures.recovery_ms_total += elapsed_ms
        self.figures.recovery_ms_max = max(self.figures.recovery_ms_max, elapsed_ms)
        return found

    def _wait_serving(self, name: str, daemon_alive: Callable[[], bool]) -> list[str]:
        give_up = time.monotonic() + SERVE_SECONDS
        while True:
            if not daemon_alive():
                return ["the daemon exited after the database restarted"]
            with Client(self.target, timeout=10.0, session=False) as client:
                found = self.probes.write(client, name)
            if found is not None:
                return found
            if time.monotonic() > give_up:
                return [
                    f"the daemon served no write {SERVE_SECONDS:.0f} s after the "
                    "database restarted"
                ]
            time.sleep(0.02)

    def check(self) -> list[str]:
        with Client(self.target, timeout=30.0, session=False) as client:
            return self.probes.check(client)
