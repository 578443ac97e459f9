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
server's. A tool's table is a `ToolRule` in the words of
`effectd_client.policy` (without `retry_unknown`: an MCP call of unknown
outcome is never sent again). Free of I/O and of the `mcp` package.

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

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from effectd_client._types import Effect
from effectd_client.policy import (
    ToolRule,
    check_keys,
    check_table,
    load_toml,
    parse_flag,
    parse_rule,
)

# The settings of an MCP tool's table.
MCP_RULE_KEYS = ("effect", "require_approval")
_CAUTION = {Effect.READ: 0, Effect.IDEMPOTENT_WRITE: 1, Effect.SIDE_EFFECT: 2}


def _no_tools() -> Mapping[str, ToolRule]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class McpServerPolicy:
    """The operator's word on one server, named as the operator configured it
    (never its self-reported `serverInfo.name`)."""

    # Its annotations may make a call less conservative than SIDE_EFFECT
    # (for tools whose effect is not pinned).
    trusted: bool = False
    require_approval: bool = False
    # A rule's effect pins the tool's; its approval, None: the server's.
    tools: Mapping[str, ToolRule] = field(default_factory=_no_tools)


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
        rule = sp.tools.get(tool, ToolRule())
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
            PolicyError: naming the setting that is wrong.
        """
        check_keys("policy", doc, {"servers"})
        servers = doc.get("servers", {})
        check_table("servers", servers)
        return cls(
            MappingProxyType(
                {name: _server(name, table) for name, table in servers.items()}
            )
        )

    @classmethod
    def from_toml(cls, text: str) -> McpPolicy:
        """The policy of a TOML text; raises `PolicyError`."""
        return cls.from_mapping(load_toml(text))


def _server(name: str, table: Any) -> McpServerPolicy:
    where = f"servers.{name}"
    check_table(where, table)
    check_keys(where, table, {"trusted", "require_approval", "tools"})
    tools = table.get("tools", {})
    check_table(f"{where}.tools", tools)
    return McpServerPolicy(
        trusted=parse_flag(f"{where}.trusted", table.get("trusted", False)),
        require_approval=parse_flag(
            f"{where}.require_approval", table.get("require_approval", False)
        ),
        tools=MappingProxyType(
            {
                tool: parse_rule(f"{where}.tools.{tool}", t, MCP_RULE_KEYS)
                for tool, t in tools.items()
            }
        ),
    )
