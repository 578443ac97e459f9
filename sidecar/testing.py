"""Test helpers shipped with the daemon: run one in a background thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sidecar.clock import Clock
from sidecar.config import ServeConfig
from sidecar.server import Daemon, Endpoints


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


@contextmanager
def running_daemon(
    config: ServeConfig, clock: Clock | None = None, daemon: Daemon | None = None
) -> Iterator[RunningDaemon]:
    """Starts a daemon, yields it, and stops it gracefully at exit."""
    daemon = daemon or Daemon(config, clock)
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
