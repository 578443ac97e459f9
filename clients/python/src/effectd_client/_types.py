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
        kind = msg.payload.WhichOneof("kind")
        return cls(
            ok=msg.outcome == ledger_pb2.OUTCOME_OK,
            json_text=msg.payload.json if kind == "json" else None,
            raw=msg.payload.raw if kind == "raw" else None,
            error_code=msg.error_code,
            error_message=msg.error_message,
            digest=msg.digest,
        )


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
    def from_pb(cls, msg: ledger_pb2.ToolCall) -> ToolCall:
        kept = msg.kept_input.WhichOneof("kind")
        return cls(
            namespace=msg.ref.namespace,
            run_id=msg.ref.run_id,
            call_id=msg.ref.call_id,
            tool_name=msg.tool_name,
            effect=Effect(msg.effect),
            state=State(msg.state),
            revision=msg.revision,
            idempotency_key=msg.idempotency_key,
            attempt=msg.attempt,
            input_fingerprint=msg.input_fingerprint,
            approval_required=msg.approval_required,
            result=ToolResult.from_pb(msg.result) if msg.HasField("result") else None,
            history=tuple(t.event for t in msg.history),
            acknowledged=msg.acknowledged,
            updated_ns=msg.updated_at.ToNanoseconds(),
            lease_expires_ns=msg.lease_expires_at.ToNanoseconds(),
            # A daemon that predates channels sends none: TOOL.
            channel=Channel(msg.channel or ledger_pb2.CALL_CHANNEL_TOOL),
            forced_effect=Effect(msg.forced_effect) if msg.forced_effect else None,
            kept_input_json=msg.kept_input.json if kept == "json" else None,
            kept_input_raw=msg.kept_input.raw if kept == "raw" else None,
        )


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


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    """What to do with every call of a run after a crash (nothing was run)."""

    items: tuple[PlanItem, ...]
    interrupted: bool

    @classmethod
    def from_pb(cls, msg: recovery_pb2.RecoverResponse) -> RecoveryPlan:
        items = tuple(
            PlanItem(
                RecoveryAction(i.action),
                ToolCall.from_pb(i.call),
                ToolResult.from_pb(i.result) if i.HasField("result") else None,
                i.idempotency_key,
            )
            for i in msg.items
        )
        return cls(items, msg.interrupted)

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
