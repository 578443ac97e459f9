"""What native code writes to file descriptor 2, logged like the daemon's
own lines.

Native code writes to file descriptor 2 itself: gRPC's C core logs through
absl (at GRPC_VERBOSITY), past Python's logging. `NativeStderr` reads those
lines back through a pipe and logs them (`grpc.core`, at their severity),
so that stderr holds only the daemon's lines, in its format
(`sidecar.observability.logs`).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import re
import sys
import threading
from typing import TextIO

# A line of absl, which gRPC's C core logs through: severity, MMDD, time,
# thread id, `file:line]`, the message.
_ABSL = re.compile(
    r"^(?P<level>[IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ "
    r"(?P<source>[^\s\]]+:\d+)\] ?(?P<msg>.*)$"
)
_ABSL_LEVELS = {
    "I": logging.INFO,
    "W": logging.WARNING,
    "E": logging.ERROR,
    "F": logging.CRITICAL,
}
# absl's own notice before it is initialised, e.g. `WARNING: All log
# messages before absl::InitializeLog() is called are written to STDERR`.
_PREFIXED = re.compile(r"^(?P<level>INFO|WARNING|ERROR|FATAL): (?P<msg>.*)$")
_LONGEST_LINE = 64 * 1024


def native_record(line: str) -> tuple[str, int, str, dict[str, str]]:
    """A line that native code wrote to file descriptor 2 as (logger,
    level, message, extra fields): gRPC core's absl lines under
    `grpc.core` at their own severity, anything else under `stderr`."""
    absl = _ABSL.match(line)
    if absl is not None:
        level = _ABSL_LEVELS[absl["level"]]
        return "grpc.core", level, absl["msg"], {"source": absl["source"]}
    prefixed = _PREFIXED.match(line)
    if prefixed is not None:
        name = prefixed["level"].replace("FATAL", "CRITICAL")
        return "grpc.core", logging.getLevelNamesMapping()[name], prefixed["msg"], {}
    return "stderr", logging.WARNING, line, {}


class NativeStderr:
    """Makes what native code writes to file descriptor 2 (gRPC's C core,
    through absl, at GRPC_VERBOSITY) log lines like the daemon's own.

    `start` points descriptor 2 at a pipe that a thread reads, line by line,
    into `logging` (see `native_record`); Python's own `sys.stderr` moves to
    a copy of the original descriptor, so the daemon's handler, `print` and
    tracebacks write there directly, as do fatal-error dumps
    (`faulthandler`). `stop` puts descriptor 2 back and waits until the
    thread has logged every line read; `close` then closes the copy.
    """

    def __init__(self) -> None:
        self._original = -1
        self._reader = -1
        self._saved: TextIO | None = None
        self._stream: TextIO | None = None
        self._thread: threading.Thread | None = None
        self._faulthandler = False

    def start(self) -> TextIO:
        """Starts capturing; returns the stream on the original stderr
        (also `sys.stderr` until `stop`)."""
        sys.stderr.flush()
        self._original = os.dup(2)
        self._reader, writer = os.pipe()
        os.dup2(writer, 2)
        os.close(writer)
        self._stream = open(  # noqa: SIM115 (closed by `close`)
            self._original,
            "w",
            buffering=1,
            encoding="utf-8",
            errors="backslashreplace",
            closefd=False,
        )
        self._saved, sys.stderr = sys.stderr, self._stream
        # A fatal error's dump must not wait in the pipe for a thread that
        # dies with the process.
        self._faulthandler = faulthandler.is_enabled()
        faulthandler.enable(self._stream)
        self._thread = threading.Thread(
            target=self._pump, name="effectd-native-stderr", daemon=True
        )
        self._thread.start()
        return self._stream

    def _pump(self) -> None:
        pending = b""
        while chunk := os.read(self._reader, 65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            while len(pending) > _LONGEST_LINE:
                lines.append(pending[:_LONGEST_LINE])
                pending = pending[_LONGEST_LINE:]
            for line in lines:
                self._log(line)
        self._log(pending)
        os.close(self._reader)

    @staticmethod
    def _log(raw: bytes) -> None:
        line = raw.decode("utf-8", "backslashreplace").rstrip("\r")
        if line.strip():
            name, level, msg, extra = native_record(line)
            logging.getLogger(name).log(level, "%s", msg, extra=extra)

    def stop(self) -> None:
        """Points descriptor 2 at the original stderr again, which ends the
        pipe, and waits (at most 5 s) for the last lines to be logged."""
        if self._thread is None:
            return
        if self._saved is not None:
            sys.stderr = self._saved
            if self._faulthandler:
                faulthandler.enable(self._saved)
            else:
                faulthandler.disable()
        os.dup2(self._original, 2)  # the pipe's only writer is gone: EOF
        self._thread.join(timeout=5)
        self._thread = None

    def close(self) -> None:
        """Closes the copy of the original stderr (after `stop`, once no
        handler writes to the stream `start` returned)."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._original >= 0:
            os.close(self._original)
            self._original = -1


__all__ = ["NativeStderr", "native_record"]
