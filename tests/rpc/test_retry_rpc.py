"""`effectd.v1.RetryPolicy` through a real server (contract §7.2, ADR-010 D5-D7)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from effectd.v1 import errors_pb2, ledger_pb2_grpc, retry_pb2_grpc
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import retry_pb2 as ypb
from google.protobuf import timestamp_pb2

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.ledger.retry import Reason, RetryContext
from sidecar.seams import Seams
from sidecar.testing import RunningDaemon, running_daemon
from tests.rpc.support import expect_refusal, prepare_request, ref, refused
from tests.support.postgres import both_stores  # noqa: F401  (each store)

Ledger = ledger_pb2_grpc.ToolLedgerStub
Retry = retry_pb2_grpc.RetryPolicyStub
OK = "ERROR_REASON_UNSPECIFIED"


@pytest.fixture
def daemon(config: ServeConfig, clock: ManualClock) -> Iterator[RunningDaemon]:
    """A daemon whose jitter source always draws 0: waits are exact."""
    seams = Seams(clock=clock, random=lambda: 0.0)
    with running_daemon(config, seams=seams) as running:
        yield running


@pytest.fixture
def retry_stub(channel: grpc.Channel) -> Retry:
    return retry_pb2_grpc.RetryPolicyStub(channel)


def facts(
    effect: pb.Effect.ValueType = pb.EFFECT_READ,
    state: pb.CallState.ValueType = pb.CALL_STATE_UNKNOWN,
    key: str = "",
) -> ypb.RetryFacts:
    return ypb.RetryFacts(effect=effect, state=state, idempotency_key=key)


def inline(
    f: ypb.RetryFacts,
    context: ypb.RetryContext.ValueType = ypb.RETRY_CONTEXT_TOOL,
    **kw: object,
) -> ypb.DecideRetryRequest:
    return ypb.DecideRetryRequest(facts=f, context=context, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("request_", "allow", "reason"),
    [
        # ADR-010 D6: READ is retry-safe.
        (inline(facts(), attempts_used=1), True, OK),
        # ADR-010 D6: SIDE_EFFECT never, retryable or not (D7).
        (
            inline(
                facts(pb.EFFECT_SIDE_EFFECT),
                error=ypb.AttemptError(retryable=True),
            ),
            False,
            "SIDE_EFFECT_NOT_RETRY_SAFE",
        ),
        # ADR-010 D2: unspecified effect is a side effect.
        (inline(facts(pb.EFFECT_UNSPECIFIED)), False, "SIDE_EFFECT_NOT_RETRY_SAFE"),
        # ADR-010 D6: an idempotent write needs its key.
        (inline(facts(pb.EFFECT_IDEMPOTENT_WRITE)), False, "MISSING_IDEMPOTENCY_KEY"),
        (inline(facts(pb.EFFECT_IDEMPOTENT_WRITE, key="r:c")), True, OK),
        # contract §7.2: COMMITTED is never retried.
        (
            inline(facts(state=pb.CALL_STATE_COMMITTED)),
            False,
            "ALREADY_COMMITTED",
        ),
        # ADR-010 D5: an MCP transport failure is never replayed.
        (
            inline(
                facts(),
                ypb.RETRY_CONTEXT_MCP,
                error=ypb.AttemptError(kind=ypb.FAILURE_KIND_TRANSPORT, retryable=True),
            ),
            False,
            "MCP_NO_REPLAY",
        ),
        # ADR-010 R5: a run only when read-only.
        (
            inline(facts(pb.EFFECT_IDEMPOTENT_WRITE, key="k"), ypb.RETRY_CONTEXT_RUN),
            False,
            "RUN_NOT_READ_ONLY",
        ),
        (inline(facts(), ypb.RETRY_CONTEXT_RUN), True, OK),
        # ADR-010 D6: a stale durable side effect goes to reconciliation.
        (
            inline(facts(pb.EFFECT_SIDE_EFFECT), ypb.RETRY_CONTEXT_DURABLE_BACKGROUND),
            False,
            "RECONCILIATION_REQUIRED",
        ),
        # contract §7.2: the attempt budget (policy default 3).
        (inline(facts(), attempts_used=3), False, "ATTEMPTS_EXHAUSTED"),
        (inline(facts(), attempts_used=1, max_attempts=1), False, "ATTEMPTS_EXHAUSTED"),
    ],
)
def test_decide_retry_by_inline_facts(
    retry_stub: Retry, request_: ypb.DecideRetryRequest, allow: bool, reason: str
) -> None:
    """Inline facts get the answer of their contract §7.2 rule."""
    got = retry_stub.DecideRetry(request_, timeout=5)
    assert (got.allow, errors_pb2.ErrorReason.Name(got.reason)) == (allow, reason)
    assert got.backoff_ms == (500 if allow else 0)
    assert got.message


def _deadline(clock: ManualClock, ms: int) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(clock.wall_ns() + ms * 1_000_000)
    return ts


def test_a_wait_past_the_deadline_is_deadline_exceeded(
    retry_stub: Retry, clock: ManualClock
) -> None:
    """With 400 ms left, the 500 ms wait denies DEADLINE_EXCEEDED; with 2 s
    left the retry is allowed after 500 ms, the second after 1000 ms."""
    # contract §7.2: the attempt budget and the deadline always apply.
    short = retry_stub.DecideRetry(
        inline(facts(), attempts_used=1, deadline=_deadline(clock, 400))
    )
    assert (short.allow, short.backoff_ms) == (False, 500)
    assert short.reason == errors_pb2.DEADLINE_EXCEEDED
    roomy = retry_stub.DecideRetry(
        inline(facts(), attempts_used=2, deadline=_deadline(clock, 2000))
    )
    assert (roomy.allow, roomy.backoff_ms) == (True, 1000)


def test_decide_retry_by_call_identity_reads_the_ledger(
    ledger_stub: Ledger, retry_stub: Retry
) -> None:
    """By identity, the facts come from the record: an UNKNOWN idempotent write
    may be retried with its stored key, and StartTool(retry) then keeps it."""
    # ADR-010 D2 the key is stable across retries; contract §4.2 explicit retry.
    started = ledger_stub.PrepareTool(
        prepare_request("run", "w", effect=pb.EFFECT_IDEMPOTENT_WRITE, start=True)
    ).call
    ledger_stub.ReportUnknown(
        pb.ReportUnknownRequest(ref=ref("run", "w"), attempt=started.attempt)
    )
    request = ypb.DecideRetryRequest(
        call=ref("run", "w"), context=ypb.RETRY_CONTEXT_TOOL
    )
    got = retry_stub.DecideRetry(request, timeout=5)
    assert (got.allow, got.idempotency_key, got.attempts_used) == (True, "run:w", 1)
    assert got.effect == pb.EFFECT_IDEMPOTENT_WRITE
    again = ledger_stub.StartTool(pb.StartToolRequest(ref=ref("run", "w"), retry=True))
    assert again.decision == pb.DECISION_EXECUTE
    assert (again.call.attempt, again.idempotency_key) == (2, "run:w")


@pytest.mark.parametrize("effect", [pb.EFFECT_READ, pb.EFFECT_IDEMPOTENT_WRITE])
def test_decide_retry_agrees_with_start_tool_on_a_live_attempt(
    ledger_stub: Ledger,
    retry_stub: Retry,
    clock: ManualClock,
    effect: pb.Effect.ValueType,
) -> None:
    """While attempt 1 holds a live lease, DecideRetry about the call denies a
    retry (INVALID_TRANSITION) as StartTool(retry) answers IN_PROGRESS; once the
    lease ran out both allow it (audit F20: fails before the fix: DecideRetry
    allowed a retry beside the live attempt)."""
    ledger_stub.PrepareTool(
        prepare_request("run", "live", effect=effect, start=True, lease_ms=10_000)
    )
    request = ypb.DecideRetryRequest(
        call=ref("run", "live"), context=ypb.RETRY_CONTEXT_TOOL
    )
    got = retry_stub.DecideRetry(request, timeout=5)
    assert (got.allow, got.reason) == (False, errors_pb2.INVALID_TRANSITION)
    start = pb.StartToolRequest(ref=ref("run", "live"), retry=True)
    assert ledger_stub.StartTool(start).decision == pb.DECISION_IN_PROGRESS
    clock.advance(10)
    assert retry_stub.DecideRetry(request, timeout=5).allow
    assert ledger_stub.StartTool(start).decision == pb.DECISION_EXECUTE


def test_decide_retry_by_identity_of_a_committed_or_side_effect_call(
    ledger_stub: Ledger, retry_stub: Retry
) -> None:
    """A committed call is ALREADY_COMMITTED; an unknown side effect is never
    retry-safe, even with `retryable: true`."""
    call = ledger_stub.PrepareTool(prepare_request("run", "c", start=True)).call
    ledger_stub.CommitTool(
        pb.CommitToolRequest(
            ref=ref("run", "c"),
            attempt=call.attempt,
            result=pb.ToolResult(outcome=pb.OUTCOME_OK),
        )
    )
    se = ledger_stub.PrepareTool(prepare_request("run", "s", start=True)).call
    ledger_stub.ReportUnknown(
        pb.ReportUnknownRequest(ref=ref("run", "s"), attempt=se.attempt)
    )
    reasons = {}
    for call_id in ("c", "s"):
        got = retry_stub.DecideRetry(
            ypb.DecideRetryRequest(
                call=ref("run", call_id),
                context=ypb.RETRY_CONTEXT_TOOL,
                error=ypb.AttemptError(retryable=True),
            )
        )
        assert not got.allow
        reasons[call_id] = got.reason
    assert reasons == {
        "c": errors_pb2.ALREADY_COMMITTED,
        "s": errors_pb2.SIDE_EFFECT_NOT_RETRY_SAFE,
    }


def test_decide_retry_of_another_namespace_is_not_found(
    ledger_stub: Ledger, retry_stub: Retry
) -> None:
    """A call identity of another namespace answers NOT_FOUND, leaking nothing."""
    # contract §3.1 "A record of another namespace answers `NOT_FOUND`".
    ledger_stub.PrepareTool(prepare_request("run", "w", effect=pb.EFFECT_READ))
    request = ypb.DecideRetryRequest(
        call=ref("run", "w", namespace="other"), context=ypb.RETRY_CONTEXT_TOOL
    )
    got = expect_refusal(
        lambda: retry_stub.DecideRetry(request, timeout=5),
        grpc.StatusCode.NOT_FOUND,
        "NOT_FOUND",
    )
    assert got.metadata["namespace"] == "other"


@pytest.mark.parametrize(
    ("request_", "fields"),
    [
        (ypb.DecideRetryRequest(context=ypb.RETRY_CONTEXT_TOOL), ("facts",)),
        (ypb.DecideRetryRequest(facts=facts()), ("context",)),
        (
            ypb.DecideRetryRequest(
                facts=ypb.RetryFacts(effect=pb.EFFECT_READ),
                context=ypb.RETRY_CONTEXT_MCP,
            ),
            ("facts.state",),
        ),
        (
            ypb.DecideRetryRequest(
                call=pb.CallRef(run_id="a:b"), context=ypb.RETRY_CONTEXT_TOOL
            ),
            ("call.run_id", "call.call_id"),
        ),
        (
            ypb.DecideRetryRequest(
                facts=ypb.RetryFacts(effect=42, state=pb.CALL_STATE_UNKNOWN),  # type: ignore[arg-type]
                context=99,  # type: ignore[arg-type]
                error=ypb.AttemptError(kind=7, code="a\x00"),  # type: ignore[arg-type]
            ),
            ("facts.effect", "context", "error.kind", "error.code"),
        ),
    ],
)
def test_decide_retry_refuses_bad_input_by_field(
    retry_stub: Retry, request_: ypb.DecideRetryRequest, fields: tuple[str, ...]
) -> None:
    """A bad DecideRetry request is INVALID_ARGUMENT naming each bad field."""
    got = refused(lambda: retry_stub.DecideRetry(request_, timeout=5))
    assert (got.code, got.reason, got.fields) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
        fields,
    )


@pytest.mark.parametrize(
    ("policy", "want"),
    [
        # ADR-010 R2 "change the effect to side-effect": the override wins.
        (
            '[tools.pay]\neffect = "side-effect"\n',
            ("SIDE_EFFECT_NOT_RETRY_SAFE", pb.EFFECT_SIDE_EFFECT),
        ),
        # ADR-010 R2 "immediately disable the related retry-safe policy".
        ("[retry]\nretry_safe = false\n", ("RETRY_DISABLED", pb.EFFECT_READ)),
    ],
)
def test_the_operators_policy_applies_to_inline_facts(
    short_tmp: Path,
    clock: ManualClock,
    policy: str,
    want: tuple[str, int],
) -> None:
    """A READ the operator forced to SIDE_EFFECT, or any retry while the kill
    switch is off, is denied, and the answer names the effect assumed."""
    policy_file = short_tmp / "policy.toml"
    policy_file.write_text(policy)
    config = ServeConfig(data_dir=short_tmp / "strict", policy_file=policy_file)
    request = inline(
        ypb.RetryFacts(
            effect=pb.EFFECT_READ, state=pb.CALL_STATE_UNKNOWN, tool_name="pay"
        )
    )
    with (
        running_daemon(config, clock) as running,
        grpc.insecure_channel(running.target) as ch,
    ):
        got = retry_pb2_grpc.RetryPolicyStub(ch).DecideRetry(request, timeout=5)
    assert (errors_pb2.ErrorReason.Name(got.reason), got.effect) == want
    assert not got.allow


def test_the_contexts_and_reasons_on_the_wire() -> None:
    """RetryContext is RETRY_CONTEXT_ plus the contract §7.1 contexts, and every
    denial reason is a value of the one ErrorReason enum."""
    design = ["TOOL", "MCP", "CHILD_FOREGROUND", "DURABLE_BACKGROUND", "RUN"]
    assert set(ypb.RetryContext.keys()) == {
        "RETRY_CONTEXT_UNSPECIFIED",
        *(f"RETRY_CONTEXT_{name}" for name in design),
    }
    assert [c.name for c in RetryContext] == design
    assert {r.name for r in Reason} <= set(errors_pb2.ErrorReason.keys())
