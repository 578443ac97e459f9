"""The operator's tool policy, shared by the framework adapters: each tool's
effect, whether its calls wait for an approver, and whether a call of unknown
outcome runs again.

A framework's tool carries no trustworthy word on what it does to the world,
so the effect is the operator's to say, by tool name; a tool nobody named is
a SIDE_EFFECT without approval (ADR-010 D2). `ToolPolicy` is the whole
policy (rules by tool name, and the default approval); `ToolRule` is one
tool's word. `effectd_client.contrib.langgraph` and
`effectd_client.contrib.pydantic_ai` take a `ToolPolicy`;
`effectd_client.contrib.mcp`'s `McpPolicy` pins rules by server and tool in
the same words. Free of I/O and of any framework.

    require_approval = false     # default for tools without their own word

    [tools.search_flights]
    effect = "read"              # "read" | "idempotent-write" | "side-effect"
    retry_unknown = true         # run a call of unknown outcome again

    [tools.book_flight]
    effect = "side-effect"
    require_approval = true
"""

from __future__ import annotations

import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from effectd_client._types import Effect

__all__ = [
    "EFFECT_NAMES",
    "PolicyError",
    "ToolDecision",
    "ToolPolicy",
    "ToolRule",
]

# The policy file's words for the effects.
EFFECT_NAMES: Mapping[str, Effect] = MappingProxyType(
    {
        "read": Effect.READ,
        "idempotent-write": Effect.IDEMPOTENT_WRITE,
        "side-effect": Effect.SIDE_EFFECT,
    }
)
# The settings of one tool's table.
RULE_KEYS = ("effect", "require_approval", "retry_unknown")


class PolicyError(ValueError):
    """A tool or MCP policy is invalid; the message names the setting."""


@dataclass(frozen=True, slots=True)
class ToolRule:
    """The operator's word on one tool.

    Args:
        effect: The tool's effect; None: SIDE_EFFECT (for an MCP tool: not
            pinned).
        require_approval: An approver must approve each call (bound to its
            arguments) before it runs; None: the policy's default.
        retry_unknown: Start a call of unknown outcome again (the daemon
            never does for a SIDE_EFFECT); None: the adapter's default
            (Pydantic AI: READ and IDEMPOTENT_WRITE run again; LangGraph:
            an interrupt asks a human).
    """

    effect: Effect | None = None
    require_approval: bool | None = None
    retry_unknown: bool | None = None


@dataclass(frozen=True, slots=True)
class ToolDecision:
    """The effect, approval and retry a call is prepared with."""

    effect: Effect
    require_approval: bool
    retry_unknown: bool | None = None


def _no_tools() -> Mapping[str, ToolRule | Effect]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """The operator's tool policy: rules by tool name (a bare `Effect` is a
    rule with just that effect), and the approval of the rest."""

    tools: Mapping[str, ToolRule | Effect] = field(default_factory=_no_tools)
    require_approval: bool = False

    def __post_init__(self) -> None:
        # A copy: the caller's dict changed later changes no policy.
        object.__setattr__(self, "tools", MappingProxyType(dict(self.tools)))

    def rule(self, tool: str) -> ToolRule:
        """The operator's word on `tool` (empty when it says nothing)."""
        rule = self.tools.get(tool, ToolRule())
        return ToolRule(rule) if isinstance(rule, Effect) else rule

    def decide(self, tool: str) -> ToolDecision:
        """The effect, approval and retry of a call of `tool`."""
        rule = self.rule(tool)
        approval = rule.require_approval
        if approval is None:
            approval = self.require_approval
        return ToolDecision(
            rule.effect or Effect.SIDE_EFFECT, approval, rule.retry_unknown
        )

    @classmethod
    def of(
        cls, policy: ToolPolicy | Mapping[str, ToolRule | Effect] | None
    ) -> ToolPolicy:
        """A policy, or one of rules by tool name; None: the empty policy."""
        if isinstance(policy, ToolPolicy):
            return policy
        return cls(policy or {})

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any]) -> ToolPolicy:
        """The policy a parsed document describes (the TOML layout above).

        Raises:
            PolicyError: naming the setting that is wrong.
        """
        check_keys("policy", doc, {"tools", "require_approval"})
        tools = doc.get("tools", {})
        check_table("tools", tools)
        return cls(
            {name: parse_rule(f"tools.{name}", t) for name, t in tools.items()},
            parse_flag("require_approval", doc.get("require_approval", False)),
        )

    @classmethod
    def from_toml(cls, text: str) -> ToolPolicy:
        """The policy of a TOML text; raises `PolicyError`."""
        return cls.from_mapping(load_toml(text))


def load_toml(text: str) -> dict[str, Any]:
    """A policy file's document; raises `PolicyError` when it is not TOML."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"not valid TOML: {exc}") from None


def check_table(where: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise PolicyError(f"{where}: must be a table")


def check_keys(where: str, table: Mapping[str, Any], allowed: Collection[str]) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise PolicyError(f"{where}: unknown setting {unknown[0]!r}")


def parse_flag(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(f"{where}: must be true or false")
    return value


def parse_rule(where: str, table: Any, keys: Collection[str] = RULE_KEYS) -> ToolRule:
    """One tool's table (`keys`: the settings it may have) as its rule."""
    check_table(where, table)
    check_keys(where, table, keys)
    effect = None
    if "effect" in table:
        effect = EFFECT_NAMES.get(table["effect"])
        if effect is None:
            raise PolicyError(f"{where}.effect: one of {', '.join(EFFECT_NAMES)}")
    flags = {
        name: parse_flag(f"{where}.{name}", table[name])
        for name in ("require_approval", "retry_unknown")
        if name in table
    }
    return ToolRule(effect, **flags)
