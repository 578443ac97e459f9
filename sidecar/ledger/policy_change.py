"""A policy change as an audit fact (ADR-010 R2, contract §10.5), as pure functions.

A reload names who asked for it and when, and keeps both policies whole, each
as the RFC 8785 form of its document, so the audit log alone tells which
policy decided a call at any moment. `changes` names the settings that
differ by their policy-file names (`retry.retry_safe`,
`tools.send_payment.effect`).
"""

from __future__ import annotations

from typing import Any

import rfc8785

from sidecar.ledger import audit
from sidecar.ledger.model import Effect
from sidecar.ledger.policy import Policy

# Who reloaded: an operator through the Admin RPC, or a SIGHUP to the daemon.
OPERATOR = "operator"
SIGHUP = "sighup"


def forced_side_effects(policy: Policy) -> list[str]:
    """The tools the policy forces to SIDE_EFFECT, sorted."""
    return sorted(
        name
        for name, effect in policy.effect_overrides.items()
        if effect is Effect.SIDE_EFFECT
    )


def document(policy: Policy) -> dict[str, Any]:
    """The whole policy as a JSON document."""
    return {
        "retry_safe": policy.retry_safe_enabled,
        "max_attempts": policy.max_attempts,
        "default_lease_ms": policy.default_lease_ms,
        "retention_seconds": policy.retention_seconds,
        "unacknowledged_retention_seconds": policy.unacknowledged_retention_seconds,
        "tombstone_seconds": policy.tombstone_seconds,
        "reconcile_quarantine_leases": policy.reconcile_quarantine_leases,
        "require_idempotency_proof": policy.idempotency_proof_required,
        "proven_idempotent_tools": sorted(policy.proven_idempotent_tools),
        "effect_overrides": {
            name: policy.effect_overrides[name].value
            for name in sorted(policy.effect_overrides)
        },
        "keep_inputs": policy.keep_inputs,
        "max_kept_input_bytes": policy.max_kept_input_bytes,
    }


def canonical(policy: Policy) -> str:
    """The RFC 8785 form of `document(policy)`."""
    return bytes(rfc8785.dumps(document(policy))).decode()


# The scalar settings: the `Policy` attribute and its name in the policy file.
_SCALARS = (
    ("retry_safe_enabled", "retry.retry_safe"),
    ("max_attempts", "retry.max_attempts"),
    ("default_lease_ms", "leases.default_ms"),
    ("retention_seconds", "retention.days"),
    ("unacknowledged_retention_seconds", "retention.unacknowledged_days"),
    ("tombstone_seconds", "retention.tombstone_days"),
    ("reconcile_quarantine_leases", "reconcile.quarantine_leases"),
    ("idempotency_proof_required", "retry.require_idempotency_proof"),
    ("keep_inputs", "inputs.keep_all"),
    ("max_kept_input_bytes", "inputs.max_bytes"),
)


def changes(old: Policy, new: Policy) -> list[str]:
    """The settings that differ, by their names in the policy file."""
    changed = [
        name for attr, name in _SCALARS if getattr(old, attr) != getattr(new, attr)
    ]
    for name in sorted(set(old.effect_overrides) | set(new.effect_overrides)):
        if old.effect_overrides.get(name) != new.effect_overrides.get(name):
            changed.append(f"tools.{name}.effect")
    for name in sorted(old.proven_idempotent_tools ^ new.proven_idempotent_tools):
        changed.append(f"tools.{name}.idempotency_proven")
    return changed


def fact(
    old: Policy, new: Policy, *, at_ns: int, actor: str, reason: str, source: str
) -> audit.Fact:
    """The audit fact of replacing `old` by `new`, read from `source`."""
    return audit.Fact(
        at_ns=at_ns,
        actor=actor,
        action=audit.Action.POLICY_RELOAD,
        # A policy is of the whole daemon, not of one record.
        namespace="",
        run_id="",
        call_id="",
        revision_before=0,
        revision_after=0,
        state_before=None,
        state_after=None,
        reason=reason,
        evidence="",
        details={
            "file": source,
            "old": canonical(old),
            "new": canonical(new),
            "changed": ",".join(changes(old, new)),
        },
    )
