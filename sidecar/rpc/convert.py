"""Translation between the `effectd.v1` messages several services share
(call refs, payloads, tool calls and their history) and domain values; a
service's own messages are translated in its servicer's module, the
operator's orders in `sidecar.rpc.operator_orders`.

Requests are validated while they are translated: every problem becomes a
field violation named by its path in the request, and all of them are
raised together as INVALID_ARGUMENT. Each namespace a request names is read
against the call's `Caller`, which the boundary resolved and the servicer
hands in; nothing here looks at the credential or the call's context.
"""

from __future__ import annotations

from effectd.v1 import ledger_pb2 as pb
from google.protobuf import timestamp_pb2

from sidecar.ledger import fingerprint, operator_rules
from sidecar.ledger.model import (
    APPROVAL_REJECTED,
    Approval,
    CallRef,
    Channel,
    Decision,
    Effect,
    Event,
    Outcome,
    Payload,
    PayloadKind,
    Reconciliation,
    Resolution,
    Result,
    State,
    ToolCall,
    Transition,
)
from sidecar.ledger.policy import Policy
from sidecar.ledger.rules import AGENT, Answer, PrepareSpec
from sidecar.ledger.validation import Limits, Violations
from sidecar.rpc.caller import Caller

EFFECTS: dict[int, Effect] = {
    # ADR-010 D2: an undeclared effect is a side effect.
    pb.EFFECT_UNSPECIFIED: Effect.SIDE_EFFECT,
    pb.EFFECT_READ: Effect.READ,
    pb.EFFECT_IDEMPOTENT_WRITE: Effect.IDEMPOTENT_WRITE,
    pb.EFFECT_SIDE_EFFECT: Effect.SIDE_EFFECT,
}
EFFECT_TO_PB = {e: pb.Effect.Value(f"EFFECT_{e.name}") for e in Effect}
CHANNELS: dict[int, Channel] = {
    pb.CALL_CHANNEL_UNSPECIFIED: Channel.TOOL,
    **{pb.CallChannel.Value(f"CALL_CHANNEL_{c.name}"): c for c in Channel},
}
CHANNEL_TO_PB = {c: pb.CallChannel.Value(f"CALL_CHANNEL_{c.name}") for c in Channel}
STATES: dict[int, State] = {
    pb.CallState.Value(f"CALL_STATE_{s.name}"): s for s in State
}
STATE_TO_PB = {s: pb.CallState.Value(f"CALL_STATE_{s.name}") for s in State}
# The history's event names, a dict lookup rather than `Event.value`'s two
# Python frames per transition.
EVENT_TO_PB = {e: e.value for e in Event}
DECISION_TO_PB = {d: pb.Decision.Value(f"DECISION_{d.name}") for d in Decision}
OUTCOMES: dict[int, Outcome] = {
    pb.OUTCOME_OK: Outcome.OK,
    pb.OUTCOME_ERROR: Outcome.ERROR,
}
OUTCOME_TO_PB = {o: pb.Outcome.Value(f"OUTCOME_{o.name}") for o in Outcome}


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


# -- requests --------------------------------------------------------------


def namespace(
    v: Violations, caller: Caller, value: str, field: str = "namespace"
) -> str:
    """The namespace the request acts in: with authentication on, the
    caller's credential decides (`Caller.place`)."""
    return caller.place(v, field, value)


def ref(
    v: Violations, caller: Caller, msg: pb.CallRef, limits: Limits, field: str = "ref"
) -> CallRef:
    ns = caller.place(v, _join(field, "namespace"), msg.namespace)
    v.text_id(_join(field, "run_id"), msg.run_id, limits.max_id_bytes, no_colon=True)
    v.text_id(_join(field, "call_id"), msg.call_id, limits.max_id_bytes)
    return CallRef(ns, msg.run_id, msg.call_id)


