"""How `effectd ctl` prints: aligned tables for people, JSON for scripts.

Every record printed is the daemon's own message, which becomes JSON in the
one shape of `sidecar.ctl.schema`; every command prints through one of two
functions, `table` or `emit_json`.
"""

from __future__ import annotations

import json
import sys
import unicodedata
from collections.abc import Sequence
from typing import Any, TextIO

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from sidecar.ctl import schema


def jsonable(value: Any) -> Any:
    """The JSON value of a record (a generated message, in the one shape of
    `sidecar.ctl.schema`) or of a container of records and plain values."""
    if isinstance(value, Message):
        return schema.record(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"no JSON shape for {type(value).__name__}")


def emit_json(value: Any, out: TextIO | None = None) -> None:
    """Prints one JSON document (sorted keys, one trailing newline)."""
    print(
        json.dumps(jsonable(value), indent=2, sort_keys=True, ensure_ascii=False),
        file=out or sys.stdout,
    )


def printable(text: str) -> str:
    """`text` with every control, format (bidi overrides, zero-width) and
    line or paragraph separator character escaped, so what someone else
    wrote cannot move the cursor, recolour or reorder what is printed."""
    return "".join(
        c.encode("unicode_escape").decode("ascii")
        if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")
        else c
        for c in text
    )


def _cell(value: object) -> str:
    # One row stays one line whatever an agent or operator wrote.
    return str(value).replace("\n", "\\n").replace("\t", " ")


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], out: TextIO | None = None
) -> None:
    """Prints rows under headers in columns padded to the widest cell."""
    cells = [[_cell(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    stream = out or sys.stdout
    for row in [list(headers), *cells]:
        line = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
        print(line.rstrip(), file=stream)


def fields(pairs: Sequence[tuple[str, object]], out: TextIO | None = None) -> None:
    """Prints `name  value` lines, names padded to the longest one."""
    width = max((len(name) for name, _ in pairs), default=0)
    for name, value in pairs:
        print(f"{name.ljust(width)}  {_cell(value)}".rstrip(), file=out or sys.stdout)


def when(ts: Timestamp) -> str:
    """A timestamp in UTC to the millisecond; "-" when unset."""
    if not ts.seconds and not ts.nanos:
        return "-"
    text = ts.ToDatetime().isoformat(timespec="milliseconds")
    return f"{text}Z"


def enum_name(text: str, prefix: str) -> str:
    """`CALL_STATE_UNKNOWN` -> `UNKNOWN` for a generated enum value name."""
    return text.removeprefix(prefix)


def age(ns: int) -> str:
    """A span of time in its two largest units: `42s`, `12m`, `3h12m`,
    `2d4h`; a span below zero (another machine's clock) is `0s`."""
    seconds = max(0, ns // 1_000_000_000)
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{minutes}m"
    if seconds < 86400:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
