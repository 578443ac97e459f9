"""A daemon process killed (SIGKILL) and started again, on the same data
directory and socket, under a running agent, at the agent's n-th step.

`restarting(data_dir)` starts `effectd serve` (`tests.support.processes`)
and yields a `Restarts`; `restarts.steps(client, at=n)` is the hook an agent
calls before each of its steps (a scripted model's turn, a loop's next tool
call): its n-th call kills the daemon and starts it again in the background,
so that the agent's next request finds it away and waits for it; the next
agent begins after `restarts.ready()`, on the daemon started again. The hook
returns once the agent's client has seen its connection go, as a client
between two requests does: a request written in the instant between the
daemon's death and the client seeing it may have been applied, and keeps that
unknown outcome (`tests/clients/test_reconnect.py`), as any request in flight
at a crash. `effects(path)` reads the side effects an agent's tools appended,
one line each, to a file; `waits(caplog)` the client's warnings that it
waits for the daemon.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from effectd_client import AsyncClient, Client
from effectd_client._frames import FramesSession
from tests.support.processes import DaemonProcess

# Every wait here is bounded by this many seconds.
BOUND = 60.0
_POLL = 0.01


class Restarts:
    """The daemon on `data_dir`, and its restarts (see the module)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.daemon = DaemonProcess(data_dir)
        self.target = self.daemon.target
        # Restarts since `ready()`.
        self.kills = 0
        self._killed: list[DaemonProcess] = []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="effectd-restart")
        self._starting: Future[DaemonProcess] | None = None

    def steps(self, client: Client | AsyncClient, *, at: int) -> Steps:
        """The hook of an agent using `client`: its `at`-th call restarts."""
        return Steps(self, client, at)

    def ready(self) -> None:
        """Waits for the daemon started again, if one is starting (for the
        next agent), and counts restarts from now."""
        if self._starting is not None:
            self._killed.append(self.daemon)
            self.daemon = self._starting.result(timeout=BOUND)
            self._starting = None
        self.kills = 0

    def _start_again(self) -> None:
        self.kills += 1
        self._starting = self._pool.submit(DaemonProcess, self.data_dir)

    def close(self) -> None:
        try:
            self.ready()
        finally:
            for daemon in (*self._killed, self.daemon):
                daemon.close()
            self._pool.shutdown()


def _saw_it_go(client: Client | AsyncClient) -> bool:
    """The client has no session stream open (the broken one ended). A
    session on the framed transport has no reader to see it go: its next
    message finds the connection closed."""
    session = client._session
    if session is None or isinstance(session, FramesSession):
        return True
    return session._stream is None


class Steps:
    """An agent's steps, counted; the `at`-th kills and restarts the daemon.
    Call it from a sync agent; await `step()` from an async one (its client
    sees the connection go on the agent's event loop)."""

    def __init__(self, restarts: Restarts, client: Client | AsyncClient, at: int):
        self._restarts, self._client, self._at = restarts, client, at
        self.count = 0

    def __call__(self) -> None:
        self.count += 1
        if self.count != self._at:
            return
        self._restarts.daemon.kill9()
        end = time.monotonic() + BOUND
        while not _saw_it_go(self._client):
            assert time.monotonic() < end, "the client did not see the daemon go"
            time.sleep(_POLL)
        self._restarts._start_again()

    async def step(self) -> None:
        self.count += 1
        if self.count != self._at:
            return
        await asyncio.to_thread(self._restarts.daemon.kill9)
        for _ in range(int(BOUND / _POLL)):
            if _saw_it_go(self._client):
                break
            await asyncio.sleep(_POLL)
        else:
            raise AssertionError("the client did not see the daemon go")
        self._restarts._start_again()


@contextmanager
def restarting(data_dir: Path) -> Iterator[Restarts]:
    restarts = Restarts(data_dir)
    try:
        yield restarts
    finally:
        restarts.close()


def waits(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The Python client's warnings that it waits for the daemon."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "effectd_client" and "waiting up to" in r.getMessage()
    ]


def effect(path: Path, what: str) -> None:
    """One side effect on the external system: a line in `path`."""
    with path.open("a") as file:
        file.write(what + "\n")


def effects(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