def run_id(v: Violations, value: str, limits: Limits, field: str = "run_id") -> None:
    if value:
        v.text_id(field, value, limits.max_id_bytes, no_colon=True)


def lease_ms(v: Violations, value: int, limits: Limits, field: str = "lease_ms") -> int:
    """0 stands for the policy's default lease."""
    if value != 0:
        v.bounded(field, value, 1, limits.max_lease_ms)
    return value


def page_size(
    v: Violations, value: int, limits: Limits, field: str = "page_size"
) -> int:
    if value == 0:
        return limits.default_page_size
    v.bounded(field, value, 1, limits.max_page_size)
    return value


def payload(
    v: Violations, msg: pb.Payload, limits: Limits, field: str, *, required: bool
) -> tuple[Payload | None, bytes]:
    """The payload and its canonical bytes (JSON in its RFC 8785 form, raw
    bytes as sent), which validating JSON computes: a payload is
    canonicalized once, here, and hashed from them (empty next to a
    violation)."""
    kind = msg.WhichOneof("kind")
    if kind is None:
        if required:
            v.add(field, "is required: set json or raw")
        return None, b""
    if kind == "raw":
        v.size(_join(field, "raw"), msg.raw, limits.max_payload_bytes)
        return Payload(PayloadKind.RAW, msg.raw), msg.raw
    data = msg.json.encode("utf-8", "surrogatepass")
    v.size(_join(field, "json"), data, limits.max_payload_bytes)
    canonical = b""
    if len(data) <= limits.max_payload_bytes:
        try:
            canonical = fingerprint.canonical_json(data)
        except fingerprint.NotCanonicalizable as exc:
            v.add(_join(field, "json"), f"must be JSON with one RFC 8785 form: {exc}")
    return Payload(PayloadKind.JSON, data), canonical


def _enum(
    v: Violations, field: str, value: int, known: dict[int, Effect] | dict[int, Channel]
) -> None:
    if value not in known:
        v.add(field, f"unknown enum value {value}")


def prepare_spec(
    v: Violations,
    caller: Caller,
    req: pb.PrepareToolRequest,
    limits: Limits,
    field: str = "",
) -> PrepareSpec:
    call_ref = ref(v, caller, req.ref, limits, _join(field, "ref"))
    v.text_id(_join(field, "tool_name"), req.tool_name, limits.max_id_bytes)
    _enum(v, _join(field, "effect"), req.effect, EFFECTS)
    _enum(v, _join(field, "channel"), req.channel, CHANNELS)
    tool_input, canonical = payload(
        v, req.input, limits, _join(field, "input"), required=True
    )
    lease = lease_ms(v, req.lease_ms, limits, _join(field, "lease_ms"))
    if v.items or tool_input is None:
        return _unusable_spec(call_ref)
    return PrepareSpec(
        ref=call_ref,
        tool_name=req.tool_name,
        effect=EFFECTS[req.effect],
        input=tool_input,
        fingerprint=fingerprint.fingerprint(tool_input, canonical),
        require_approval=req.require_approval,
        start=req.start,
        lease_ms=lease,
        actor=caller.actor(AGENT),
        retry=req.retry,
        channel=CHANNELS[req.channel],
    )


def _unusable_spec(call_ref: CallRef) -> PrepareSpec:
    # Returned only next to violations, which the caller raises.
    return PrepareSpec(
        call_ref,
        "",
        Effect.SIDE_EFFECT,
        Payload(PayloadKind.RAW, b""),
        "",
        False,
        False,
        0,
    )


