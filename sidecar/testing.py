"""Test helpers shipped with the daemon: run one in a background thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sidecar.clock import Clock, ManualClock
from sidecar.config import ServeConfig
from sidecar.seams import Seams
from sidecar.server import Daemon, Endpoints

# The tasks a serving daemon keeps asleep on its clock: the renewal of its
# registration, the compaction pass and the lease sweep.
PERIODIC_TASKS = 3


class RunningDaemon:
    """A daemon serving on its own event loop in a thread."""

    def __init__(
        self, daemon: Daemon, loop: asyncio.AbstractEventLoop, endpoints: Endpoints
    ) -> None:
        self.daemon = daemon
        self.loop = loop
        self.endpoints = endpoints

    @property
    def target(self) -> str:
        return self.endpoints.unix

    def wait_for_periodic_tasks(self, timeout: float = 10.0) -> None:
        """Blocks until every periodic task sleeps on the daemon's manual
        clock: after `advance`, until the passes it woke have run.

        Raises:
            TimeoutError: they did not within `timeout` seconds of real time.
        """
        clock = self.daemon.seams.clock
        assert isinstance(clock, ManualClock), "the daemon's clock is not manual"
        clock.wait_for_sleepers(PERIODIC_TASKS, timeout)


@contextmanager
def running_daemon(
    config: ServeConfig,
    clock: Clock | None = None,
    daemon: Daemon | None = None,
    *,
    seams: Seams | None = None,
) -> Iterator[RunningDaemon]:
    """Starts a daemon, yields it, and stops it gracefully at exit.

    Args:
        config: the daemon's configuration.
        clock: the daemon's clock (short for `seams=Seams(clock=clock)`).
        daemon: a daemon to run instead of a new one of `config`.
        seams: the new daemon's seams.
    """
    if seams is not None and clock is not None and seams.clock is not clock:
        raise ValueError("clock: give it in seams, not beside them")
    if daemon is not None and (seams is not None or clock is not None):
        raise ValueError("seams: the daemon given has its own")
    if daemon is None:
        daemon = Daemon(config, seams or (Seams(clock=clock) if clock else None))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=loop.run_forever, name="effectd-test-loop", daemon=True
    )
    thread.start()
    try:
        endpoints = asyncio.run_coroutine_threadsafe(daemon.start(), loop).result(
            timeout=30
        )
        try:
            yield RunningDaemon(daemon, loop, endpoints)
        finally:
            asyncio.run_coroutine_threadsafe(daemon.stop(), loop).result(timeout=30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()
