"""The policy file: every setting read, every mistake named, reloads atomic."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.ledger.model import Effect
from sidecar.ledger.policy import Policy
from sidecar.policy_file import PolicyError, PolicyFile, parse_policy

FULL = """
[retry]
retry_safe = false
max_attempts = 5

[leases]
default_ms = 1000

[retention]
days = 2

[reconcile]
quarantine_leases = 4

[tools.send_payment]
effect = "side-effect"

[tools.upsert_contact]
idempotency_proven = true

[inputs]
keep_all = true
max_bytes = 1024
"""


def test_every_setting_is_read() -> None:
    """Each documented setting reaches the Policy value."""
    policy = parse_policy(FULL)
    assert policy.retry_safe_enabled is False
    assert policy.max_attempts == 5
    assert policy.default_lease_ms == 1000
    assert policy.retention_seconds == 2 * 86400
    assert policy.reconcile_quarantine_leases == 4
    assert policy.reconcile_quarantine_ns(10_000) == 40 * 10**9
    assert policy.reconcile_quarantine_ns(0) == 4 * 1000 * 10**6
    assert policy.effect_of("send_payment", Effect.READ) is Effect.SIDE_EFFECT
    assert policy.effect_of("search", Effect.READ) is Effect.READ
    assert policy.proven_idempotent_tools == {"upsert_contact"}
    assert policy.idempotency_proof_required is False
    assert (policy.keep_inputs, policy.max_kept_input_bytes) == (True, 1024)


def test_an_empty_file_is_the_default_policy() -> None:
    """Omitted settings keep their defaults."""
    assert parse_policy("") == Policy()


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("[retry\n", "not valid TOML"),
        ("[retries]\nmax_attempts = 1", "retries: unknown section"),
        ("[retry]\nmax_attemps = 1", "retry.max_attemps: unknown setting"),
        (
            "[retry]\nmax_attempts = '3'",
            "retry.max_attempts: must be an integer, not a",
        ),
        (
            "[retry]\nmax_attempts = true",
            "retry.max_attempts: must be an integer, not a",
        ),
        (
            "[retry]\nretry_safe = 1",
            "retry.retry_safe: must be a boolean, not an integer",
        ),
        ("[retry]\nmax_attempts = 0", "retry.max_attempts: must be between"),
        ("[leases]\ndefault_ms = 0", "leases.default_ms: must be between"),
        ("[retention]\ndays = 0", "retention.days: must be between"),
        (
            "[reconcile]\nquarantine_leases = 0",
            "reconcile.quarantine_leases: must be between",
        ),
        ("[inputs]\nmax_bytes = 0", "inputs.max_bytes: must be between"),
        (
            "[inputs]\nkeep_all = 'yes'",
            "inputs.keep_all: must be a boolean, not a string",
        ),
        ("retry = 3", "retry: must be a table, not an integer"),
        ("[tools.search]\neffect = 'read'", 'only "side-effect" can be forced'),
        ("[tools.search]\neffect = 'side-effect'\nx = 1", "nothing else"),
        ("[tools.search]\n", "must set `effect` or `idempotency_proven`"),
        (
            "[tools.search]\nidempotency_proven = 'yes'",
            "tools.search.idempotency_proven: must be a boolean",
        ),
        (
            "[tools.search]\neffect = 'side-effect'\nidempotency_proven = true",
            "forced to side-effect and proven idempotent at once",
        ),
        (
            "[retry]\nrequire_idempotency_proof = 1",
            "retry.require_idempotency_proof: must be a boolean",
        ),
        ("tools = 1", "tools: must be a table"),
    ],
)
def test_mistakes_are_refused_by_name(text: str, names: str) -> None:
    """An invalid file is refused with a message that names the setting."""
    with pytest.raises(PolicyError, match=names):
        parse_policy(text)


def test_reload_swaps_the_whole_policy(tmp_path: Path) -> None:
    """A reload replaces the policy in force and returns the old and new ones."""
    path = tmp_path / "policy.toml"
    path.write_text("[retry]\nmax_attempts = 2\n")
    source = PolicyFile(path)
    assert source.current().max_attempts == 2
    path.write_text(FULL)
    old, new = source.reload()
    assert (old.max_attempts, new.max_attempts) == (2, 5)
    assert source.current() is new


def test_a_bad_reload_keeps_the_old_policy(tmp_path: Path) -> None:
    """A malformed file on reload is refused and the old policy stays in force."""
    path = tmp_path / "policy.toml"
    path.write_text(FULL)
    source = PolicyFile(path)
    before = source.current()
    path.write_text("[retry]\nmax_attempts = -1\n")
    with pytest.raises(PolicyError, match=r"retry\.max_attempts"):
        source.reload()
    assert source.current() is before
    path.unlink()
    with pytest.raises(PolicyError, match="cannot be read"):
        source.reload()
    assert source.current() is before


@pytest.mark.parametrize(
    ("text", "proven"),
    [
        ("", False),
        ("[retry]\nrequire_idempotency_proof = true\n", False),
        (
            "[retry]\nrequire_idempotency_proof = true\n"
            "[tools.upsert]\nidempotency_proven = true\n",
            True,
        ),
        (
            "[retry]\nrequire_idempotency_proof = true\n"
            "[tools.upsert]\nidempotency_proven = false\n",
            False,
        ),
    ],
)
def test_an_idempotent_write_needs_proof_when_the_policy_says_so(
    text: str, proven: bool
) -> None:
    """With `require_idempotency_proof`, an IDEMPOTENT_WRITE counts as a
    SIDE_EFFECT unless its tool is listed `idempotency_proven` (issue 10 item
    16: fails before the fix: the setting did not exist, a self-declared
    IDEMPOTENT_WRITE was always retry-safe); READ and SIDE_EFFECT are untouched."""
    policy = parse_policy(text)
    required = "require_idempotency_proof = true" in text
    want = Effect.IDEMPOTENT_WRITE if proven or not required else Effect.SIDE_EFFECT
    assert policy.effect_of("upsert", Effect.IDEMPOTENT_WRITE) is want
    assert policy.effect_of("other", Effect.READ) is Effect.READ
    assert policy.effect_of("upsert", Effect.SIDE_EFFECT) is Effect.SIDE_EFFECT
