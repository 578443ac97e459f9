"""The one JSON shape of `effectd ctl --json` (docs/operations.md, "JSON for
scripts"): every record is its protobuf message, field for field as the
.proto names it, every field present, with four rules wherever it appears:

- an enum value is its name without the enum's prefix (`UNKNOWN`, not
  `CALL_STATE_UNKNOWN`), and null when unspecified;
- a 64-bit integer is a JSON number, never a string;
- a time is RFC 3339 in UTC with microseconds (`2026-12-02T10:02:03.123456Z`),
  and null when unset; so is an unset message, or an unset member of a oneof
  or an optional field;
- bytes are base64.

A tool call also carries `display_state` (`sidecar.ctl.states`): the state
a person reads, REJECTED for a call an approver rejected, which is COMMITTED
on the wire.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any, cast

from effectd.v1 import ledger_pb2 as pb
from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from sidecar.ctl.states import display_state


def enum_value(enum: EnumDescriptor, number: int) -> str | None:
    """An enum value's name without its prefix; None for 0 (unspecified).
    The prefix is the name of the enum's value 0 less `UNSPECIFIED`."""
    if number == 0:
        return None
    prefix = enum.values_by_number[0].name.removesuffix("UNSPECIFIED")
    value = enum.values_by_number.get(number)
    return str(number) if value is None else value.name.removeprefix(prefix)


def rfc3339(seconds: int, nanos: int) -> str:
    """A time in UTC, RFC 3339 with microseconds."""
    at = datetime.fromtimestamp(seconds, UTC).replace(microsecond=nanos // 1000)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def record(msg: Message) -> dict[str, Any]:
    """`msg` as the JSON object of its record."""
    doc: dict[str, Any] = {}
    for f in msg.DESCRIPTOR.fields:
        doc[f.name] = _field(msg, cast(FieldDescriptor, f))
    if isinstance(msg, pb.ToolCall):
        doc["display_state"] = display_state(msg)
    return doc


def _field(msg: Message, f: FieldDescriptor) -> Any:
    value = getattr(msg, f.name)
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        entry = f.message_type.fields_by_name["value"]
        return {str(k): _value(entry, v) for k, v in sorted(value.items())}
    if f.is_repeated:
        return [_value(f, v) for v in value]
    if f.has_presence and not msg.HasField(f.name):
        return None
    return _value(f, value)


def _value(f: FieldDescriptor, value: Any) -> Any:
    if isinstance(value, Timestamp):
        unset = not value.seconds and not value.nanos
        return None if unset else rfc3339(value.seconds, value.nanos)
    if isinstance(value, Message):
        return record(value)
    if f.enum_type is not None:
        return enum_value(f.enum_type, value)
    if f.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    return value
