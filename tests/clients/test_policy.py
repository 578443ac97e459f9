"""The operator's tool policy shared by the framework adapters
(`effectd_client.policy`): rows of its rules, and its refusals."""

from __future__ import annotations

import pytest

import effectd_client.contrib.agent_framework
import effectd_client.contrib.langgraph
import effectd_client.contrib.mcp
import effectd_client.contrib.openai_agents
import effectd_client.contrib.pydantic_ai
import effectd_client.policy
from effectd_client import Effect
from effectd_client.policy import PolicyError, ToolDecision, ToolPolicy, ToolRule
from tests.support.imports import imported_by


@pytest.mark.parametrize(
    ("text", "tool", "effect", "approval", "retry"),
    [
        ("", "any", Effect.SIDE_EFFECT, False, None),  # ADR-010 D2: unnamed
        ('[tools.a]\neffect = "read"', "a", Effect.READ, False, None),
        (
            '[tools.a]\neffect = "idempotent-write"',
            "a",
            Effect.IDEMPOTENT_WRITE,
            False,
            None,
        ),
        ("require_approval = true", "b", Effect.SIDE_EFFECT, True, None),
        (
            'require_approval = true\n[tools.a]\neffect = "read"\n'
            "require_approval = false",
            "a",
            Effect.READ,
            False,
            None,
        ),
        ("[tools.a]\nretry_unknown = true", "a", Effect.SIDE_EFFECT, False, True),
        (
            '[tools.a]\neffect = "read"\nretry_unknown = false',
            "a",
            Effect.READ,
            False,
            False,
        ),
    ],
)
def test_the_policy_gives_each_tool_its_effect_approval_and_retry(
    text: str, tool: str, effect: Effect, approval: bool, retry: bool | None
) -> None:
    """Rows of the operator's tool policy read from TOML."""
    decided = ToolPolicy.from_toml(text).decide(tool)
    assert (decided.effect, decided.require_approval, decided.retry_unknown) == (
        effect,
        approval,
        retry,
    )


def test_rules_by_tool_name_are_a_policy_and_a_bare_effect_is_a_rule() -> None:
    """`ToolPolicy.of` a mapping (what an adapter's `policy=` also takes):
    an `Effect` is the rule with that effect; the rest stay SIDE_EFFECT."""
    policy = ToolPolicy.of(
        {"lookup": Effect.READ, "send": ToolRule(require_approval=True)}
    )
    assert policy.decide("lookup").effect is Effect.READ
    assert policy.decide("send") == ToolDecision(Effect.SIDE_EFFECT, True, None)
    assert policy.decide("other").effect is Effect.SIDE_EFFECT
    assert ToolPolicy.of(policy) is policy
    rules: dict[str, ToolRule | Effect] = {"lookup": Effect.READ}
    kept = ToolPolicy(rules)
    rules["lookup"] = Effect.SIDE_EFFECT  # the policy holds its own copy
    assert kept.decide("lookup").effect is Effect.READ
    assert ToolPolicy.of(None) == ToolPolicy()


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("trusted = true", "'trusted'"),
        ('[tools.a]\neffect = "write"', "tools.a.effect"),
        ("[tools.a]\nrequire_approval = 1", "tools.a.require_approval"),
        ("[tools.a]\nretry_unknown = 'yes'", "tools.a.retry_unknown"),
        ("[tools.a]\nhints = true", "tools.a: unknown setting 'hints'"),
        ("[tools]\na = 3", "tools.a: must be a table"),
        ("tools = 3", "tools"),
        ("[tools", "TOML"),
    ],
)
def test_a_wrong_policy_is_refused_naming_the_setting(text: str, names: str) -> None:
    with pytest.raises(PolicyError, match=names):
        ToolPolicy.from_toml(text)


def test_the_adapters_share_one_vocabulary() -> None:
    """The policy names an adapter exports are the shared module's own."""
    adapters = (
        effectd_client.contrib.agent_framework,
        effectd_client.contrib.langgraph,
        effectd_client.contrib.openai_agents,
        effectd_client.contrib.pydantic_ai,
    )
    for adapter in adapters:
        assert adapter.PolicyError is PolicyError
        assert adapter.ToolDecision is ToolDecision
        assert adapter.ToolPolicy is ToolPolicy
        assert adapter.ToolRule is ToolRule
    assert effectd_client.contrib.mcp.PolicyError is PolicyError
    assert effectd_client.contrib.mcp.ToolRule is ToolRule


def test_the_public_names_are_pinned() -> None:
    assert sorted(effectd_client.policy.__all__) == [
        "EFFECT_NAMES",
        "PolicyError",
        "ToolDecision",
        "ToolPolicy",
        "ToolRule",
    ]


def test_the_policy_imports_no_framework() -> None:
    """An operator's tool can read and check a policy without the extras
    (the probe sees a framework an adapter imports: its negative control)."""
    frameworks = ["agent_framework", "agents", "langgraph", "mcp", "pydantic_ai"]
    assert imported_by("import effectd_client.policy", frameworks) == []
    assert imported_by("import effectd_client.contrib.mcp", frameworks) == ["mcp"]
