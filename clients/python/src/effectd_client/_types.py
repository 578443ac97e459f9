"""Results as frozen dataclasses, so callers never handle `*_pb2` messages."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from effectd.v1 import checkpoints_pb2, ledger_pb2, recovery_pb2


class Effect(enum.Enum):
    READ = ledger_pb2.EFFECT_READ
    IDEMPOTENT_WRITE = ledger_pb2.EFFECT_IDEMPOTENT_WRITE
    SIDE_EFFECT = ledger_pb2.EFFECT_SIDE_EFFECT


class Channel(enum.Enum):
    """How the agent reaches the tool; its retry rules apply to the call
    (an MCP call of unknown outcome is never started again, ADR-010 D5)."""

    TOOL = ledger_pb2.CALL_CHANNEL_TOOL
    MCP = ledger_pb2.CALL_CHANNEL_MCP
    CHILD_FOREGROUND = ledger_pb2.CALL_CHANNEL_CHILD_FOREGROUND
    DURABLE_BACKGROUND = ledger_pb2.CALL_CHANNEL_DURABLE_BACKGROUND


class State(enum.Enum):
    PREPARED = ledger_pb2.CALL_STATE_PREPARED
    AWAITING_APPROVAL = ledger_pb2.CALL_STATE_AWAITING_APPROVAL
    STARTED = ledger_pb2.CALL_STATE_STARTED
    UNKNOWN = ledger_pb2.CALL_STATE_UNKNOWN
    COMMITTED = ledger_pb2.CALL_STATE_COMMITTED


class Decision(enum.Enum):
    EXECUTE = ledger_pb2.DECISION_EXECUTE
    RETURN_RESULT = ledger_pb2.DECISION_RETURN_RESULT
    AWAIT_APPROVAL = ledger_pb2.DECISION_AWAIT_APPROVAL
    REJECTED = ledger_pb2.DECISION_REJECTED
    IN_PROGRESS = ledger_pb2.DECISION_IN_PROGRESS
    RECONCILE = ledger_pb2.DECISION_RECONCILE


@dataclass(frozen=True, slots=True)
class ToolResult:
    ok: bool
    json_text: str | None
    raw: bytes | None
    error_code: str
    error_message: str
    digest: str

    @property
    def value(self) -> Any:
        """The JSON result, parsed; None for raw or empty results."""
        return None if self.json_text is None else json.loads(self.json_text)

    @classmethod
    def from_pb(cls, msg: ledger_pb2.ToolResult) -> ToolResult:
        payload = msg.payload
        kind = payload.WhichOneof("kind")
        return cls(
            msg.outcome == _OUTCOME_OK,
            payload.json if kind == "json" else None,
            payload.raw if kind == "raw" else None,
            msg.error_code,
            msg.error_message,
            msg.digest,
        )


# Conversions many items make: a dict lookup where the enum's own lookup by
# value costs several times as much (a plan of 10,000 calls converts each).
_OUTCOME_OK = ledger_pb2.OUTCOME_OK
_NANOS = 1_000_000_000


def _nanoseconds(ts: Any) -> int:
    """`Timestamp.ToNanoseconds` of a timestamp the daemon wrote."""
    return int(ts.seconds * _NANOS + ts.nanos)


@dataclass(frozen=True, slots=True)
class ToolCall:
    namespace: str
    run_id: str
    call_id: str
    tool_name: str
    effect: Effect
    state: State
    revision: int
    idempotency_key: str
    attempt: int
    input_fingerprint: str
    approval_required: bool
    result: ToolResult | None
    history: tuple[str, ...]
    # The result was delivered to the transcript (AcknowledgeRecovery).
    acknowledged: bool = False
    # The daemon's wall clock (ns since the epoch): the last change, and the
    # lease end of a STARTED call (0 when none).
    updated_ns: int = 0
    lease_expires_ns: int = 0
    channel: Channel = Channel.TOOL
    # SIDE_EFFECT once the operator forced it on this call (ADR-010 R2).
    forced_effect: Effect | None = None
    # The exact input as sent, kept until the call is committed when it
    # awaits approval (or the policy keeps inputs); lists and plans omit it.
    # JSON text or raw bytes; both None when not kept.
    kept_input_json: str | None = None
    kept_input_raw: bytes | None = None

    @property
    def lease_ms(self) -> int:
        """The lease granted at the last start or heartbeat (0 when none)."""
        if not self.lease_expires_ns or not self.updated_ns:
            return 0
        return max(0, (self.lease_expires_ns - self.updated_ns) // 1_000_000)

    @classmethod
    def from_pb(
        cls, msg: ledger_pb2.ToolCall, result: ToolResult | None = None
    ) -> ToolCall:
        """The call of `msg`; `result`, when given, is its result already
        converted."""
        ref = msg.ref
        # An unset message field is not read: reading it makes its object.
        kept_input = msg.kept_input if msg.HasField("kept_input") else None
        kept = None if kept_input is None else kept_input.WhichOneof("kind")
        forced = msg.forced_effect
        if result is None and msg.HasField("result"):
            result = ToolResult.from_pb(msg.result)
        return cls(
            ref.namespace,
            ref.run_id,
            ref.call_id,
            msg.tool_name,
            _EFFECTS.get(msg.effect) or Effect(msg.effect),
            _STATES.get(msg.state) or State(msg.state),
            msg.revision,
            msg.idempotency_key,
            msg.attempt,
            msg.input_fingerprint,
            msg.approval_required,
            result,
            tuple([t.event for t in msg.history]),
            msg.acknowledged,
            _nanoseconds(msg.updated_at),
            _nanoseconds(msg.lease_expires_at)
            if msg.HasField("lease_expires_at")
            else 0,
            # A daemon that predates channels sends none: TOOL.
            _CHANNELS.get(msg.channel) or Channel(msg.channel or _TOOL),
            (_EFFECTS.get(forced) or Effect(forced)) if forced else None,
            kept_input.json if kept_input is not None and kept == "json" else None,
            kept_input.raw if kept_input is not None and kept == "raw" else None,
        )


# A miss goes to the enum itself, which refuses a value it does not know.
_EFFECTS = {e.value: e for e in Effect}
_STATES = {s.value: s for s in State}
_CHANNELS = {c.value: c for c in Channel}
_TOOL = ledger_pb2.CALL_CHANNEL_TOOL


@dataclass(frozen=True, slots=True)
class Prepared:
    """The answer to a prepare or a start."""

    decision: Decision
    call: ToolCall
    idempotency_key: str
    attempt_held: bool
    retry_required: bool


class RecoveryAction(enum.Enum):
    REPLAY_RESULT = recovery_pb2.RECOVERY_ACTION_REPLAY_RESULT
    RECONCILE = recovery_pb2.RECOVERY_ACTION_RECONCILE
    WAIT_FOR_APPROVAL = recovery_pb2.RECOVERY_ACTION_WAIT_FOR_APPROVAL
    ERROR_RESULT = recovery_pb2.RECOVERY_ACTION_ERROR_RESULT
    EXECUTE = recovery_pb2.RECOVERY_ACTION_EXECUTE
    RETRY_NEEDS_POLICY = recovery_pb2.RECOVERY_ACTION_RETRY_NEEDS_POLICY
    # Committed and acknowledged: already in the transcript; append nothing.
    ALREADY_DELIVERED = recovery_pb2.RECOVERY_ACTION_ALREADY_DELIVERED


@dataclass(frozen=True, slots=True)
class PlanItem:
    action: RecoveryAction
    call: ToolCall
    result: ToolResult | None
    idempotency_key: str


_ACTIONS = {a.value: a for a in RecoveryAction}


def _plan_item(msg: recovery_pb2.RecoveryItem) -> PlanItem:
    call = msg.call
    result = None
    if msg.HasField("result"):
        # The item's result is the record's (the daemon copies it): one
        # conversion serves both, unless they differ.
        result = ToolResult.from_pb(msg.result)
        same = call.HasField("result") and call.result == msg.result
        converted = ToolCall.from_pb(call, result if same else None)
    else:
        converted = ToolCall.from_pb(call)
    action = _ACTIONS.get(msg.action) or RecoveryAction(msg.action)
    return PlanItem(action, converted, result, msg.idempotency_key)


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    """What to do with every call of a run after a crash (nothing was run)."""

    items: tuple[PlanItem, ...]
    interrupted: bool

    @classmethod
    def from_pb(cls, msg: recovery_pb2.RecoverResponse) -> RecoveryPlan:
        return cls(tuple([_plan_item(i) for i in msg.items]), msg.interrupted)

    @classmethod
    def joined(cls, pages: list[RecoveryPlan]) -> RecoveryPlan:
        """The plan of a run from the plans of its pages, in order."""
        items = tuple(item for page in pages for item in page.items)
        return cls(items, any(page.interrupted for page in pages))


@dataclass(frozen=True, slots=True)
class Checkpoint:
    key: str
    value: bytes
    revision: int

    @classmethod
    def from_pb(cls, msg: checkpoints_pb2.Checkpoint) -> Checkpoint:
        return cls(msg.key, msg.value, msg.revision)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who the daemon takes the caller for: the token's name and its roles
    (`agent`, `approver`, `operator`), sorted; "" and () without
    authentication."""

    name: str
    roles: tuple[str, ...]
