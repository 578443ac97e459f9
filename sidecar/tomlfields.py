"""Typed fields of a TOML table: the one checker that the policy file, the
provider routes, the tokens file and the settings file share. A table is
read against a mapping of its keys to `Field`s; an unknown key, a missing
required one, or a value of the wrong TOML type (a boolean is never a
number, though Python's bool is an int) raises `FieldError`, which names
where the value is (`retry.max_attempts`, `routes.a.base_url`) and never
quotes it: the value may be a secret. Each file's parser turns FieldError
into its own error at its one entry point.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# What a TOML value is called in a message, by the Python type tomllib gives
# it; bool before int, since a bool is an int.
_TYPE_NAMES: tuple[tuple[type, str], ...] = (
    (bool, "a boolean"),
    (int, "an integer"),
    (float, "a float"),
    (str, "a string"),
    (dict, "a table"),
    (list, "an array"),
    (datetime.date, "a date or time"),
    (datetime.time, "a date or time"),
)


class FieldError(ValueError):
    """A TOML value that is not what its field takes.

    Attributes:
        where: the value's place, tables and key joined by dots
            (`retry.max_attempts`); "" for the whole document.
        why: what is wrong, without quoting the value.
    """

    def __init__(self, where: str, why: str) -> None:
        super().__init__(where, why)
        self.where = where
        self.why = why

    def __str__(self) -> str:
        return f"{self.where}: {self.why}" if self.where else self.why


@dataclass(frozen=True, slots=True)
class Field:
    """One key of a table: the TOML types it takes, whether it must be there,
    and the inclusive range of a number."""

    types: type | tuple[type, ...]
    required: bool = False
    bounds: tuple[float, float] | None = None
    # How the message names what the field takes; default: its types
    # ("an integer", "a string or an integer").
    expected: str = ""

    @property
    def kinds(self) -> tuple[type, ...]:
        return self.types if isinstance(self.types, tuple) else (self.types,)

    def describe(self) -> str:
        return self.expected or " or ".join(type_name(k) for k in self.kinds)


def type_name(kind: type | object) -> str:
    """How a message names a TOML type (`a table`), given the type or a value."""
    cls = kind if isinstance(kind, type) else type(kind)
    for python_type, name in _TYPE_NAMES:
        if issubclass(cls, python_type):
            return name
    return cls.__name__


def join(where: str, key: str) -> str:
    """The place of `key` in the table at `where`."""
    return f"{where}.{key}" if where else key


def check(where: str, value: object, field: Field) -> Any:
    """The value, if its TOML type is one the field takes and a number is
    within the field's bounds; else FieldError."""
    kinds = field.kinds
    # bool is an int in Python; in TOML they are different types.
    if isinstance(value, bool):
        fits = bool in kinds
    else:
        fits = isinstance(value, tuple(k for k in kinds if k is not bool))
    if not fits:
        raise FieldError(where, f"must be {field.describe()}, not {type_name(value)}")
    if field.bounds is not None and isinstance(value, int | float):
        low, high = field.bounds
        if not low <= value <= high:
            raise FieldError(where, f"must be between {_num(low)} and {_num(high)}")
    return value


def known(
    where: str,
    table: object,
    fields: Mapping[str, Field],
    *,
    what: str = "setting",
    unknown: Callable[[str], str] | None = None,
) -> dict[str, Any]:
    """The table, if it is one, has no key but the fields' and every required
    one; its values are not checked (see `check`, `read`).

    Args:
        where: the table's place ("" for the document).
        table: the value found there.
        fields: the keys the table may have.
        what: what a key is called: "unknown setting", "unknown section".
        unknown: says why a key is refused instead (to suggest a spelling).
    """
    if not isinstance(table, dict):
        raise FieldError(where, "must be a table")
    for key in table:
        if key not in fields:
            why = (
                unknown(key)
                if unknown is not None
                else f"unknown {what} (known: {', '.join(fields)})"
            )
            raise FieldError(join(where, key), why)
    for key, field in fields.items():
        if field.required and key not in table:
            raise FieldError(join(where, key), "is required")
    return table


def read(
    where: str,
    table: object,
    fields: Mapping[str, Field],
    *,
    what: str = "setting",
    unknown: Callable[[str], str] | None = None,
) -> dict[str, Any]:
    """`known`, then `check` of every value: the table, every value typed."""
    found = known(where, table, fields, what=what, unknown=unknown)
    return {k: check(join(where, k), v, fields[k]) for k, v in found.items()}


def _num(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)
