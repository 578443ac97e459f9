"""The operator's tool policy for framework adapters: each tool's effect and
whether its calls wait for an approver.

A framework's tool carries no trustworthy word on what it does to the world,
so the effect is the operator's to say, by tool name; a tool nobody named is
a SIDE_EFFECT without approval (ADR-010 D2). Free of I/O and of any framework.

    require_approval = false     # default for tools without their own word

    [tools.search_flights]
    effect = "read"              # "read" | "idempotent-write" | "side-effect"

    [tools.book_flight]
    effect = "side-effect"
    require_approval = true
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from effectd_client import Effect
from effectd_client._mcp_policy import EFFECT_NAMES


class ToolPolicyError(ValueError):
    """The tool policy is invalid; the message names the setting."""


@dataclass(frozen=True, slots=True)
class ToolRule:
    """The operator's word on one tool: its effect (None: SIDE_EFFECT) and
    whether its calls wait for an approver (None: the policy's default)."""

    effect: Effect | None = None
    require_approval: bool | None = None


def _no_tools() -> Mapping[str, ToolRule]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ToolDecision:
    """The effect and approval a call is prepared with."""

    effect: Effect
    require_approval: bool


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """The operator's tool policy: rules by tool name."""

    tools: Mapping[str, ToolRule] = field(default_factory=_no_tools)
    require_approval: bool = False

    def decide(self, tool: str) -> ToolDecision:
        """The effect and approval of a call of `tool`."""
        rule = self.tools.get(tool, ToolRule())
        approval = rule.require_approval
        if approval is None:
            approval = self.require_approval
        return ToolDecision(rule.effect or Effect.SIDE_EFFECT, approval)

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any]) -> ToolPolicy:
        """The policy a parsed document describes (the TOML layout above).

        Raises:
            ToolPolicyError: naming the setting that is wrong.
        """
        _keys("policy", doc, {"tools", "require_approval"})
        tools = doc.get("tools", {})
        _table("tools", tools)
        return cls(
            MappingProxyType(
                {name: _tool(f"tools.{name}", t) for name, t in tools.items()}
            ),
            _flag("require_approval", doc.get("require_approval", False)),
        )

    @classmethod
    def from_toml(cls, text: str) -> ToolPolicy:
        """The policy of a TOML text; raises `ToolPolicyError`."""
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ToolPolicyError(f"not valid TOML: {exc}") from None
        return cls.from_mapping(doc)


def _table(where: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise ToolPolicyError(f"{where}: must be a table")


def _keys(where: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ToolPolicyError(f"{where}: unknown setting {unknown[0]!r}")


def _flag(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ToolPolicyError(f"{where}: must be true or false")
    return value


def _tool(where: str, table: Any) -> ToolRule:
    _table(where, table)
    _keys(where, table, {"effect", "require_approval"})
    effect = None
    if "effect" in table:
        effect = EFFECT_NAMES.get(table["effect"])
        if effect is None:
            raise ToolPolicyError(f"{where}.effect: one of {', '.join(EFFECT_NAMES)}")
    approval = None
    if "require_approval" in table:
        approval = _flag(f"{where}.require_approval", table["require_approval"])
    return ToolRule(effect, approval)
