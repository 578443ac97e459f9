"""The daemon as a separate process, for crash tests: start, wait, kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class DaemonProcess:
    """`effectd serve` as a child process; its output (stdout and stderr)
    goes to `<data_dir>.log` and is read line by line as it comes, so a test
    waits for what the daemon says rather than polling it."""

    def __init__(
        self, data_dir: Path, module: str = "sidecar", args: Sequence[str] = ()
    ) -> None:
        self.data_dir = data_dir
        self.target = f"unix:{data_dir / 'effectd.sock'}"
        self._log = open(data_dir.parent / f"{data_dir.name}.log", "ab")  # noqa: SIM115
        self._lines: list[str] = []
        self._ended = False
        self._changed = threading.Condition()
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", module, "serve"),
                *("--data-dir", str(data_dir), "--init", *args),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._copier = threading.Thread(target=self._copy, daemon=True)
        self._copier.start()
        try:
            self._wait_ready()
        except BaseException:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self._copier.join(timeout=30)
            self._log.close()
            raise

    def _copy(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                self._log.write(line)
                self._log.flush()
                with self._changed:
                    self._lines.append(line.decode(errors="replace"))
                    self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def wait_for_line(self, match: Callable[[str], bool], timeout: float = 30.0) -> str:
        """The first line of the daemon's output that `match` accepts, waiting
        for it as lines come; "" if the output ends or `timeout` passes first."""

        def found() -> str:
            return next((line for line in self._lines if match(line)), "")

        with self._changed:
            self._changed.wait_for(lambda: self._ended or found(), timeout)
            return found()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        # Printed once the daemon serves and handles SIGTERM (sidecar.cli).
        if self.wait_for_line(lambda line: " ready on " in line, timeout):
            return
        if self._ended:
            code = self.proc.wait(timeout=30)
            raise RuntimeError(f"daemon exited with {code}: {self.log()}")
        raise TimeoutError(f"daemon not ready after {timeout} s: {self.log()}")

    def log(self) -> str:
        if self.proc.poll() is not None:
            self._copier.join(timeout=30)  # the last lines, once it has exited
        self._log.flush()
        return (self.data_dir.parent / f"{self.data_dir.name}.log").read_text(
            errors="replace"
        )

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill9()
        self._copier.join(timeout=30)
        self._log.close()


@contextmanager
def daemon_process(
    data_dir: Path, module: str = "sidecar", args: Sequence[str] = ()
) -> Iterator[DaemonProcess]:
    d = DaemonProcess(data_dir, module, args)
    try:
        yield d
    finally:
        d.close()


@contextmanager
def daemon_processes(
    data_dirs: Sequence[Path], module: str = "sidecar", args: Sequence[str] = ()
) -> Iterator[list[DaemonProcess]]:
    """One daemon per directory, started at once (each waits for its own
    readiness), all killed at exit."""
    with ThreadPoolExecutor(len(data_dirs)) as pool:
        starting = [pool.submit(DaemonProcess, d, module, args) for d in data_dirs]
    started = [f.result() for f in starting if f.exception() is None]
    try:
        if len(started) < len(starting):
            raise next(e for f in starting if (e := f.exception()) is not None)
        yield started
    finally:
        for d in started:
            d.close()
