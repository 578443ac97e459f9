"""The operator's MCP policy: which effect a `tools/call` is recorded with.

The effect of an MCP tool is the operator's to say, pinned by server and tool;
a tool nobody pinned is a SIDE_EFFECT (ADR-010 D2). The server's annotations
(`readOnlyHint`, `destructiveHint`, `idempotentHint`) are hints the MCP
specification tells clients not to trust from an untrusted server, so they may
only make a call more conservative, never less, unless the operator trusts that
server:

  1. the base: the tool's pinned effect; else, for a trusted server, the
     effect its annotations claim (spec defaults for absent hints); else
     SIDE_EFFECT;
  2. the floor, from the hints the server did state (from any server): it
     says it writes (`readOnlyHint: false`, `destructiveHint: true` or
     `idempotentHint: false`) -> at least IDEMPOTENT_WRITE when it also says
     `idempotentHint: true`, else SIDE_EFFECT;
  3. the effect is the more conservative of the two
     (READ < IDEMPOTENT_WRITE < SIDE_EFFECT).

Approval comes from the policy alone: the tool's `require_approval`, else its
server's. Free of I/O and of the `mcp` package.

    [servers.mail]
    trusted = false              # default: annotations only ever raise caution
    require_approval = false     # default for the server's tools

    [servers.mail.tools.search]
    effect = "read"              # pinned: "read" | "idempotent-write" | "side-effect"

    [servers.mail.tools.send]
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

# The policy file's words for the effects.
EFFECT_NAMES: Mapping[str, Effect] = MappingProxyType(
    {
        "read": Effect.READ,
        "idempotent-write": Effect.IDEMPOTENT_WRITE,
        "side-effect": Effect.SIDE_EFFECT,
    }
)
_CAUTION = {Effect.READ: 0, Effect.IDEMPOTENT_WRITE: 1, Effect.SIDE_EFFECT: 2}


class McpPolicyError(ValueError):
    """The MCP policy is invalid; the message names the setting."""


@dataclass(frozen=True, slots=True)
class McpToolRule:
    """The operator's word on one tool: its pinned effect (None: not pinned)
    and whether its calls wait for an approver (None: the server's default)."""

    effect: Effect | None = None
    require_approval: bool | None = None


def _no_tools() -> Mapping[str, McpToolRule]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class McpServerPolicy:
    """The operator's word on one server, named as the operator configured it
    (never its self-reported `serverInfo.name`)."""

    # Its annotations may make a call less conservative than SIDE_EFFECT
    # (for tools whose effect is not pinned).
    trusted: bool = False
    require_approval: bool = False
    tools: Mapping[str, McpToolRule] = field(default_factory=_no_tools)


def _no_servers() -> Mapping[str, McpServerPolicy]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Hints:
    """The annotations a server stated; None: absent (not the spec default)."""

    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None

    @classmethod
    def of(cls, annotations: Any) -> Hints:
        """The hints of an MCP `ToolAnnotations` (either SDK major's names,
        or a plain mapping); None gives no hints."""
        if annotations is None:
            return cls()

        def hint(snake: str, camel: str) -> bool | None:
            if isinstance(annotations, Mapping):
                value = annotations.get(camel, annotations.get(snake))
            else:
                value = getattr(annotations, snake, getattr(annotations, camel, None))
            return value if isinstance(value, bool) else None

        return cls(
            hint("read_only_hint", "readOnlyHint"),
            hint("destructive_hint", "destructiveHint"),
            hint("idempotent_hint", "idempotentHint"),
        )


@dataclass(frozen=True, slots=True)
class McpDecision:
    """The effect and approval a call is prepared with, and why."""

    effect: Effect
    require_approval: bool
    reason: str


def claimed_effect(h: Hints) -> Effect:
    """What the annotations claim, absent hints read as the spec's defaults
    (not read-only, destructive, not idempotent)."""
    if h.read_only is True and h.destructive is not True:
        return Effect.READ
    if h.idempotent is True:
        return Effect.IDEMPOTENT_WRITE
    return Effect.SIDE_EFFECT


def floor_effect(h: Hints) -> Effect:
    """The least conservative effect the stated hints allow (from any server)."""
    writes = h.read_only is False or h.destructive is True or h.idempotent is False
    if (h.read_only is True and h.destructive is not True) or not writes:
        return Effect.READ
    return Effect.IDEMPOTENT_WRITE if h.idempotent is True else Effect.SIDE_EFFECT


def more_conservative(a: Effect, b: Effect) -> Effect:
    return a if _CAUTION[a] >= _CAUTION[b] else b


@dataclass(frozen=True, slots=True)
class McpPolicy:
    """The operator's MCP policy: servers by the names the wrapper is given."""

    servers: Mapping[str, McpServerPolicy] = field(default_factory=_no_servers)

    def decide(self, server: str, tool: str, annotations: Any = None) -> McpDecision:
        """The effect and approval of a call of `tool` on `server`."""
        sp = self.servers.get(server, McpServerPolicy())
        rule = sp.tools.get(tool, McpToolRule())
        hints = Hints.of(annotations)
        if rule.effect is not None:
            base, reason = rule.effect, "pinned by the policy"
        elif sp.trusted:
            base, reason = claimed_effect(hints), "annotations of a trusted server"
        else:
            base, reason = Effect.SIDE_EFFECT, "not pinned (ADR-010 D2 default)"
        effect = more_conservative(base, floor_effect(hints))
        if effect is not base:
            reason += "; raised by the server's annotations"
        approval = rule.require_approval
        if approval is None:
            approval = sp.require_approval
        return McpDecision(effect, approval, reason)

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any]) -> McpPolicy:
        """The policy a parsed document describes (the TOML layout above).

        Raises:
            McpPolicyError: naming the setting that is wrong.
        """
        _keys("", doc, {"servers"})
        servers = doc.get("servers", {})
        _table("servers", servers)
        return cls(
            MappingProxyType(
                {name: _server(name, table) for name, table in servers.items()}
            )
        )

    @classmethod
    def from_toml(cls, text: str) -> McpPolicy:
        """The policy of a TOML text; raises `McpPolicyError`."""
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise McpPolicyError(f"not valid TOML: {exc}") from None
        return cls.from_mapping(doc)


def _table(where: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise McpPolicyError(f"{where}: must be a table")


def _keys(where: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise McpPolicyError(f"{where or 'policy'}: unknown setting {unknown[0]!r}")


def _flag(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise McpPolicyError(f"{where}: must be true or false")
    return value


def _server(name: str, table: Any) -> McpServerPolicy:
    where = f"servers.{name}"
    _table(where, table)
    _keys(where, table, {"trusted", "require_approval", "tools"})
    tools = table.get("tools", {})
    _table(f"{where}.tools", tools)
    return McpServerPolicy(
        trusted=_flag(f"{where}.trusted", table.get("trusted", False)),
        require_approval=_flag(
            f"{where}.require_approval", table.get("require_approval", False)
        ),
        tools=MappingProxyType(
            {tool: _tool(f"{where}.tools.{tool}", t) for tool, t in tools.items()}
        ),
    )


def _tool(where: str, table: Any) -> McpToolRule:
    _table(where, table)
    _keys(where, table, {"effect", "require_approval"})
    effect = None
    if "effect" in table:
        effect = EFFECT_NAMES.get(table["effect"])
        if effect is None:
            raise McpPolicyError(f"{where}.effect: one of {', '.join(EFFECT_NAMES)}")
    approval = None
    if "require_approval" in table:
        approval = _flag(f"{where}.require_approval", table["require_approval"])
    return McpToolRule(effect, approval)
