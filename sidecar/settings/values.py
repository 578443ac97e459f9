"""How one layer's raw value becomes a setting's value, by the setting's
kind: a flag's or a variable's text, or a value of the TOML file, which is
first checked by its TOML type (`sidecar.tomlfields`) and then, where the
kind has a text form (sizes, booleans), read like a variable's text.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path

from sidecar.settings.table import Kind, Setting
from sidecar.tomlfields import Field, FieldError, check

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})
# The TOML types each kind takes in the file: a size may be a number of bytes
# or text ("8MiB"); a boolean also the text and the integers 0 and 1.
_TOML_TYPES: Mapping[Kind, tuple[type, ...]] = {
    Kind.PATH: (str,),
    Kind.TEXT: (str,),
    Kind.SIZE: (int, str),
    Kind.INT: (int,),
    Kind.FLOAT: (int, float),
    Kind.BOOL: (bool, str, int),
}


class Invalid(Exception):
    """A value that cannot be read; the caller names the setting."""


def field(s: Setting) -> Field:
    """The TOML field of a setting in the settings file."""
    return Field(_TOML_TYPES[s.kind], expected=s.kind.value)


def parse_size(text: str) -> int:
    """Bytes from `8MiB`, `8M`, `512k`, `1.5g` or a plain number of bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    bare = text.strip().lower().removesuffix("ib").removesuffix("b").strip()
    try:
        if bare and bare[-1] in units:
            return int(float(bare[:-1]) * units[bare[-1]])
        return int(bare)
    except (ValueError, OverflowError):
        raise ValueError(
            f"{text!r} is not a size (bytes, or e.g. 512k, 8MiB)"
        ) from None


def format_size(size: int) -> str:
    """`8GiB` for a whole number of a unit, else the bytes; `parse_size`
    reads either back to the same number."""
    for suffix, unit in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if size and size % unit == 0:
            return f"{size // unit}{suffix}"
    if size and size % (1 << 10) == 0:
        return f"{size >> 10}KiB"
    return str(size)


def from_flag(s: Setting, raw: object) -> object:
    """A flag's value: its text, or a boolean flag's True/False."""
    if isinstance(raw, bool):
        return raw
    return from_text(s, str(raw))


def from_text(s: Setting, text: str) -> object:
    """A flag's or variable's text as the setting's value."""
    if not text.strip():
        if s.optional:
            return None
        raise Invalid("must not be empty")
    try:
        return _TEXT_READERS[s.kind](s, text)
    except ValueError as exc:
        if s.kind is Kind.SIZE:
            raise Invalid(str(exc)) from None
        raise Invalid(f"{text!r} is not {s.kind.value}") from None


def from_toml(s: Setting, value: object) -> object:
    """A TOML value as the setting's value."""
    try:
        check("", value, field(s))
    except FieldError as exc:
        raise Invalid(exc.why) from None
    if isinstance(value, str):
        return from_text(s, value)
    if s.kind is Kind.BOOL:
        if isinstance(value, bool):
            return value
        return from_text(s, str(value))  # 0 or 1; any other is refused
    if s.kind is Kind.FLOAT:
        assert isinstance(value, int | float)
        if not math.isfinite(value):
            raise Invalid(f"{value!r} is not a finite number")
        return float(value)
    return value


def _choice(s: Setting, text: str) -> str:
    if not s.choices:
        return text
    word = text.strip().lower()
    if word not in s.choices:
        raise Invalid(f"{text!r} is not one of {', '.join(s.choices)}")
    return word


def _finite(s: Setting, text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise Invalid(f"{text!r} is not a finite number")
    return number


def _boolean(s: Setting, text: str) -> bool:
    word = text.strip().lower()
    if word not in _TRUE | _FALSE:
        raise Invalid(f"{text!r} is not {s.kind.value}")
    return word in _TRUE


_TEXT_READERS: Mapping[Kind, Callable[[Setting, str], object]] = {
    Kind.PATH: lambda s, text: Path(text),
    Kind.TEXT: _choice,
    Kind.SIZE: lambda s, text: parse_size(text),
    Kind.INT: lambda s, text: int(text),
    Kind.FLOAT: _finite,
    Kind.BOOL: _boolean,
}