def result(
    v: Violations, msg: pb.ToolResult, limits: Limits, field: str = "result"
) -> Result:
    if msg.outcome not in OUTCOMES:
        v.add(_join(field, "outcome"), "must be OUTCOME_OK or OUTCOME_ERROR")
    data, canonical = payload(
        v, msg.payload, limits, _join(field, "payload"), required=False
    )
    v.text(_join(field, "error_code"), msg.error_code, limits.max_id_bytes)
    v.text(_join(field, "error_message"), msg.error_message, limits.max_text_bytes)
    if msg.error_code == APPROVAL_REJECTED:
        v.add(
            _join(field, "error_code"), f"{APPROVAL_REJECTED} is reserved for approvers"
        )
    if msg.digest:
        v.add(_join(field, "digest"), "is output only")
    if v.items:
        return Result(Outcome.ERROR, None, "", "", "")
    outcome = OUTCOMES[msg.outcome]
    digest = fingerprint.result_digest(
        outcome, data, msg.error_code, msg.error_message, canonical
    )
    return Result(outcome, data, msg.error_code, msg.error_message, digest)


def optional_revision(msg: pb.StartToolRequest | pb.CommitToolRequest) -> int | None:
    return msg.expected_revision if msg.HasField("expected_revision") else None


def states(v: Violations, values: list[int], field: str = "states") -> frozenset[State]:
    if len(values) > len(STATES):
        v.add(field, f"must hold at most {len(STATES)} states, got {len(values)}")
        return frozenset()
    for i, value in enumerate(values):
        if value not in STATES:
            v.add(f"{field}[{i}]", f"unknown call state {value}")
    return frozenset(STATES[x] for x in values if x in STATES)


# A google.protobuf.Timestamp's range: 0001-01-01T00:00:00Z to
# 9999-12-31T23:59:59.999999999Z, nanos 0..999 999 999 (timestamp.proto).
TIMESTAMP_SECONDS = (-62_135_596_800, 253_402_300_799)
MAX_NANOS = 999_999_999


def timestamp_ns(v: Violations, field: str, ts: timestamp_pb2.Timestamp) -> int:
    """A request's Timestamp as nanoseconds since the epoch; one outside the
    range timestamp.proto defines (negative nanos, years outside 1..9999) is
    a field violation, answered 0."""
    low, high = TIMESTAMP_SECONDS
    if not low <= ts.seconds <= high:
        v.add(field, "must be between 0001-01-01 and 9999-12-31 (seconds out of range)")
        return 0
    if not 0 <= ts.nanos <= MAX_NANOS:
        v.add(field, f"nanos must be between 0 and {MAX_NANOS}, got {ts.nanos}")
        return 0
    return ts.seconds * 1_000_000_000 + ts.nanos


# -- answers ---------------------------------------------------------------


_NS = 1_000_000_000
_Timestamp = timestamp_pb2.Timestamp


