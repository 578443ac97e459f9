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

What native code writes to file descriptor 2 itself is logged through these
formatters too: see `sidecar.observability.native` (`NativeStderr`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sys
import threading
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

from sidecar import tracecontext as trace
from sidecar.observability.native import NativeStderr, native_record

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
