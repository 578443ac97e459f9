"""W3C Trace Context parsing: the specification's valid and invalid headers."""

from __future__ import annotations

import pytest

from sidecar import tracecontext as trace
from sidecar.tracecontext import TraceParent, from_metadata, parse_traceparent

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{PARENT}-01"


@pytest.mark.parametrize(
    ("header", "flags", "version"),
    [
        (VALID, "01", "00"),  # the specification's example, sampled
        (f"00-{TRACE}-{PARENT}-00", "00", "00"),  # not sampled
        (f"00-{TRACE}-{PARENT}-ff", "ff", "00"),  # unknown flags are kept
        # A higher version is read forward-compatibly: its first four fields.
        (f"01-{TRACE}-{PARENT}-01", "01", "01"),
        (f"cc-{TRACE}-{PARENT}-01-what-the-future-will-be", "01", "cc"),
        (f"fe-{TRACE}-{PARENT}-09-x", "09", "fe"),
    ],
)
def test_valid_traceparents_are_read(header: str, flags: str, version: str) -> None:
    """Each header the specification accepts gives its trace-id, parent-id,
    flags and version."""
    parsed = parse_traceparent(header)
    assert parsed == TraceParent(TRACE, PARENT, flags, version)


@pytest.mark.parametrize(
    "header",
    [
        "",
        "00",
        f"00-{TRACE}-{PARENT}",  # no flags
        f"00-{TRACE}-{PARENT}-01-",  # version 00 has exactly four fields
        f"00-{TRACE}-{PARENT}-01-extra",
        f"00-{TRACE}-{PARENT}-1",  # short flags
        f"00-{TRACE}-{PARENT}-0g",  # flags not hex
        f"00-{TRACE.upper()}-{PARENT}-01",  # uppercase hex
        f"00-{TRACE}-{PARENT.upper()}-01",
        f"00-{'0' * 32}-{PARENT}-01",  # all-zero trace-id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent-id
        f"00-{TRACE[:-1]}-{PARENT}0-01",  # dash in the wrong place
        f"00-{TRACE}z-{PARENT[1:]}-01",
        f"00_{TRACE}_{PARENT}_01",  # wrong separators
        f" 00-{TRACE}-{PARENT}-01",  # no whitespace is allowed
        f"00-{TRACE}-{PARENT}-01 ",
        f"ff-{TRACE}-{PARENT}-01",  # version ff is invalid
        f"0g-{TRACE}-{PARENT}-01",  # version not hex
        f"0A-{TRACE}-{PARENT}-01",  # uppercase version
        f"01-{TRACE}-{PARENT}-01x",  # higher version: a dash must follow
        f"00-{TRACE}-{PARENT}-01\r\nx-injected: 1",  # header injection
    ],
)
def test_invalid_traceparents_are_refused(header: str) -> None:
    """Anything the specification does not accept parses to None: it is
    ignored, never repaired."""
    assert parse_traceparent(header) is None


def test_child_keeps_trace_and_flags_with_a_new_parent() -> None:
    """A child has the caller's trace-id and flags, its own non-zero
    parent-id, version 00, and the caller's tracestate."""
    parent = TraceParent(TRACE, PARENT, "01", "cc", "vendor=abc")
    children = {parent.child() for _ in range(20)}
    for child in children:
        assert (child.trace_id, child.flags, child.version) == (TRACE, "01", "00")
        assert child.parent_id != PARENT
        assert parse_traceparent(child.header()) is not None
        assert child.headers() == [
            ("traceparent", f"00-{TRACE}-{child.parent_id}-01"),
            ("tracestate", "vendor=abc"),
        ]
    assert len({c.parent_id for c in children}) > 1


def test_tracestate_is_kept_as_received_or_dropped() -> None:
    """tracestate is forwarded as is; an oversized or non-printable one is
    dropped, and without a valid traceparent it is never read."""
    assert parse_traceparent(VALID, "a=1,b=2").tracestate == "a=1,b=2"  # type: ignore[union-attr]
    assert parse_traceparent(VALID, "a=1\r\nx: y").tracestate == ""  # type: ignore[union-attr]
    assert parse_traceparent(VALID, "a=" + "x" * 600).tracestate == ""  # type: ignore[union-attr]
    assert parse_traceparent("bogus", "a=1") is None


def test_metadata_gives_the_context() -> None:
    """From gRPC metadata: one traceparent is read, tracestate entries join;
    two traceparents are ambiguous and ignored."""
    found = from_metadata(
        [("traceparent", VALID), ("tracestate", "a=1"), ("tracestate", "b=2")]
    )
    assert found == TraceParent(TRACE, PARENT, "01", "00", "a=1,b=2")
    assert from_metadata([("traceparent", VALID), ("traceparent", VALID)]) is None
    assert from_metadata([("tracestate", "a=1")]) is None
    assert from_metadata([("traceparent-bin", b"\x00")]) is None
    assert from_metadata(None) is None


def test_current_is_none_outside_an_rpc() -> None:
    """Code that runs for no RPC sees no trace context."""
    assert trace.current() is None
    token = trace.CURRENT.set(parse_traceparent(VALID))
    try:
        assert trace.current() == TraceParent(TRACE, PARENT, "01")
    finally:
        trace.CURRENT.reset(token)
    assert trace.current() is None
