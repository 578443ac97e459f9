"""The rules of PrepareTool (contract §4, §5): record a new call, or answer a
repeat prepare for the existing record, which must be the same call (same
input, tool, effect and channel); with `start`, start it in the same step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sidecar.errors import InputMismatch
from sidecar.ledger import machine
from sidecar.ledger.attempts import retry_unknown
from sidecar.ledger.model import (
    CallRef,
    Channel,
    Decision,
    Effect,
    Event,
    Payload,
    State,
    ToolCall,
    Transition,
)
from sidecar.ledger.policy import Policy
from sidecar.ledger.steps import (
    AGENT,
    Answer,
    Now,
    Step,
    answer_for,
    begin,
    enforce,
    settle,
)


@dataclass(frozen=True, slots=True)
class PrepareSpec:
    ref: CallRef
    tool_name: str
    effect: Effect
    input: Payload
    fingerprint: str
    require_approval: bool
    start: bool
    lease_ms: int
    # Who prepares: recorded in the history (the token's name with
    # authentication on).
    actor: str = AGENT
    # With `start`: start a call whose last attempt has an unknown outcome
    # again, as an explicit retry under the retry rules (as StartTool's).
    retry: bool = False
    # How the agent reaches the tool (ADR-010 D5, D6); part of the identity.
    channel: Channel = Channel.TOOL


def prepare(
    existing: ToolCall | None,
    spec: PrepareSpec,
    now: Now,
    policy: Policy | None = None,
) -> Step:
    """PrepareTool: record the call, or answer for the existing record.

    With `spec.start`, EXECUTE means that this caller holds the attempt
    (contract §5.2), and a call whose last attempt has an unknown outcome is
    started again only as StartTool would start it: an explicit retry
    (`spec.retry`) under the retry rules, in this transaction; otherwise the
    refusal says why. A SIDE_EFFECT of unknown outcome answers RECONCILE.
    """
    if existing is None:
        call = _create(spec, now)
        if policy is not None and policy.effect_for(call) is not call.effect:
            # Recorded with the call: decided under the override (R2).
            call = dataclasses.replace(call, forced_effect=Effect.SIDE_EFFECT)
    else:
        mismatch = _mismatch(existing, spec)
        if mismatch:
            meta = {"callRevision": str(existing.revision)}
            return Step(existing, InputMismatch(mismatch, meta))
        call = enforce(settle(existing, now), policy, now)
        if spec.require_approval and not call.approval_required:
            return _require_approval(existing, call, spec, now, policy)
    if spec.start and call.state is State.PREPARED:
        started = begin(call, now, spec.lease_ms, Event.START, spec.actor)
        return Step(started, Answer(Decision.EXECUTE, started, attempt_held=True))
    answer = answer_for(call, policy=policy)
    if spec.start and answer.retry_required:
        return retry_unknown(
            call,
            now,
            lease_ms=spec.lease_ms,
            retry=spec.retry,
            policy=policy or Policy(),
            actor=spec.actor,
        )
    return Step(call, answer)


def _require_approval(
    existing: ToolCall,
    call: ToolCall,
    spec: PrepareSpec,
    now: Now,
    policy: Policy | None,
) -> Step:
    """A repeat prepare that requires an approval the call was prepared
    without: a call that never started waits for it (AWAITING_APPROVAL); one
    that started already ran without it, so the prepare is refused."""
    if call.state is not State.PREPARED:
        return Step(
            existing,
            InputMismatch(
                "the call was prepared without approval and has started: an "
                "approval cannot be required after the fact; use a new call_id",
                {"callRevision": str(existing.revision), "state": call.state.name},
            ),
        )
    waiting = machine.apply(
        call,
        Event.REQUIRE_APPROVAL,
        at_ns=now.wall_ns,
        actor=spec.actor,
        reason="a repeat prepare requires approval",
        approval_required=True,
        # The approver must see what they approve (`kept_inputs`), also of
        # a record written before every input was kept.
        kept_input=call.kept_input or spec.input,
    )
    return Step(waiting, answer_for(waiting, policy=policy))


def _create(spec: PrepareSpec, now: Now) -> ToolCall:
    state = State.AWAITING_APPROVAL if spec.require_approval else State.PREPARED
    entry = Transition(None, state, Event.PREPARE, now.wall_ns, spec.actor, "", 1, 0)
    return ToolCall(
        ref=spec.ref,
        tool_name=spec.tool_name,
        effect=spec.effect,
        state=state,
        revision=1,
        input_fingerprint=spec.fingerprint,
        approval_required=spec.require_approval,
        channel=spec.channel,
        attempt=0,
        created_ns=now.wall_ns,
        updated_ns=now.wall_ns,
        history=(entry,),
        # Until it is settled (`kept_inputs`): what an operator looks for.
        kept_input=spec.input,
    )


def _mismatch(call: ToolCall, spec: PrepareSpec) -> str:
    if call.input_fingerprint != spec.fingerprint:
        return (
            "the call was prepared with another input; use a new call_id for a new call"
        )
    if call.tool_name != spec.tool_name:
        return f"the call was prepared for tool {call.tool_name!r}"
    if call.effect is not spec.effect:
        return f"the call was prepared with effect {call.effect.name}"
    if call.channel is not spec.channel:
        return f"the call was prepared through channel {call.channel.name}"
    return ""
