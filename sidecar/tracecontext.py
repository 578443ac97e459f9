"""W3C Trace Context (traceparent, tracestate): parsing and propagation.

The gRPC gate reads `traceparent` and `tracestate` from an RPC's metadata
into `CURRENT`, a context variable, so whatever runs for that RPC (log lines,
provider calls) sees it without passing it along. Without OpenTelemetry
effectd records no spans: a provider call forwards a child of the caller's
context (same trace-id and flags, a fresh parent-id), so the upstream's spans
join the agent's trace; with it, the RPC's own server span is the parent.
Parsing is strict, as the specification asks: a malformed header is ignored,
never repaired, and never forwarded.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
VERSION = "00"
# The specification's recommended limit; a longer tracestate may be dropped.
MAX_TRACESTATE = 512

_HEX = re.compile(r"[0-9a-f]+")
# Forwarded as an HTTP header value: printable ASCII only, no CR/LF.
_TRACESTATE = re.compile(r"[\x20-\x7e]*")
_VERSION_00_LENGTH = 55


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A valid trace context; `tracestate` is kept as received."""

    trace_id: str
    parent_id: str
    flags: str
    version: str = VERSION
    tracestate: str = ""
    # parent_id is a span effectd records itself (OpenTelemetry on, see
    # sidecar.observability.otel): the requests it sends are its children.
    recorded: bool = False

    @property
    def sampled(self) -> bool:
        return bool(int(self.flags, 16) & 1)

    def child(self) -> TraceParent:
        """The context of a request effectd sends on the caller's behalf: the
        same trace and flags, a new random parent-id, version 00. A recorded
        span is itself the parent of those requests: its id is forwarded."""
        if self.recorded:
            return self
        parent = "0" * 16
        while parent == "0" * 16:
            parent = secrets.token_hex(8)
        return TraceParent(self.trace_id, parent, self.flags, VERSION, self.tracestate)

    def header(self) -> str:
        """The traceparent header value (always version 00, which we speak)."""
        return f"{VERSION}-{self.trace_id}-{self.parent_id}-{self.flags}"

    def headers(self) -> list[tuple[str, str]]:
        """traceparent, and tracestate when there is one."""
        out = [(TRACEPARENT, self.header())]
        if self.tracestate:
            out.append((TRACESTATE, self.tracestate))
        return out


def _hex(value: str, length: int) -> bool:
    return len(value) == length and _HEX.fullmatch(value) is not None


def _framed(value: str) -> bool:
    """The version is known or higher (not ff), the length fits it, and the
    dashes are where version 00 has them."""
    if len(value) < _VERSION_00_LENGTH:
        return False
    version = value[:2]
    if not _hex(version, 2) or version == "ff":
        return False
    if version == VERSION and len(value) != _VERSION_00_LENGTH:
        return False
    if len(value) > _VERSION_00_LENGTH and value[_VERSION_00_LENGTH] != "-":
        return False
    return value[2] == value[35] == value[52] == "-"


def parse_traceparent(value: str, tracestate: str = "") -> TraceParent | None:
    """The trace context in a traceparent header, or None if it is invalid.

    Version 00 has exactly four fields. A higher version (not `ff`) is read
    forward-compatibly: its first four fields as version 00's, anything
    after them only if separated by `-`. trace-id and parent-id are lowercase
    hex and not all zeros. `tracestate` is kept if it is at most 512
    printable ASCII characters, dropped otherwise.
    """
    if not _framed(value):
        return None
    head = value[:_VERSION_00_LENGTH]
    trace_id, parent_id, flags = head[3:35], head[36:52], head[53:55]
    if not (_hex(trace_id, 32) and _hex(parent_id, 16) and _hex(flags, 2)):
        return None
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    state = tracestate.strip()
    if len(state) > MAX_TRACESTATE or _TRACESTATE.fullmatch(state) is None:
        state = ""
    return TraceParent(trace_id, parent_id, flags, value[:2], state)


def from_metadata(
    metadata: Iterable[tuple[str, str | bytes]] | None,
) -> TraceParent | None:
    """The trace context of gRPC invocation metadata, or None.

    Several traceparent entries are ambiguous and ignored; several tracestate
    entries are one list, joined with commas (W3C, like HTTP headers).
    """
    parents: list[str] = []
    states: list[str] = []
    for key, value in metadata or ():
        if isinstance(value, bytes):
            continue
        if key == TRACEPARENT:
            parents.append(value)
        elif key == TRACESTATE:
            states.append(value)
    if len(parents) != 1:
        return None
    return parse_traceparent(parents[0], ",".join(states))


# The trace context of the RPC being served; None outside of one.
CURRENT: ContextVar[TraceParent | None] = ContextVar("effectd_trace", default=None)


def current() -> TraceParent | None:
    """The trace context of the RPC this code runs for, if it brought one."""
    return CURRENT.get()


__all__ = [
    "CURRENT",
    "TRACEPARENT",
    "TRACESTATE",
    "TraceParent",
    "current",
    "from_metadata",
    "parse_traceparent",
]
