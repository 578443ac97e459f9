"""The operator's policy: what may be retried, for how long, and how long
records are kept (ADR-010 R1, R2). Rules read one `Policy` value per request;
a reload replaces the value as a whole, so a request never sees half of an
old policy and half of a new one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from sidecar.ledger.model import Effect, ToolCall


def _no_overrides() -> Mapping[str, Effect]:
    return MappingProxyType({})


def _none_proven() -> frozenset[str]:
    return frozenset()


@dataclass(frozen=True, slots=True)
class Policy:
    # The kill switch of ADR-010 R2: off, nothing is retry-safe.
    retry_safe_enabled: bool = True
    # Attempts a call may use, first attempt included.
    max_attempts: int = 3
    default_lease_ms: int = 30_000
    # Committed and acknowledged records are reduced to tombstones after this.
    retention_seconds: int = 7 * 24 * 3600
    # Committed records whose result was never acknowledged, after this
    # (never shorter than `retention_seconds`).
    unacknowledged_retention_seconds: int = 30 * 24 * 3600
    # Tombstones are deleted this long after they were made; the identity is
    # then forgotten.
    tombstone_seconds: int = 30 * 24 * 3600
    # Tools whose effect is forced, whatever their callers declare (R2).
    effect_overrides: Mapping[str, Effect] = field(default_factory=_no_overrides)
    # How long a call must have been UNKNOWN before an operator may record it
    # "never executed", in leases of its last attempt: an expired lease means
    # that the holder stopped heartbeating, not that it stopped running.
    reconcile_quarantine_leases: int = 3
    # ADR-010 "compatibility": a tool is retry-safe as IDEMPOTENT_WRITE only
    # with evidence that its target de-duplicates on the key. When set, an
    # IDEMPOTENT_WRITE counts as a SIDE_EFFECT unless its tool is listed in
    # `proven_idempotent_tools` (by the operator, from the tool owner's
    # de-duplication tests, e.g. `effectd_client.testing`).
    idempotency_proof_required: bool = False
    proven_idempotent_tools: frozenset[str] = field(default_factory=_none_proven)

    # Every call keeps its exact input until it is settled (`kept_inputs`);
    # with `keep_inputs`, a settled call keeps it too, when it is at most
    # `max_kept_input_bytes`, until retention compacts the record.
    keep_inputs: bool = False
    max_kept_input_bytes: int = 64 << 10

    def reconcile_quarantine_ns(self, lease_ms: int) -> int:
        """The quarantine of a call whose last attempt asked for `lease_ms`
        (0: the default lease)."""
        lease = lease_ms or self.default_lease_ms
        return self.reconcile_quarantine_leases * lease * 1_000_000

    def effect_of(self, tool_name: str, declared: Effect) -> Effect:
        """The effect the rules must assume for a call of `tool_name`."""
        forced = self.effect_overrides.get(tool_name)
        if forced is not None:
            return forced
        if (
            declared is Effect.IDEMPOTENT_WRITE
            and self.idempotency_proof_required
            and tool_name not in self.proven_idempotent_tools
        ):
            # Self-declared, not proven: as conservative as undeclared (D2).
            return Effect.SIDE_EFFECT
        return declared

    def effect_for(self, call: ToolCall) -> Effect:
        """The effect the rules must assume for a recorded call: a SIDE_EFFECT
        forced on the call stays one whatever this policy says (R2)."""
        return self.effect_of(call.tool_name, call.recorded_effect)


class PolicySource(Protocol):
    def current(self) -> Policy:
        """The policy in force now."""
        ...


class FixedPolicy:
    """A policy that never changes; the default until a policy file is loaded."""

    def __init__(self, policy: Policy | None = None) -> None:
        self._policy = policy or Policy()

    def current(self) -> Policy:
        return self._policy
