"""The values of the tool-call ledger: effects, states, decisions and records."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sidecar.errors import UnsupportedKeyScheme

# Idempotency key schemes (ADR-010 D2, R4). A record keeps the scheme it was
# created with; this daemon hands out keys only of the schemes it knows and
# refuses a record of any other (UNSUPPORTED_KEY_SCHEME) rather than compute
# a key the target system never saw. docs/ledger.md says how a new scheme
# keeps the old one de-duplicating for a window.
KEY_SCHEME_V1 = 1
KEY_SCHEMES = frozenset({KEY_SCHEME_V1})
# Input fingerprint schemes (`ledger.fingerprint`): V1 hashed the canonical
# input alone, so a JSON and a raw input with the same bytes collided; V2
# hashes the input's kind first. Records stored before V2 keep V1, and a
# repeated prepare is compared with them in V1.
FINGERPRINT_V1 = 1
FINGERPRINT_V2 = 2
DEFAULT_NAMESPACE = "default"


class IdentityEnum(enum.Enum):
    """An enum hashed by identity. Members are singletons that compare by
    identity; `enum.Enum` hashes them by their name in Python code, a frame
    per dict lookup, and the hot path looks them up tens of times per
    request (protobuf mappings, tables, pools). Same equality, same dict
    semantics, one C call."""

    __hash__ = object.__hash__


class Effect(IdentityEnum):
    """What a tool does to the world (ADR-010 D2); undeclared is SIDE_EFFECT."""

    READ = "read"
    IDEMPOTENT_WRITE = "idempotent-write"
    SIDE_EFFECT = "side-effect"


class Channel(IdentityEnum):
    """How the agent reaches the tool; the retry rules of contract §7.2 depend on
    it (ADR-010 D5: an MCP call is never replayed after a transport failure;
    D6: child and background runs). The values are those of the matching
    `ledger.retry.RetryContext`."""

    TOOL = "tool"
    MCP = "mcp"
    CHILD_FOREGROUND = "child_foreground"
    DURABLE_BACKGROUND = "durable_background"


class State(IdentityEnum):
    PREPARED = "prepared"
    AWAITING_APPROVAL = "awaiting_approval"
    STARTED = "started"
    UNKNOWN = "unknown"
    COMMITTED = "committed"


class Event(IdentityEnum):
    """What can happen to a record; the history names them."""

    PREPARE = "prepare"
    APPROVE = "approve"
    REJECT = "reject"
    START = "start"
    RETRY = "retry"
    COMMIT = "commit"
    EXPIRE = "expire"
    RESTART = "restart"
    REPORT_UNKNOWN = "report_unknown"
    RECONCILE_COMMITTED = "reconcile_committed"
    RECONCILE_NOT_EXECUTED = "reconcile_not_executed"
    ACKNOWLEDGE = "acknowledge"
    HEARTBEAT = "heartbeat"
    # A repeat prepare asked for an approval the call did not require yet.
    REQUIRE_APPROVAL = "require_approval"
    # The operator's policy or action made the call a SIDE_EFFECT for good
    # (ADR-010 R2).
    FORCE_SIDE_EFFECT = "force_side_effect"
    # The store was restored from a backup: what happened to the call since
    # is unknown (`ledger.restore`).
    RESTORE = "restore"


class Decision(IdentityEnum):
    """What the caller must do next (contract §5.1)."""

    EXECUTE = "execute"
    RETURN_RESULT = "return_result"
    AWAIT_APPROVAL = "await_approval"
    REJECTED = "rejected"
    IN_PROGRESS = "in_progress"
    RECONCILE = "reconcile"


class Outcome(IdentityEnum):
    OK = "ok"
    ERROR = "error"


class PayloadKind(IdentityEnum):
    JSON = "json"
    RAW = "raw"


APPROVAL_REJECTED = "APPROVAL_REJECTED"


@dataclass(frozen=True, slots=True)
class CallRef:
    namespace: str
    run_id: str
    call_id: str

    @property
    def idempotency_key(self) -> str:
        """Key scheme v1: exactly `${runId}:${callId}` (ADR-010 D2)."""
        return f"{self.run_id}:{self.call_id}"


def check_key_scheme(scheme: int) -> None:
    """Raises UnsupportedKeyScheme for a scheme this daemon cannot compute
    (ADR-010 R4: a record's key never changes scheme, so none is guessed)."""
    if scheme not in KEY_SCHEMES:
        raise UnsupportedKeyScheme(
            f"the call's idempotency key scheme {scheme} is not one this daemon "
            f"knows ({', '.join(str(s) for s in sorted(KEY_SCHEMES))}); it is left "
            "untouched: serve it with the daemon version that created it",
            {"keyScheme": str(scheme)},
        )


def idempotency_key(ref: CallRef, scheme: int) -> str:
    """The key of `ref` in key scheme `scheme` (ADR-010 D2, R4)."""
    check_key_scheme(scheme)
    return ref.idempotency_key


@dataclass(frozen=True, slots=True)
class Payload:
    """Input or result bytes as sent; JSON text is kept UTF-8 encoded."""

    kind: PayloadKind
    data: bytes


@dataclass(frozen=True, slots=True)
class Result:
    outcome: Outcome
    payload: Payload | None
    error_code: str
    error_message: str
    digest: str


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease granted by one daemon incarnation: its end on that
    incarnation's monotonic clock, which only the holder can read, and on the
    wall clock, which every daemon sharing the store judges it by
    (`ledger.ownership.judge`).

    Monotonic time means nothing across restarts, so a lease of an earlier
    incarnation is never live to a later one (its holder cannot be trusted
    to still run).
    """

    incarnation: int
    deadline_ns: int
    expires_wall_ns: int


@dataclass(frozen=True, slots=True)
class Transition:
    from_state: State | None
    to_state: State
    event: Event
    at_ns: int
    actor: str
    reason: str
    revision: int
    attempt: int


class Resolution(IdentityEnum):
    """What an operator found in the target system (contract §4.6 reconcile)."""

    COMMITTED = "committed"
    NOT_EXECUTED = "not_executed"


@dataclass(frozen=True, slots=True)
class Approval:
    """An approver's decision, bound to the input and revision it was given for."""

    approved: bool
    approver: str
    reason: str
    at_ns: int
    input_fingerprint: str
    revision: int


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """An operator's resolution of a call of unknown outcome, with its evidence
    (ADR-010 R3: the evidence is kept, never deleted)."""

    resolution: Resolution
    operator: str
    reason: str
    evidence: str
    at_ns: int
    from_state: State
    # The revision the operator saw and resolved.
    revision: int
    attempt: int


@dataclass(frozen=True, slots=True)
class ToolCall:
    ref: CallRef
    tool_name: str
    effect: Effect
    state: State
    revision: int
    input_fingerprint: str
    approval_required: bool
    attempt: int
    created_ns: int
    updated_ns: int
    key_scheme: int = KEY_SCHEME_V1
    # The scheme of `input_fingerprint`; V1 only for records stored before V2.
    fingerprint_scheme: int = FINGERPRINT_V2
    lease: Lease | None = None
    result: Result | None = None
    acknowledged: bool = False
    history: tuple[Transition, ...] = field(default=())
    approval: Approval | None = None
    # Oldest first.
    reconciliations: tuple[Reconciliation, ...] = field(default=())
    # The lease the last attempt asked for (start, retry or heartbeat); 0 in
    # records stored before it was kept.
    lease_ms: int = 0
    # UNKNOWN only: wall-clock time from which the outcome is unknown (the end
    # of the attempt's lease, or its report); 0 elsewhere, and in records
    # stored before it was kept (the history then tells).
    unknown_since_ns: int = 0
    # Recorded at prepare, part of the identity; TOOL in older records.
    channel: Channel = Channel.TOOL
    # SIDE_EFFECT once the operator forced it on this call (ADR-010 R2): by
    # the policy in force when the call was decided, or by putting the tool's
    # open calls into reconciliation. Sticky: a later policy never relaxes it.
    forced_effect: Effect | None = None
    # The exact input, kept until the call is COMMITTED for an approver (and
    # an operator) to read (`ledger.kept_inputs`); None when not kept.
    kept_input: Payload | None = None

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.ref, self.key_scheme)

    @property
    def recorded_effect(self) -> Effect:
        """The effect the rules start from: the forced one, else as declared."""
        return self.forced_effect or self.effect

    @property
    def outcome_unknown_since_ns(self) -> int:
        """When the outcome of the call's last attempt became unknown."""
        if self.unknown_since_ns:
            return self.unknown_since_ns
        for entry in reversed(self.history):
            if (
                entry.to_state is State.UNKNOWN
                and entry.from_state is not State.UNKNOWN
            ):
                return entry.at_ns
        return self.updated_ns

    @property
    def rejected(self) -> bool:
        """Committed by an approver's rejection (contract §4.5)."""
        return (
            self.state is State.COMMITTED
            and self.result is not None
            and self.result.outcome is Outcome.ERROR
            and self.result.error_code == APPROVAL_REJECTED
        )
