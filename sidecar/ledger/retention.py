"""Retention of committed calls (contract §4.7; ADR-010 R3) as pure rules.

A COMMITTED call whose result the agent acknowledged is kept for the policy's
retention window after its last change, then reduced to a `Tombstone`: its
identity, input fingerprint, outcome, result digest and times. The tombstone
still refuses a late duplicate prepare (RESULT_COMPACTED, or INPUT_MISMATCH
for another input), so a compacted call is never executed again. A COMMITTED
call whose result was never acknowledged is kept for the longer
unacknowledged window, then compacted the same way (its tombstone says it
was never acknowledged): without it, a store whose agents never acknowledge
only grows until every write fails. A record that is not COMMITTED is never
compacted: an unknown outcome keeps its evidence (R3).

A tombstone lives for the policy's tombstone lifetime after it was made, and
is then deleted: the identity is forgotten, and a prepare of it is a new
call. The lifetime bounds the bytes tombstones take; a caller that reuses a
call_id after the record's window and the tombstone's lifetime has passed is
making a new call by then.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.errors import EffectdError, InputMismatch, ResultCompacted
from sidecar.ledger.model import (
    FINGERPRINT_V2,
    KEY_SCHEME_V1,
    CallRef,
    Effect,
    Outcome,
    State,
    ToolCall,
)
from sidecar.ledger.policy import Policy
from sidecar.ledger.rules import PrepareSpec

_NS_PER_SECOND = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Tombstone:
    """What is kept of a compacted call: enough to refuse it again, never
    enough to replay it (the result payload is gone)."""

    ref: CallRef
    tool_name: str
    effect: Effect
    input_fingerprint: str
    outcome: Outcome
    result_digest: str
    # The error code of an ERROR outcome (e.g. APPROVAL_REJECTED), else "".
    error_code: str
    # The record's last revision and attempt.
    revision: int
    attempt: int
    created_ns: int
    committed_ns: int
    # The record's last change (its acknowledgement, usually).
    last_change_ns: int
    compacted_ns: int
    key_scheme: int = KEY_SCHEME_V1
    fingerprint_scheme: int = FINGERPRINT_V2
    # Whether the agent acknowledged the result before it was compacted.
    acknowledged: bool = True


def is_due(call: ToolCall, policy: Policy, now_wall_ns: int) -> bool:
    """Whether `call` is to be reduced to a tombstone now."""
    if call.state is not State.COMMITTED or call.result is None:
        # ADR-010 R3: a record that is not COMMITTED is never deleted.
        return False
    # contract §4.7: an acknowledged result (the transcript has it) is kept for
    # the retention window after the last change. One never acknowledged may
    # still be replayed (D3), so it is kept for the longer window.
    window = (
        policy.retention_seconds
        if call.acknowledged
        else max(policy.unacknowledged_retention_seconds, policy.retention_seconds)
    )
    return now_wall_ns - call.updated_ns > window * _NS_PER_SECOND


def tombstones_expire_before(policy: Policy, now_wall_ns: int) -> int:
    """Tombstones made before this wall time are past their lifetime."""
    return now_wall_ns - policy.tombstone_seconds * _NS_PER_SECOND


def _committed_ns(call: ToolCall) -> int:
    # The transition into COMMITTED, not a later acknowledgement.
    for entry in call.history:
        if entry.to_state is State.COMMITTED:
            return entry.at_ns
    return call.updated_ns


def tombstone(call: ToolCall, now_wall_ns: int) -> Tombstone:
    """The tombstone of a committed call.

    Raises:
        ValueError: `call` is not COMMITTED with a result (ADR-010 R3).
    """
    if call.state is not State.COMMITTED or call.result is None:
        raise ValueError(f"a {call.state.name} record is never compacted")
    return Tombstone(
        ref=call.ref,
        tool_name=call.tool_name,
        effect=call.effect,
        input_fingerprint=call.input_fingerprint,
        outcome=call.result.outcome,
        result_digest=call.result.digest,
        error_code=call.result.error_code,
        revision=call.revision,
        attempt=call.attempt,
        created_ns=call.created_ns,
        committed_ns=_committed_ns(call),
        last_change_ns=call.updated_ns,
        compacted_ns=now_wall_ns,
        key_scheme=call.key_scheme,
        fingerprint_scheme=call.fingerprint_scheme,
        acknowledged=call.acknowledged,
    )


def metadata(tomb: Tombstone) -> dict[str, str]:
    """What a refusal about a compacted call tells the caller (ErrorInfo)."""
    return {
        "compacted": "true",
        "outcome": tomb.outcome.name,
        "resultDigest": tomb.result_digest,
        "inputFingerprint": tomb.input_fingerprint,
        "callRevision": str(tomb.revision),
        "committedNs": str(tomb.committed_ns),
        "compactedNs": str(tomb.compacted_ns),
        "acknowledged": "true" if tomb.acknowledged else "false",
    }


def duplicate_prepare(tomb: Tombstone, spec: PrepareSpec) -> EffectdError:
    """The refusal of a prepare that repeats a compacted call: never a new
    EXECUTE (ADR-010 D1, D3: a committed call is not run again)."""
    mismatch = ""
    if tomb.input_fingerprint != spec.fingerprint:
        mismatch = (
            "the call was prepared with another input; use a new call_id for a new call"
        )
    elif tomb.tool_name != spec.tool_name:
        mismatch = f"the call was prepared for tool {tomb.tool_name!r}"
    elif tomb.effect is not spec.effect:
        mismatch = f"the call was prepared with effect {tomb.effect.name}"
    if mismatch:
        return InputMismatch(mismatch, metadata(tomb))
    delivered = "" if tomb.acknowledged else ", its result never acknowledged,"
    return ResultCompacted(
        f"the call was committed ({tomb.outcome.name}){delivered} and its record "
        "compacted after the retention window; it is never executed again: use "
        "a new call_id for a new call",
        metadata(tomb),
    )
