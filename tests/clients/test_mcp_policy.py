"""The operator's MCP policy: the effect of each call, and what the server's
annotations may change (only towards caution, unless the server is trusted)."""

from __future__ import annotations

from typing import Any

import pytest

import effectd_client.contrib.mcp
from effectd_client import Effect
from effectd_client.contrib.mcp import McpPolicy, PolicyError

READ, WRITE, SIDE = Effect.READ, Effect.IDEMPOTENT_WRITE, Effect.SIDE_EFFECT
LIES_READ_ONLY = {"readOnlyHint": True, "destructiveHint": False}
SAYS_WRITES = {"readOnlyHint": False}
SAYS_IDEMPOTENT = {"readOnlyHint": False, "idempotentHint": True}
SAYS_DESTRUCTIVE = {"readOnlyHint": True, "destructiveHint": True}

UNTRUSTED = "[servers.s.tools.t]\n"
PINNED_READ = '[servers.s.tools.t]\neffect = "read"\n'
PINNED_WRITE = '[servers.s.tools.t]\neffect = "idempotent-write"\n'
TRUSTED = "[servers.s]\ntrusted = true\n"
TRUSTED_PINNED_SIDE = TRUSTED + '[servers.s.tools.t]\neffect = "side-effect"\n'


@pytest.mark.parametrize(
    ("policy", "annotations", "effect"),
    [
        # ADR-010 D2: nothing pinned, untrusted -> SIDE_EFFECT, whatever claimed.
        ("", None, SIDE),
        ("", LIES_READ_ONLY, SIDE),
        (UNTRUSTED, SAYS_IDEMPOTENT, SIDE),
        # Pinned by the operator: kept, unless the server says it writes.
        (PINNED_READ, None, READ),
        (PINNED_READ, LIES_READ_ONLY, READ),
        (PINNED_READ, SAYS_WRITES, SIDE),
        (PINNED_READ, SAYS_IDEMPOTENT, WRITE),
        (PINNED_READ, SAYS_DESTRUCTIVE, SIDE),
        (PINNED_WRITE, {"idempotentHint": False}, SIDE),
        # A trusted server's annotations are believed (spec defaults if absent).
        (TRUSTED, None, SIDE),
        (TRUSTED, LIES_READ_ONLY, READ),
        (TRUSTED, SAYS_IDEMPOTENT, WRITE),
        (TRUSTED, SAYS_DESTRUCTIVE, SIDE),
        # ... but never over the operator's pin.
        (TRUSTED_PINNED_SIDE, LIES_READ_ONLY, SIDE),
    ],
)
def test_the_effect_of_a_call(policy: str, annotations: Any, effect: Effect) -> None:
    """The table of docs/mcp.md: annotations only ever raise caution, except
    a trusted server's for a tool the operator did not pin."""
    decision = McpPolicy.from_toml(policy).decide("s", "t", annotations)
    assert decision.effect is effect, decision.reason


def test_approval_comes_from_the_tool_else_its_server() -> None:
    policy = McpPolicy.from_toml(
        "[servers.s]\nrequire_approval = true\n"
        "[servers.s.tools.free]\nrequire_approval = false\n"
    )
    assert policy.decide("s", "other").require_approval
    assert not policy.decide("s", "free").require_approval
    assert not policy.decide("elsewhere", "other").require_approval


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("[server]\n", "unknown setting 'server'"),
        ("[servers.s]\ntrusted = 1\n", "servers.s.trusted"),
        ("[servers.s]\nhints = true\n", "unknown setting 'hints'"),
        ('[servers.s.tools.t]\neffect = "write"\n', "servers.s.tools.t.effect"),
        ("[servers.s.tools.t]\nrequire_approval = 'y'\n", "require_approval"),
        ("servers = 3\n", "servers: must be a table"),
        # An MCP call of unknown outcome is never sent again (ADR-010 D5).
        ("[servers.s.tools.t]\nretry_unknown = true\n", "'retry_unknown'"),
        ("[servers\n", "not valid TOML"),
    ],
)
def test_an_invalid_policy_names_the_setting(text: str, where: str) -> None:
    with pytest.raises(PolicyError, match=where):
        McpPolicy.from_toml(text)


def test_the_mcp_module_exports_are_pinned() -> None:
    assert set(effectd_client.contrib.mcp.__all__) == {
        "EFFECT_NAMES",
        "KEY_META",
        "MCP_TOOL_ERROR",
        "LedgeredSession",
        "McpConnectionLost",
        "McpDecision",
        "McpPolicy",
        "McpServerPolicy",
        "PolicyError",
        "SessionInvalidated",
        "ToolRule",
        "ledger_tool_name",
        "unwrapped",
    }
    for name in effectd_client.contrib.mcp.__all__:
        assert hasattr(effectd_client.contrib.mcp, name), name
