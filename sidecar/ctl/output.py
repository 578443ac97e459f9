"""How `effectd ctl` prints: aligned tables for people, JSON for scripts.

Typed client values (frozen dataclasses and enums) and generated protobuf
messages both become plain JSON values here, so every command prints through
one of two functions, `table` or `emit_json`.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
import sys
import unicodedata
from collections.abc import Sequence
from typing import Any, TextIO

from effectd.v1 import ledger_pb2 as pb
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp


def jsonable(value: Any) -> Any:
    """A JSON value of a client dataclass, enum, message or container."""
    if isinstance(value, Message):
        return MessageToDict(
            value,
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
        )
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
        }
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return [jsonable(v) for v in value] if isinstance(value, list | tuple) else value


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


def state_name(value: pb.CallState.ValueType) -> str:
    """A call state as the console prints it, "-" for none."""
    if value == pb.CALL_STATE_UNSPECIFIED:
        return "-"
    return enum_name(pb.CallState.Name(value), "CALL_STATE_")
