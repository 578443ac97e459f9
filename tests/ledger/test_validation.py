"""Field rules for what a client sends (contract §3.1 identity, §11.1 bad input).

Each rule appends a violation naming the field instead of raising, so the
tables check both that a bad value is named and that a good one is not.
"""

from __future__ import annotations

import pytest

from sidecar.errors import FieldViolation, InvalidArgument
from sidecar.ledger.model import DEFAULT_NAMESPACE
from sidecar.ledger.validation import Limits, Violations

MAX_ID = Limits().max_id_bytes


def _fields(v: Violations) -> list[str]:
    return [item.field for item in v.items]


def test_the_identifier_limit_is_256_bytes() -> None:
    """The default identifier bound is the 256 bytes of contract §3.1."""
    assert MAX_ID == 256


@pytest.mark.parametrize(
    "value",
    ["a", "default", "team-a", "Team_A.prod-2", "0", "a" * 64, "...", "-_-"],
)
def test_a_valid_namespace_is_accepted_as_given(value: str) -> None:
    """A namespace of 1..64 characters of [A-Za-z0-9._-] passes unchanged."""
    # contract §3.1 namespace.
    v = Violations()
    assert v.namespace("ref.namespace", value) == value
    assert v.items == []


def test_an_empty_namespace_is_the_default() -> None:
    """An empty namespace means `default`."""
    # contract §3.1 "empty means `default`".
    v = Violations()
    assert v.namespace("ref.namespace", "") == DEFAULT_NAMESPACE == "default"
    assert v.items == []


@pytest.mark.parametrize(
    "value",
    [
        "a" * 65,  # too long
        "a b",
        "a/b",
        "a:b",
        "ns\n",  # a trailing newline must not slip through `$`
        "\nns",
        "é",
        "a\x00",
        "ns*",
    ],
    ids=repr,
)
def test_an_invalid_namespace_is_named(value: str) -> None:
    """A namespace outside [A-Za-z0-9._-]{1,64} is a violation of its field."""
    # contract §3.1 namespace; §11.1 INVALID_ARGUMENT with field violations.
    v = Violations()
    v.namespace("ref.namespace", value)
    assert _fields(v) == ["ref.namespace"]


