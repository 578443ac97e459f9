"""The rate limit end to end: it charges the caller, never a namespace the
caller was refused, cannot be escaped by naming new namespaces, and never
refuses the RPCs that record work already done (docs/ledger.md, Quotas)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import recovery_pb2 as rpb

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.ledger.quota import Quotas
from sidecar.testing import running_daemon
from tests.auth.support import (
    AGENT_A,
    AGENT_AB,
    AGENT_B,
    OPERATOR_ALL,
    Stubs,
    authenticated_daemon,
    stubs,
)
from tests.rpc.support import decode, prepare_request, ref, refused

# One token per 100 s after the burst: on the manual clock the bucket refills
# only when a test moves it, and on a real one not during a test.
SLOW = Quotas(requests_per_second=0.01, burst=3)


def outcome(fn: Callable[[], object]) -> str:
    """ "OK", or the ErrorInfo reason (or gRPC code) of the refusal."""
    try:
        fn()
    except grpc.RpcError as exc:
        got = decode(exc)
        return got.reason or got.code.name
    return "OK"


def get(s: Stubs, namespace: str, call_id: str = "missing") -> Callable[[], object]:
    request = pb.GetToolCallRequest(ref=ref("run", call_id, namespace))
    return lambda: s.ledger.GetToolCall(request, metadata=s.metadata, timeout=10)


@pytest.fixture
def plain(config: ServeConfig, clock: ManualClock) -> Iterator[Stubs]:
    """A daemon without authentication, at the slow rate, on the manual clock."""
    with (
        running_daemon(dataclasses.replace(config, quotas=SLOW), clock) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        yield stubs(channel, None)


@pytest.fixture
def secured(short_tmp: Path) -> Iterator[grpc.Channel]:
    """A daemon with the test tokens, at the slow rate."""
    with authenticated_daemon(short_tmp / "data", quotas=SLOW) as (_, channel):
        yield channel


def test_work_already_done_is_recorded_with_the_bucket_empty(plain: Stubs) -> None:
    """With the namespace's bucket empty (a prepare is RATE_LIMITED),
    Heartbeat, ReportUnknown, CommitTool and AcknowledgeRecovery are still
    answered (issue 10 item 7: fails before the fix: the commit was
    RATE_LIMITED, and the tool's result could not be recorded)."""
    ledger = plain.ledger
    for call_id in ("c1", "c2"):
        answer = ledger.PrepareTool(prepare_request("run", call_id, start=True))
        assert answer.decision == pb.DECISION_EXECUTE
    assert outcome(get(plain, "")) == "NOT_FOUND"  # the third token
    fourth = prepare_request("run", "c3")
    assert outcome(lambda: ledger.PrepareTool(fourth, timeout=10)) == "RATE_LIMITED"

    ledger.Heartbeat(pb.HeartbeatRequest(ref=ref("run", "c1"), attempt=1))
    ledger.ReportUnknown(
        pb.ReportUnknownRequest(ref=ref("run", "c2"), attempt=1, reason="lost")
    )
    result = pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json="{}"))
    committed = ledger.CommitTool(
        pb.CommitToolRequest(ref=ref("run", "c1"), attempt=1, result=result)
    )
    assert committed.call.state == pb.CALL_STATE_COMMITTED
    plain.recovery.AcknowledgeRecovery(
        rpb.AcknowledgeRecoveryRequest(run_id="run", call_ids=["c1"])
    )
    # The limit is still in force for anything else.
    assert outcome(lambda: ledger.PrepareTool(fourth, timeout=10)) == "RATE_LIMITED"


def test_the_bucket_refills_on_the_daemons_clock(
    plain: Stubs, clock: ManualClock
) -> None:
    """The limiter reads the injected clock: with the bucket empty, moving the
    clock by less than one token's time (100 s) admits nothing (the control),
    the rest of it admits exactly one request (fails before the fix: the
    limiter read time.monotonic, so moving the clock refilled nothing)."""
    answers = [outcome(get(plain, "a")) for _ in range(4)]
    assert answers == ["NOT_FOUND"] * 3 + ["RATE_LIMITED"]
    clock.advance(99)
    assert outcome(get(plain, "a")) == "RATE_LIMITED"
    clock.advance(1)
    assert [outcome(get(plain, "a")) for _ in range(2)] == [
        "NOT_FOUND",
        "RATE_LIMITED",
    ]


def test_requests_naming_another_namespace_are_charged_to_the_caller(
    secured: grpc.Channel,
) -> None:
    """Agent A's requests naming namespace b (NOT_FOUND) drain A's bucket,
    not b's: A is then RATE_LIMITED as namespace a, and agent B's own
    requests are all answered (issue 10 item 23: fails before the fix: A's
    refused requests drained b's bucket, and B got RATE_LIMITED)."""
    a, b = stubs(secured, AGENT_A), stubs(secured, AGENT_B)
    answers = [outcome(get(a, "b")) for _ in range(10)]
    assert answers == ["NOT_FOUND"] * 3 + ["RATE_LIMITED"] * 7
    limited = refused(get(a, "b"))
    assert limited.metadata == {"limit": "0.01", "namespace": "a"}
    assert [outcome(get(b, "b")) for _ in range(3)] == ["NOT_FOUND"] * 3


def test_made_up_namespaces_do_not_widen_a_tokens_limit(
    secured: grpc.Channel,
) -> None:
    """Tokens of several or of every namespace are charged as themselves,
    whatever namespace each request names: 20 requests naming 20 different
    namespaces get the token's 3 (issue 10 item 23: fails before the fix:
    every name not seen before had a full bucket, so none was refused)."""
    for secret, name in ((OPERATOR_ALL, "operator-all"), (AGENT_AB, "agent-ab")):
        s = stubs(secured, secret)
        answers = [outcome(get(s, f"made-up-{name}-{i}")) for i in range(20)]
        assert answers.count("RATE_LIMITED") == 17, answers
        assert refused(get(s, "a")).metadata == {"limit": "0.01", "token": name}


def test_invalid_namespaces_share_one_bucket_without_authentication(
    plain: Stubs,
) -> None:
    """Without authentication, requests naming invalid namespaces are
    charged to one shared bucket, never a bucket per name; valid namespaces
    keep their own (issue 10 item 23: fails before the fix: each made-up
    name had a full bucket of its own)."""
    answers = [outcome(get(plain, f"bad/{i}")) for i in range(10)]
    assert answers == ["INVALID_REQUEST"] * 3 + ["RATE_LIMITED"] * 7
    assert refused(get(plain, "bad/x")).metadata == {"limit": "0.01"}
    for namespace in ("tenant-a", "tenant-b"):
        assert [outcome(get(plain, namespace)) for _ in range(3)] == ["NOT_FOUND"] * 3


def test_the_limiter_is_off_at_rate_zero(config: ServeConfig) -> None:
    """Control: with no rate configured nothing is ever RATE_LIMITED."""
    unlimited = dataclasses.replace(config, quotas=Quotas())
    with (
        running_daemon(unlimited) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        s = stubs(channel, None)
        assert {outcome(get(s, "a")) for _ in range(50)} == {"NOT_FOUND"}