def timestamp(ns: int) -> timestamp_pb2.Timestamp:
    # `FromNanoseconds`'s own arithmetic (floor division and modulo), in one
    # constructor call rather than two Python frames and two field sets: an
    # answer carries about six.
    return _Timestamp(seconds=ns // _NS, nanos=ns % _NS)


def payload_pb(p: Payload | None) -> pb.Payload | None:
    if p is None:
        return None
    if p.kind is PayloadKind.JSON:
        return pb.Payload(json=p.data.decode("utf-8", "surrogatepass"))
    return pb.Payload(raw=p.data)


def _transition_pb(t: Transition) -> pb.Transition:
    return pb.Transition(
        from_state=STATE_TO_PB[t.from_state]
        if t.from_state
        else pb.CALL_STATE_UNSPECIFIED,
        to_state=STATE_TO_PB[t.to_state],
        event=EVENT_TO_PB[t.event],
        at=timestamp(t.at_ns),
        actor=t.actor,
        reason=t.reason,
        revision=t.revision,
        attempt=t.attempt,
    )


def call_pb(
    call: ToolCall, *, history: bool = True, policy: Policy | None = None
) -> pb.ToolCall:
    """The record; with `history`, the whole of it (the kept input too),
    without, the summary that lists and plans carry; with `policy`, when its
    reconcile quarantine ends, for an UNKNOWN call."""
    return _call_pb(call, history=history, kept_input=history, policy=policy)


def agent_call_pb(call: ToolCall, policy: Policy | None = None) -> pb.ToolCall:
    """The record as the answers to the agent's own steps carry it: whole,
    but the input the agent just sent only while an approver must see it
    (AWAITING_APPROVAL); echoing every call's input would send each one back
    with every prepare, start, heartbeat and commit."""
    awaiting = call.state is State.AWAITING_APPROVAL
    return _call_pb(call, history=True, kept_input=awaiting, policy=policy)


def _call_pb(
    call: ToolCall, *, history: bool, kept_input: bool, policy: Policy | None
) -> pb.ToolCall:
    msg = pb.ToolCall(
        ref=pb.CallRef(
            namespace=call.ref.namespace,
            run_id=call.ref.run_id,
            call_id=call.ref.call_id,
        ),
        tool_name=call.tool_name,
        effect=EFFECT_TO_PB[call.effect],
        state=STATE_TO_PB[call.state],
        revision=call.revision,
        idempotency_key=call.idempotency_key,
        key_scheme=call.key_scheme,
        input_fingerprint=call.input_fingerprint,
        approval_required=call.approval_required,
        channel=CHANNEL_TO_PB[call.channel],
        attempt=call.attempt,
        acknowledged=call.acknowledged,
        created_at=timestamp(call.created_ns),
        updated_at=timestamp(call.updated_ns),
    )
    if call.forced_effect is not None:
        msg.forced_effect = EFFECT_TO_PB[call.forced_effect]
    if call.lease is not None:
        msg.lease_expires_at.CopyFrom(timestamp(call.lease.expires_wall_ns))
    if call.state is State.UNKNOWN:
        msg.unknown_since.CopyFrom(timestamp(call.outcome_unknown_since_ns))
        if policy is not None:
            ends = operator_rules.quarantine_end_ns(call, policy)
            msg.quarantine_ends_at.CopyFrom(timestamp(ends))
    if call.result is not None:
        r = call.result
        msg.result.CopyFrom(
            pb.ToolResult(
                outcome=OUTCOME_TO_PB[r.outcome],
                payload=payload_pb(r.payload),
                error_code=r.error_code,
                error_message=r.error_message,
                digest=r.digest,
            )
        )
    if call.approval is not None:
        msg.approval.CopyFrom(_approval_pb(call.approval))
    msg.reconciliations.extend(_reconciliation_pb(r) for r in call.reconciliations)
    if history:
        msg.history.extend(_transition_pb(t) for t in call.history)
    kept = payload_pb(call.kept_input) if kept_input else None
    if kept is not None:
        msg.kept_input.CopyFrom(kept)
    return msg


def prepare_response(
    answer: Answer, policy: Policy | None = None
) -> pb.PrepareToolResponse:
    return pb.PrepareToolResponse(
        decision=DECISION_TO_PB[answer.decision],
        call=agent_call_pb(answer.call, policy),
        idempotency_key=answer.idempotency_key,
        attempt_held=answer.attempt_held,
        retry_required=answer.retry_required,
    )


# -- approvals and reconciliations ---------------------------------------------

RESOLUTION_TO_PB = {r: pb.Resolution.Value(f"RESOLUTION_{r.name}") for r in Resolution}


def _approval_pb(a: Approval) -> pb.Approval:
    return pb.Approval(
        approved=a.approved,
        approver=a.approver,
        reason=a.reason,
        decided_at=timestamp(a.at_ns),
        input_fingerprint=a.input_fingerprint,
        revision=a.revision,
    )


def _reconciliation_pb(r: Reconciliation) -> pb.Reconciliation:
    return pb.Reconciliation(
        resolution=RESOLUTION_TO_PB[r.resolution],
        operator=r.operator,
        reason=r.reason,
        evidence=r.evidence,
        reconciled_at=timestamp(r.at_ns),
        from_state=STATE_TO_PB[r.from_state],
        revision=r.revision,
        attempt=r.attempt,
    )