@pytest.mark.parametrize(
    "value",
    [
        "r",
        "run-1",
        "é" * (MAX_ID // 2),  # 2 bytes each: exactly 256 bytes
        "😀" * (MAX_ID // 4),  # 4 bytes each: exactly 256 bytes
        "a" * MAX_ID,
        "run with spaces",
        "日本語",
        "\u2028",  # a separator, not a control character (Unicode Cc)
    ],
    ids=lambda s: f"{len(s)}ch",
)
def test_a_valid_identifier_is_accepted(value: str) -> None:
    """1..256 bytes of UTF-8 without control characters is a valid identifier."""
    # contract §3.1 "1..256 bytes of UTF-8 without control characters".
    v = Violations()
    v.text_id("ref.run_id", value, MAX_ID, no_colon=True)
    v.text_id("ref.call_id", value, MAX_ID)
    assert v.items == []


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "is required"),  # contract §3.1 "1.."
        ("a" * (MAX_ID + 1), "at most 256 bytes"),
        # contract §3.1 counts bytes of UTF-8, not characters.
        ("é" * (MAX_ID // 2 + 1), "got 258"),
        ("😀" * (MAX_ID // 4 + 1), "got 260"),
        ("a" * (MAX_ID - 1) + "é", "got 257"),
        # contract §3.1 "without control characters (C0, DEL, C1)".
        ("a\x00b", "control characters"),
        ("a\nb", "control characters"),
        ("a\tb", "control characters"),
        ("a\rb", "control characters"),
        ("\x1f", "control characters"),
        ("a\x7f", "control characters"),
        ("a\x85", "control characters"),
        ("\x9f", "control characters"),
        # Not UTF-8 at all: a lone surrogate cannot be encoded.
        ("a\ud800", "valid UTF-8"),
        ("\udfff", "valid UTF-8"),
        ("\ud83d\ude00", "valid UTF-8"),  # a surrogate pair as two code points
    ],
    ids=repr,
)
def test_an_invalid_identifier_is_named(value: str, why: str) -> None:
    """An empty, oversized, control-character or non-UTF-8 identifier is a
    violation of its field, saying why."""
    # contract §3.1 identity; §11.1 INVALID_ARGUMENT with BadRequest field violations.
    v = Violations()
    v.text_id("ref.call_id", value, MAX_ID)
    assert _fields(v) == ["ref.call_id"]
    assert why in v.items[0].description


@pytest.mark.parametrize("value", [":", "a:b", "run:", ":run"])
def test_a_run_id_with_a_colon_is_refused(value: str) -> None:
    """A run_id containing ':' is refused: the key `${runId}:${callId}` would be
    ambiguous."""
    # contract §3.1 "`run_id` has no `:`"; ADR-010 D2.
    v = Violations()
    v.text_id("ref.run_id", value, MAX_ID, no_colon=True)
    assert _fields(v) == ["ref.run_id"]
    assert "':'" in v.items[0].description


@pytest.mark.parametrize("value", ["a:b", "tool:call:1"])
def test_a_call_id_may_contain_a_colon(value: str) -> None:
    """Only run_id is restricted: a call_id with ':' keeps the key unambiguous."""
    # contract §3.1: `run a` + call `b:c` is unambiguous once run_id has no ':'.
    v = Violations()
    v.text_id("ref.call_id", value, MAX_ID)
    assert v.items == []


def test_every_problem_of_an_identifier_is_named() -> None:
    """An identifier with several problems gets one violation for each."""
    # contract §11.1: one answer names every bad field.
    v = Violations()
    v.text_id("ref.run_id", "a:\x00\ud800" + "a" * MAX_ID, MAX_ID, no_colon=True)
    descriptions = [item.description for item in v.items]
    assert len(descriptions) == 4
    assert _fields(v) == ["ref.run_id"] * 4


@pytest.mark.parametrize(
    "value", ["", "plain", "two\nlines", "tab\there", "\n\t\n", "é" * 10, "x" * 64]
)
def test_free_text_allows_newline_and_tab(value: str) -> None:
    """Free text may be empty and may contain newlines and tabs."""
    # validation.py Violations.text: reasons and actors are printable lines.
    v = Violations()
    v.text("reason", value, 64)
    assert v.items == []


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("x" * 65, "at most 64 bytes"),
        ("é" * 33, "got 66"),  # bytes, not characters
        ("a\rb", "control characters"),
        ("a\x00", "control characters"),
        ("a\x7f", "control characters"),
        ("a\x9b", "control characters"),
        ("a\ud800", "valid UTF-8"),
    ],
    ids=repr,
)
def test_free_text_refuses_other_control_characters_and_oversize(
    value: str, why: str
) -> None:
    """Free text longer than its bound, with another control character or not
    UTF-8 is a violation of its field."""
    # contract §11.1 INVALID_ARGUMENT with field violations.
    v = Violations()
    v.text("reason", value, 64)
    assert _fields(v) == ["reason"]
    assert why in v.items[0].description


@pytest.mark.parametrize(
    ("data", "ok"),
    [(b"", True), (b"x" * 16, True), (b"x" * 17, False), ("é".encode() * 8, True)],
    ids=["empty", "at-limit", "over", "utf8-at-limit"],
)
def test_size_bounds_bytes(data: bytes, ok: bool) -> None:
    """`size` accepts up to `max_bytes` bytes and names the field beyond that."""
    v = Violations()
    v.size("input.json", data, 16)
    assert _fields(v) == ([] if ok else ["input.json"])


@pytest.mark.parametrize(
    ("value", "ok"),
    [(1, True), (5, True), (10, True), (0, False), (11, False), (-1, False)],
)
def test_bounded_is_inclusive(value: int, ok: bool) -> None:
    """`bounded` accepts low..high inclusive and names the field outside it."""
    v = Violations()
    v.bounded("lease_ms", value, 1, 10)
    assert _fields(v) == ([] if ok else ["lease_ms"])
    if not ok:
        assert f"got {value}" in v.items[0].description


def test_require_raises_every_violation_together() -> None:
    """`require` raises one InvalidArgument listing every violation, in order."""
    # contract §11.1: bad input is INVALID_ARGUMENT with BadRequest field violations.
    v = Violations()
    v.namespace("ref.namespace", "bad ns")
    v.text_id("ref.run_id", "a:b", MAX_ID, no_colon=True)
    v.text_id("ref.call_id", "", MAX_ID)
    v.bounded("lease_ms", 0, 1, 10)
    with pytest.raises(InvalidArgument) as raised:
        v.require()
    assert [f.field for f in raised.value.violations] == [
        "ref.namespace",
        "ref.run_id",
        "ref.call_id",
        "lease_ms",
    ]
    assert all(isinstance(f, FieldViolation) for f in raised.value.violations)
    assert raised.value.reason == "INVALID_REQUEST"


def test_require_without_violations_does_nothing() -> None:
    """A request with no violation passes `require`."""
    v = Violations()
    v.namespace("ref.namespace", "")
    v.text_id("ref.run_id", "run-1", MAX_ID, no_colon=True)
    v.require()
