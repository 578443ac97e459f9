"""A real daemon for a user's own tests, and a crash in the middle of a call.

`running_daemon()` starts `effectd serve` (the `effectd` distribution, in this
interpreter by default) on a fresh temporary data directory, serving a Unix
socket only, and stops it at exit. `crash_and_resume(agent, target, ...)` runs
an agent function in a child process that is killed with SIGKILL at a chosen
point of its first tool call, then runs the same function again, as the
restarted agent would, and reports what the second run saw: the way effectd's
own tests prove that a tool runs at most once.
"""

from __future__ import annotations

import enum
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from effectd_client._aio import AsyncClient
from effectd_client._client import Client
from effectd_client._types import State

READY = "ready on "
# Bounded polls: how long a crashed call's lease may take to run out.
LEASE_WAIT_SECONDS = 120.0


@dataclass
class TestDaemon:
    """A daemon serving on `target` (a Unix socket), data in `data_dir`."""

    __test__ = False  # not a test class, whatever pytest collects

    target: str
    data_dir: Path
    process: subprocess.Popen[str]
    _stderr: list[str]

    def stderr(self) -> str:
        """What the daemon has logged so far."""
        return "".join(self._stderr)

    def stop(self) -> None:
        """SIGTERM (a graceful shutdown), SIGKILL after 10 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@contextmanager
def running_daemon(
    *,
    command: Sequence[str] | None = None,
    args: Sequence[str] = ("--no-sync",),
    env: dict[str, str] | None = None,
    ready_timeout: float = 30.0,
) -> Iterator[TestDaemon]:
    """A real daemon on a temporary data directory, for the block's length.

    Args:
        command: How to run effectd; default this interpreter's
            `python -m sidecar` (the `effectd` package installed beside the
            client), e.g. `["effectd"]` for the command on PATH.
        args: More `effectd serve` arguments; `--no-sync` by default (a test
            daemon need not survive a power cut).
        env: More environment variables, e.g. `EFFECTD_POLICY_FILE`.
        ready_timeout: Seconds to wait for the daemon to say it is ready.

    Raises:
        RuntimeError: The daemon exited or did not get ready in time.
    """
    # Unix socket paths are limited to ~107 bytes: keep the directory short.
    base = "/tmp" if os.name == "posix" else None  # noqa: S108
    data_dir = Path(tempfile.mkdtemp(prefix="efd-", dir=base))
    socket = data_dir / "effectd.sock"
    cmd = [*(command or (sys.executable, "-m", "sidecar")), "serve"]
    # --init: the directory is new, on purpose.
    process = subprocess.Popen(
        [*cmd, "--data-dir", str(data_dir), "--init", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    lines: list[str] = []
    ready = threading.Event()

    def drain() -> None:  # keeps reading, or a chatty daemon blocks on the pipe
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if READY in line:
                ready.set()
        ready.set()  # exited: wake the waiter

    reader = threading.Thread(target=drain, name="effectd-test-stderr", daemon=True)
    reader.start()
    daemon = TestDaemon(f"unix:{socket}", data_dir, process, lines)
    try:
        if not ready.wait(ready_timeout) or process.poll() is not None:
            raise RuntimeError(f"effectd did not get ready:\n{daemon.stderr()}")
        yield daemon
    finally:
        daemon.stop()
        reader.join(timeout=10)
        if process.stderr is not None:
            process.stderr.close()
        shutil.rmtree(data_dir, ignore_errors=True)


class CrashPoint(enum.Enum):
    """Where the first run of the agent dies (SIGKILL, nothing flushed)."""

    # Its tool ran (the effect happened) and the commit was not sent.
    BEFORE_COMMIT = "before_commit"
    # The result is committed; the agent never used it.
    AFTER_COMMIT = "after_commit"


@dataclass(frozen=True, slots=True)
class CrashReport:
    """What `crash_and_resume` saw: whether the first run died at the point
    (`crashed`; False when it finished without committing anything), and
    what the resumed run returned (`resumed`) or raised (`resumed_error`)."""

    crashed: bool
    resumed: Any = None
    resumed_error: BaseException | None = None


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _crash(at: str) -> None:
    """In the child: SIGKILL before, or after, the first commit."""
    sync_commit, async_commit = Client.commit_tool, AsyncClient.commit_tool
    before = at == CrashPoint.BEFORE_COMMIT.value

    def commit(*args: Any, **kwargs: Any) -> Any:
        if not before:
            sync_commit(*args, **kwargs)
        _die()

    async def acommit(*args: Any, **kwargs: Any) -> Any:
        if not before:
            await async_commit(*args, **kwargs)
        _die()

    Client.commit_tool = commit  # type: ignore[method-assign]
    AsyncClient.commit_tool = acommit  # type: ignore[method-assign]


def _child(
    agent: Callable[..., Any], target: str, args: tuple[Any, ...], at: str
) -> None:
    _crash(at)
    agent(target, *args)


def _expire_leases(target: str, deadline: float) -> None:
    """Lets the crashed attempts' leases run out and has the daemon find them
    (Recover marks them UNKNOWN), as it would before a restarted agent asks."""
    with Client(target) as client:
        while time.monotonic() < deadline:
            started = list(client.list_tool_calls(states=(State.STARTED,)))
            if not started:
                return
            for call in started:
                client.recover(call.run_id)
            time.sleep(0.1)
    raise RuntimeError("the crashed call's lease did not run out")


def crash_and_resume(
    agent: Callable[..., Any],
    target: str,
    *args: Any,
    at: CrashPoint = CrashPoint.BEFORE_COMMIT,
    timeout: float = 60.0,
) -> CrashReport:
    """Runs `agent(target, *args)` in a child process killed at `at`, then
    again in this process, and reports what the second run saw.

    `agent` runs the user's agent (its tool calls through `Run`, `AsyncRun`
    or a wrapper built on them) against the daemon at `target`; it must be a
    module-level function (the child is spawned, not forked). Before the
    second run the crashed attempt's lease runs out (give the `Run` a short
    `lease_ms`), as it would before a real restart. A tool that is safe under
    the crash ran once in total: after BEFORE_COMMIT the resumed run meets
    `ReconciliationNeeded` (SIDE_EFFECT) or retries under the retry rules;
    after AFTER_COMMIT it gets the stored result.

    Raises:
        RuntimeError: The child neither finished nor died within `timeout`.
    """
    spawn = multiprocessing.get_context("spawn")
    child = spawn.Process(target=_child, args=(agent, target, args, at.value))
    child.start()
    child.join(timeout)
    if child.exitcode is None:
        child.kill()
        child.join(10)
        raise RuntimeError(f"the agent did not reach {at.name} within {timeout} s")
    crashed = child.exitcode == -signal.SIGKILL
    child.close()
    _expire_leases(target, time.monotonic() + LEASE_WAIT_SECONDS)
    try:
        return CrashReport(crashed, resumed=agent(target, *args))
    except Exception as exc:
        return CrashReport(crashed, resumed_error=exc)
