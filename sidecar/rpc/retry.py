"""The `effectd.v1.RetryPolicy` service: translation only."""

from __future__ import annotations

from typing import Any

import grpc
from effectd.v1 import errors_pb2
from effectd.v1 import retry_pb2 as pb

from sidecar.ledger import retry
from sidecar.ledger.model import Effect, State
from sidecar.ledger.validation import Limits, Violations
from sidecar.rpc import caller, convert
from sidecar.services.retry import RetryService

Context = grpc.aio.ServicerContext[Any, Any]

CONTEXTS: dict[int, retry.RetryContext] = {
    pb.RetryContext.Value(f"RETRY_CONTEXT_{c.name}"): c for c in retry.RetryContext
}
FAILURES: dict[int, retry.FailureKind] = {
    # Nothing known about the failure is treated as the worst case.
    pb.FAILURE_KIND_UNSPECIFIED: retry.FailureKind.UNKNOWN,
    pb.FAILURE_KIND_TRANSPORT: retry.FailureKind.TRANSPORT,
    pb.FAILURE_KIND_TIMEOUT: retry.FailureKind.TIMEOUT,
    pb.FAILURE_KIND_APPLICATION: retry.FailureKind.APPLICATION,
}
REASON_TO_PB = {r: errors_pb2.ErrorReason.Value(r.name) for r in retry.Reason}


def _facts(v: Violations, msg: pb.RetryFacts, limits: Limits) -> retry.Facts:
    if msg.effect not in convert.EFFECTS:
        v.add("facts.effect", f"unknown enum value {msg.effect}")
    if msg.state not in convert.STATES:
        v.add("facts.state", "is required: a CALL_STATE_ value")
    v.text("facts.idempotency_key", msg.idempotency_key, limits.max_key_bytes)
    if msg.tool_name:
        v.text_id("facts.tool_name", msg.tool_name, limits.max_id_bytes)
    return retry.Facts(
        convert.EFFECTS.get(msg.effect, Effect.SIDE_EFFECT),
        convert.STATES.get(msg.state, State.UNKNOWN),
        msg.idempotency_key,
        msg.tool_name,
    )


def question(
    v: Violations, req: pb.DecideRetryRequest, limits: Limits
) -> retry.RetryQuestion:
    """The question of a request; for `call`, its facts are filled in later."""
    which = req.WhichOneof("subject")
    if which is None:
        v.add("facts", "is required: set call or facts")
        facts = retry.Facts(Effect.SIDE_EFFECT, State.UNKNOWN, "")
    elif which == "facts":
        facts = _facts(v, req.facts, limits)
    else:
        # Validated and read by the caller, which fills the facts in.
        facts = retry.Facts(Effect.SIDE_EFFECT, State.UNKNOWN, "")
    if req.context not in CONTEXTS:
        v.add("context", "is required: a RETRY_CONTEXT_ value")
    if req.error.kind not in FAILURES:
        v.add("error.kind", f"unknown enum value {req.error.kind}")
    v.text("error.code", req.error.code, limits.max_id_bytes)
    v.text("error.message", req.error.message, limits.max_text_bytes)
    deadline = None
    if req.HasField("deadline"):
        deadline = convert.timestamp_ns(v, "deadline", req.deadline)
    return retry.RetryQuestion(
        facts=facts,
        context=CONTEXTS.get(req.context, retry.RetryContext.TOOL),
        failure=FAILURES.get(req.error.kind, retry.FailureKind.UNKNOWN),
        retryable=req.error.retryable,
        attempts_used=req.attempts_used,
        deadline_ns=deadline,
        max_attempts=req.max_attempts,
    )


def response(
    asked: retry.RetryQuestion, decision: retry.RetryDecision
) -> pb.DecideRetryResponse:
    msg = pb.DecideRetryResponse(
        allow=decision.allow,
        message=decision.message,
        backoff_ms=decision.backoff_ms,
        effect=convert.EFFECT_TO_PB[decision.effect],
        max_attempts=decision.max_attempts,
        attempts_used=asked.attempts_used,
    )
    if decision.reason is not None:
        msg.reason = REASON_TO_PB[decision.reason]
    if decision.allow and decision.effect is Effect.IDEMPOTENT_WRITE:
        msg.idempotency_key = asked.facts.idempotency_key
    return msg


class RetryPolicy:
    def __init__(self, retries: RetryService, limits: Limits) -> None:
        self._retries = retries
        self._limits = limits

    async def DecideRetry(
        self, req: pb.DecideRetryRequest, _: Context
    ) -> pb.DecideRetryResponse:
        v = Violations()
        asked = question(v, req, self._limits)
        ref = None
        if req.WhichOneof("subject") == "call":
            ref = convert.ref(v, caller.current(), req.call, self._limits, "call")
        v.require()
        channel = None
        if ref is not None:
            asked, channel = await self._retries.facts_of(ref, asked)
        return response(asked, self._retries.decide(asked, channel))
