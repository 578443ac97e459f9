"""The daemon's log output: one line per record, JSON or text, redacted.

`configure` installs one handler on the root logger (stderr). JSON lines
carry stable fields: `ts` (RFC 3339, UTC), `level`, `logger`, `msg`, the
`extra={...}` fields of the call, `trace_id` of the RPC being served, and
`exc` for a traceback. Every string is escaped so that nothing a client
sends (a run id, a header, an exception message) can end a line or forge
another one (CWE-117): JSON escapes control characters itself, and with
`ensure_ascii` also the Unicode line separators; the text format escapes
CR, LF, every other control character and the backslash.

Nothing that is secret is logged in the first place: the callers log names,
codes and sizes, never payloads, tokens or keys. As a second line of defence
(CWE-532), `add_secrets` registers values (bearer tokens, provider API keys)
that the formatters mask as `***` wherever they appear: in the message, its
arguments, the extras and the traceback.

Native code writes to file descriptor 2 itself: gRPC's C core logs through
absl (at GRPC_VERBOSITY), past Python's logging. `NativeStderr` reads those
lines back through a pipe and logs them (`grpc.core`, at their severity),
so that stderr holds only the daemon's lines, in its format.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

from sidecar import tracecontext as trace

MASK = "***"
# Shorter values would mask ordinary words; tokens have at least 16 chars.
MIN_SECRET_LENGTH = 8
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
# Libraries that log what the daemon must not: request lines (URLs an agent
# chose) at INFO, HTTP/2 headers (provider keys) at DEBUG. Never below WARNING.
_QUIET = ("httpx", "httpcore", "hpack", "h2")
# Libraries whose DEBUG lines are noise for every request (the event loop's
# id, once per RPC): never below INFO.
_TERSE = ("grpc._cython",)

# The attributes every LogRecord has; anything else came from `extra`.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}

# `Bearer TOKEN` wherever it appears (a header or a metadata dump); at least
# 8 characters, so that prose ("the bearer token is empty") stays readable.
_BEARER = re.compile(r"(?i)(\bbearer\s+)[^\s\"',;]{8,}")
# A run that could be a token: tokens hold no spaces or control characters
# and are at least 16 characters long (sidecar.auth.tokens).
_RUN = re.compile(r"[^\s\"'`,;:()\[\]{}<>\\]{16,}")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\\\\]")


class Secrets:
    """What is masked in every log line; thread-safe, only ever grows.

    Plain values (provider keys, which the daemon holds anyway) are replaced
    wherever they occur. Bearer tokens are known only by their SHA-256
    digests (the daemon keeps no token in memory), so every run of at least
    16 token characters in a line is hashed and masked if it is one; and
    whatever follows `Bearer ` is masked in any case.

    One set per process, like the logging configuration it belongs to:
    several daemons in one process mask each other's secrets too, which is
    only more masking.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: tuple[str, ...] = ()
        self._digests: frozenset[bytes] = frozenset()

    def add(self, values: Iterable[str]) -> None:
        with self._lock:
            merged = set(self._values)
            merged.update(v for v in values if len(v) >= MIN_SECRET_LENGTH)
            # Longest first: a secret that contains another is masked whole.
            self._values = tuple(sorted(merged, key=lambda v: (-len(v), v)))

    def add_digests(self, digests: Iterable[bytes]) -> None:
        with self._lock:
            self._digests = self._digests | frozenset(digests)

    def redact(self, text: str) -> str:
        for value in self._values:
            if value in text:
                text = text.replace(value, MASK)
        text = _BEARER.sub(r"\1" + MASK, text)
        if self._digests:
            text = _RUN.sub(self._masked_run, text)
        return text

    def _masked_run(self, match: re.Match[str]) -> str:
        run = match.group()
        candidates = [run]
        if "=" in run[:-2]:
            # `token=SECRET`: the value after the first `=` (base64 padding
            # stays at the end, so the whole run is tried first).
            candidates.append(run.split("=", 1)[1])
        for candidate in candidates:
            digest = hashlib.sha256(candidate.encode("utf-8", "replace")).digest()
            if digest in self._digests:
                return run[: len(run) - len(candidate)] + MASK
        return run

    def redact_value(self, value: Any) -> Any:
        """`value` with secrets masked in it, strings in containers included."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, bytes):
            return self.redact(value.decode("utf-8", "backslashreplace"))
        if isinstance(value, Mapping):
            return {self.redact(str(k)): self.redact_value(v) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [self.redact_value(v) for v in value]
        if value is None or isinstance(value, bool | int | float):
            return value
        return self.redact(str(value))


SECRETS = Secrets()


def add_secrets(values: Iterable[str]) -> None:
    """Masks each of `values` (at least 8 characters) in every later line."""
    SECRETS.add(values)


def add_secret_digests(digests: Iterable[bytes]) -> None:
    """Masks every token whose SHA-256 digest is one of `digests`."""
    SECRETS.add_digests(digests)


def escape(text: str) -> str:
    """`text` on one line: control characters, the Unicode line and
    paragraph separators and the backslash as backslash escapes."""
    return _CONTROL.sub(_escape_one, text)


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    named = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    if char in named:
        return named[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def rfc3339(created: float) -> str:
    """A record's time as RFC 3339 UTC with milliseconds: `...T14:52:33.123Z`."""
    moment = datetime.fromtimestamp(created, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def fields(record: logging.LogRecord, secrets: Secrets = SECRETS) -> dict[str, Any]:
    """The stable fields of `record`, secrets masked, not yet escaped."""
    doc: dict[str, Any] = {
        "ts": rfc3339(record.created),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": secrets.redact(_message(record)),
    }
    for key, value in record.__dict__.items():
        if key not in _STANDARD and not key.startswith("_") and key not in doc:
            doc[key] = secrets.redact_value(value)
    if "trace_id" not in doc:
        context = trace.current()
        if context is not None:
            doc["trace_id"] = context.trace_id
    if record.exc_info and record.exc_info[0] is not None:
        doc["exc"] = secrets.redact(
            logging.Formatter().formatException(record.exc_info)
        )
    elif record.exc_text:
        doc["exc"] = secrets.redact(record.exc_text)
    if record.stack_info:
        doc["stack"] = secrets.redact(record.stack_info)
    return doc


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # a bad format string must not lose the line
        return f"{record.msg!s} (unformattable arguments)"


class JsonFormatter(logging.Formatter):
    """One JSON object per line, ASCII only (every control character and
    every non-ASCII character escaped)."""

    def __init__(self, secrets: Secrets = SECRETS) -> None:
        super().__init__()
        self._secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(fields(record, self._secrets), ensure_ascii=True, default=str)


class TextFormatter(logging.Formatter):
    """`ts level logger: msg key=value ...`, one line per record."""

    def __init__(self, secrets: Secrets = SECRETS) -> None:
        super().__init__()
        self._secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        doc = fields(record, self._secrets)
        head = (
            f"{doc.pop('ts')} {doc.pop('level').upper()} "
            f"{escape(doc.pop('logger'))}: {escape(doc.pop('msg'))}"
        )
        exc = doc.pop("exc", None)
        # Unset fields are left out: JSON keeps them for a stable schema,
        # a reader of text lines is better served without `key=null`.
        parts = [
            head,
            *(f"{escape(k)}={_text_value(v)}" for k, v in doc.items() if v is not None),
        ]
        if exc is not None:
            parts.append(f"exc={_text_value(exc)}")
        return " ".join(parts)


def _text_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = escape(text)
    if not text or any(c in text for c in ' "='):
        return '"' + text.replace('"', '\\"') + '"'
    return text


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


class _Handler(logging.StreamHandler[TextIO]):
    """The handler `configure` installs; marked so a second call replaces it."""


def configure(fmt: str, level: str, stream: TextIO | None = None) -> None:
    """Sends every record at `level` or above to stderr (or `stream`) as
    `fmt` ("json" or "text"); replaces an earlier configuration."""
    if fmt not in ("json", "text"):
        raise ValueError(f"log-format: {fmt!r} is not json or text")
    if level.lower() not in LEVELS:
        raise ValueError(f"log-level: {level!r} is not one of {', '.join(LEVELS)}")
    handler = _Handler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    threshold = LEVELS[level.lower()]
    root.setLevel(threshold)
    for name in _QUIET:
        logging.getLogger(name).setLevel(max(threshold, logging.WARNING))
    for name in _TERSE:
        logging.getLogger(name).setLevel(max(threshold, logging.INFO))


__all__ = [
    "MASK",
    "MIN_SECRET_LENGTH",
    "JsonFormatter",
    "NativeStderr",
    "Secrets",
    "TextFormatter",
    "add_secret_digests",
    "add_secrets",
    "configure",
    "escape",
    "fields",
    "native_record",
    "rfc3339",
]
