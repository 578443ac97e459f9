"""A test build of the daemon as a separate process that crashes at a
failpoint (`tests.support.failpoint_daemon`).

The process is forked from a fork server that has already imported the
daemon (multiprocessing's "forkserver", preloaded): a start costs a fork,
not the seconds of importing gRPC and the daemon again, which is what lets
the failpoint table run every row in the fast setting. The fork server holds
no gRPC channel, server or thread, so each child starts clean.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.process import BaseProcess
from pathlib import Path

from sidecar import failpoints
from sidecar.rpc import summaries
from sidecar.storage.api import Store, Table, WriteView
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore
from tests.support import failpoint_daemon

_PRELOAD = ["tests.support.failpoint_daemon"]
_READY = " ready on "
_START_SECONDS = 60.0


def _context() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    assert isinstance(context, multiprocessing.context.ForkServerContext)
    context.set_forkserver_preload(_PRELOAD)
    return context


class CrashingDaemon:
    """A test-build daemon serving `data_dir` with the failpoints `spec`
    armed; its output goes to `<data_dir>.log`. Started ready to serve.
    `build`: a broken build of the negative controls
    (`failpoint_daemon.BROKEN`), "" for the real one."""

    def __init__(
        self,
        data_dir: Path,
        spec: str,
        args: tuple[str, ...] = (),
        *,
        build: str = "",
    ) -> None:
        self.data_dir = data_dir
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.target = f"unix:{data_dir / 'effectd.sock'}"
        argv = ["serve", "--data-dir", str(data_dir), "--init", "--log-format", "text"]
        argv += args
        self.proc: BaseProcess = _context().Process(
            target=failpoint_daemon.serve_forked,
            args=(argv, spec, str(self.log_path), build),
            daemon=False,
        )
        self.proc.start()
        self._wait_ready()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _START_SECONDS
        while time.monotonic() < deadline:
            if _READY in self.log():
                return
            if self.proc.exitcode is not None:
                raise RuntimeError(
                    f"daemon exited with {self.proc.exitcode}: {self.log()}"
                )
            time.sleep(0.02)
        self.kill()
        raise TimeoutError(f"daemon not ready after {_START_SECONDS} s: {self.log()}")

    def wait_exit(self, timeout: float = 30.0) -> int | None:
        """The exit code once the process ends; None if it still runs."""
        self.proc.join(timeout)
        return self.proc.exitcode

    def crashed_at_failpoint(self) -> bool:
        return self.wait_exit() == failpoints.CRASH_EXIT and "failpoint" in self.log()

    def kill(self) -> None:
        if self.proc.exitcode is None and self.proc.pid is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(30)


def batch_then_crash(store: str, keys: list[bytes], spec: str, log: str) -> None:
    """A forked child's body: opens `store` (a data directory, or a
    postgresql:// URL) with the failpoints `spec` armed, and writes one row
    of `Table.META` per key, all in one batch of the writer (queued while
    the writer is held by a write before them). The writes of the batch are
    scoped "/Batch" (`point@Batch` in `spec` counts only them). Exits 0 if
    nothing crashed it."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    batch = threading.Event()
    armed = failpoints.Failpoints(spec, lambda: "/Batch" if batch.is_set() else "")
    opened = _open(store, armed)
    holding, go = threading.Event(), threading.Event()

    def hold(view: WriteView) -> None:
        holding.set()
        go.wait(30)

    first = opened.submit(hold)
    holding.wait(30)
    batch.set()
    queued = [opened.submit(functools.partial(_put, key=key)) for key in keys]
    go.set()
    first.result(30)
    for future in queued:
        future.result(30)
    os._exit(0)


def _put(view: WriteView, key: bytes) -> None:
    view.put(Table.META, key, b"written")


def _open(store: str, armed: failpoints.Failpoints | None = None) -> Store:
    if store.startswith("postgresql://"):
        from sidecar.storage.postgres.store import (  # noqa: PLC0415
            PostgresOptions,
            PostgresStore,
        )

        return PostgresStore(
            store, PostgresOptions(failpoints=armed, summarize=summaries.summarize)
        )
    return LmdbStore(
        Path(store), LmdbOptions(failpoints=armed, summarize=summaries.summarize)
    )


def rows_left(store: str, keys: list[bytes]) -> list[bytes]:
    """The keys of `keys` that `store` holds in `Table.META`, opened again
    without failpoints."""
    opened = _open(store)
    try:
        return opened.read(
            lambda view: [k for k in keys if view.get(Table.META, k) is not None]
        )
    finally:
        opened.close()


def crash_in_a_batch(store: str, keys: list[bytes], spec: str, log: Path) -> int | None:
    """Runs `batch_then_crash` in a forked child; its exit code."""
    child = _context().Process(
        target=batch_then_crash, args=(store, keys, spec, str(log)), daemon=False
    )
    child.start()
    child.join(60)
    if child.exitcode is None and child.pid is not None:
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
    return child.exitcode
