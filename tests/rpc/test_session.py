"""The ledger session stream: each message is served exactly as its unary
RPC (the same answer, the same refusal with the same details, the same
roles, namespaces, rate limit and records), many at once and each answered
when it is done, at most `session_max_in_flight` of a stream at a time;
cancel, deadlines, duplicate ids, a message that does not parse, a client
that goes away and a daemon that stops each end as the protos say.

Messages are held where a test needs them in flight: the ledger service of
`HeldDaemon` holds the prepare of a call whose id starts with `hold` until
the test releases it, and counts how many it holds at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc as pb_grpc
from google.rpc import status_pb2 as pb_status
from grpc_status import rpc_status

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.ledger.quota import Quotas
from sidecar.observability.metrics import Metrics
from sidecar.rpc import session as session_module
from sidecar.rpc.concurrency import Pool
from sidecar.testing import RunningDaemon, running_daemon
from tests.auth.support import (
    AGENT_A,
    AGENT_AB,
    AGENT_B,
    APPROVER_A,
    authenticated_daemon,
)
from tests.rpc.sessions import (
    Conversation,
    HeldDaemon,
    Holds,
    answer_of,
    exchange,
    message,
    on_loop,
    prepare,
    refusal,
)
from tests.rpc.support import Refusal, assert_serving, decode, decode_status, ref

R = grpc.StatusCode
OK_RESULT = pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json='{"ok":1}'))
TRACE_A = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACE_B = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def holds() -> Holds:
    return Holds()


@pytest.fixture
def held(config: ServeConfig, holds: Holds) -> Iterator[RunningDaemon]:
    """A daemon whose prepares of `hold*` calls wait for `holds`."""
    limits = dataclasses.replace(config.server_limits, session_max_in_flight=4)
    cfg = dataclasses.replace(config, server_limits=limits, grace_seconds=30)
    with running_daemon(cfg, daemon=HeldDaemon(cfg, holds)) as running:
        try:
            yield running
        finally:
            holds.release()  # before the daemon stops


@pytest.fixture
def held_channel(held: RunningDaemon) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(held.target) as ch:
        yield ch


# -- each message as its unary RPC ------------------------------------------


def _script() -> list[tuple[str, Any]]:
    """A run of ledger requests that answer and refuse in every way: the
    unary method and its request."""
    other = pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json='{"ok":2}'))
    return [
        ("PrepareTool", prepare("c1")),
        (
            "PrepareTool",
            pb.PrepareToolRequest(
                ref=ref("run", "c1"), tool_name="tool", input=pb.Payload(json='{"x":1}')
            ),
        ),
        (
            "PrepareTools",
            pb.PrepareToolsRequest(
                calls=[prepare("c2", start=False), prepare("c3", start=False)]
            ),
        ),
        ("StartTool", pb.StartToolRequest(ref=ref("run", "c2"))),
        ("StartTool", pb.StartToolRequest(ref=ref("run", "c2"))),
        ("StartTool", pb.StartToolRequest(ref=ref("run", "c3"), expected_revision=9)),
        ("Heartbeat", pb.HeartbeatRequest(ref=ref("run", "c2"), attempt=1)),
        (
            "CommitTool",
            pb.CommitToolRequest(ref=ref("run", "c2"), attempt=1, result=OK_RESULT),
        ),
        (
            "CommitTool",
            pb.CommitToolRequest(ref=ref("run", "c2"), attempt=1, result=other),
        ),
        ("CommitTool", pb.CommitToolRequest(ref=ref("run\x00", ""))),
        (
            "ReportUnknown",
            pb.ReportUnknownRequest(ref=ref("run", "c1"), attempt=1, reason="lost"),
        ),
        ("GetToolCall", pb.GetToolCallRequest(ref=ref("run", "c1"))),
        ("GetToolCall", pb.GetToolCallRequest(ref=ref("run", "missing"))),
        ("GetToolCall", pb.GetToolCallRequest(ref=ref("a:b", "c"))),
        ("PrepareTools", pb.PrepareToolsRequest()),
    ]


def _unary(channel: grpc.Channel, method: str, request: Any) -> bytes:
    """The answer's bytes, or the google.rpc.Status of the refusal
    (prefixed, so the two cannot be confused)."""
    call = channel.unary_unary(f"/effectd.v1.ToolLedger/{method}", None, None)
    try:
        answer: bytes = call(request.SerializeToString(), timeout=30)
    except grpc.RpcError as exc:
        refused: bytes = _status_of(exc).SerializeToString(deterministic=True)
        return b"error:" + refused
    return b"answer:" + answer


def _status_of(exc: grpc.RpcError) -> pb_status.Status:
    """The google.rpc.Status a unary refusal carries, checked against its
    code and message."""
    call = cast(grpc.Call, exc)
    status = rpc_status.from_call(call)
    code, details = call.code().value[0], call.details()
    if status is None or (status.code, status.message) != (code, details):
        raise AssertionError(f"{exc} carries no matching google.rpc.Status")
    return status


def _through_session(conversation: Conversation, id: int, request: Any) -> bytes:
    conversation.send(message(id, request))
    got = conversation.receive()
    assert got.id == id
    which = got.WhichOneof("response")
    if which == "error":
        refused: bytes = got.error.SerializeToString(deterministic=True)
        return b"error:" + refused
    answer: bytes = getattr(got, str(which)).SerializeToString()
    return b"answer:" + answer


def test_each_message_is_answered_as_its_unary_rpc(short_tmp: Path) -> None:
    """The same requests, on two daemons in the same state (a manual clock
    at the same time): the unary answers and the session answers are the
    same bytes, refusals the same google.rpc.Status with the same
    ErrorInfo, BadRequest and metadata."""
    unary_cfg = ServeConfig(data_dir=short_tmp / "unary", init=True)
    session_cfg = ServeConfig(data_dir=short_tmp / "session", init=True)
    with (
        running_daemon(unary_cfg, ManualClock()) as u,
        running_daemon(session_cfg, ManualClock()) as s,
        grpc.insecure_channel(u.target) as uch,
        grpc.insecure_channel(s.target) as sch,
    ):
        conversation = Conversation(sch)
        reasons = set()
        for i, (method, request) in enumerate(_script()):
            unary = _unary(uch, method, request)
            got = _through_session(conversation, i + 1, request)
            assert got == unary, f"step {i}: {method}"
            if got.startswith(b"error:"):
                status = pb_status.Status.FromString(got.removeprefix(b"error:"))
                refused = decode_status(status)
                reasons.add((refused.reason, refused.fields))
        assert conversation.close() == []
    # A control: the script refuses in each of these ways.
    assert {r for r, _ in reasons} == {
        "INPUT_MISMATCH",
        "REVISION_CONFLICT",
        "RESULT_MISMATCH",
        "INVALID_REQUEST",
        "NOT_FOUND",
    }, reasons
    assert any(f is not None and len(f) > 1 for _, f in reasons), reasons


# -- roles and namespaces ----------------------------------------------------


def test_a_message_whose_rpc_the_role_may_not_call_is_refused_alone(
    short_tmp: Path,
) -> None:
    """An approver's stream: its PrepareTool is refused PERMISSION_DENIED
    with the unary refusal's ErrorInfo, its GetToolCall served; an agent of
    A reads a record of B as NOT_FOUND, as unary, while its own prepare on
    the same stream succeeds."""
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        b = (("authorization", f"Bearer {AGENT_B}"),)
        seeded = exchange(channel, [message(1, prepare("of-b"))], b)
        assert seeded[1].prepare_tool.decision == pb.DECISION_EXECUTE

        approver = (("authorization", f"Bearer {APPROVER_A}"),)
        answers = exchange(
            channel,
            [
                message(1, prepare("x")),
                message(2, pb.GetToolCallRequest(ref=ref("run", "of-b", "a"))),
            ],
            approver,
        )
        unary = _refusal_of_unary(channel, "PrepareTool", prepare("x"), approver)
        assert refusal(answers[1]) == unary
        assert unary.code is R.PERMISSION_DENIED
        assert unary.metadata == {"requiredRoles": "agent"}
        assert refusal(answers[2]).reason == "NOT_FOUND"

        agent = (("authorization", f"Bearer {AGENT_A}"),)
        of_b = pb.GetToolCallRequest(ref=ref("run", "of-b", "b"))
        answers = exchange(
            channel, [message(1, of_b), message(2, prepare("mine"))], agent
        )
        assert refusal(answers[1]) == _refusal_of_unary(
            channel, "GetToolCall", of_b, agent
        )
        assert refusal(answers[1]).code is R.NOT_FOUND
        assert answers[2].prepare_tool.call.ref.namespace == "a"


def test_a_stream_needs_a_credential(short_tmp: Path) -> None:
    """Without a token the stream itself is refused UNAUTHENTICATED, before
    any message is read."""
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        with pytest.raises(grpc.RpcError) as info:
            exchange(channel, [message(1, prepare("x"))])
        assert decode(info.value).reason == "UNAUTHENTICATED"


def _refusal_of_unary(
    channel: grpc.Channel, method: str, request: Any, metadata: Any
) -> Refusal:
    call = channel.unary_unary(
        f"/effectd.v1.ToolLedger/{method}", lambda m: m.SerializeToString(), None
    )
    with pytest.raises(grpc.RpcError) as info:
        call(request, metadata=metadata, timeout=30)
    return decode(info.value)


# -- rate limit and quotas ----------------------------------------------------


def test_rate_limit_and_quota_apply_per_message_never_to_commits(
    config: ServeConfig, clock: ManualClock
) -> None:
    """At a rate of 3 requests in a burst, a stream's fourth prepare is
    refused RATE_LIMITED as a unary one would be, while its commits and
    heartbeats (records of work done) are all served; past the open-calls
    quota a prepare is refused QUOTA_EXCEEDED."""
    quotas = Quotas(requests_per_second=0.01, burst=3, open_calls=3)
    cfg = dataclasses.replace(config, quotas=quotas)
    with (
        running_daemon(cfg, clock) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        conversation = Conversation(channel)
        for i in range(3):
            conversation.send(message(i, prepare(f"c{i}")))
            assert answer_of(conversation.receive()).decision == pb.DECISION_EXECUTE
        conversation.send(message(3, prepare("c3")))
        assert refusal(conversation.receive()).reason == "RATE_LIMITED"
        for i in range(3):
            conversation.send(
                message(10 + i, pb.HeartbeatRequest(ref=ref("run", f"c{i}"), attempt=1))
            )
            assert conversation.receive().WhichOneof("response") == "heartbeat"
        unary = _refusal_of_unary(channel, "PrepareTool", prepare("c3"), ())
        assert unary.reason == "RATE_LIMITED"
        clock.advance(1000)  # the bucket refills
        conversation.send(message(4, prepare("c4")))
        assert refusal(conversation.receive()).reason == "QUOTA_EXCEEDED"
        for i in range(3):
            conversation.send(
                message(
                    20 + i,
                    pb.CommitToolRequest(
                        ref=ref("run", f"c{i}"), attempt=1, result=OK_RESULT
                    ),
                )
            )
            assert conversation.receive().WhichOneof("response") == "commit_tool"
        assert conversation.close() == []


# -- records -------------------------------------------------------------------


def requests_total(metrics: Metrics) -> dict[tuple[str, str], float]:
    counts: dict[tuple[str, str], float] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "effectd_rpc_requests_total":
                key = (sample.labels["method"], sample.labels["code"])
                counts[key] = sample.value
    return counts


def test_messages_are_recorded_under_their_unary_names(
    daemon: RunningDaemon, channel: grpc.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    """Each message counts once in effectd_rpc_requests_total and has one
    access-log line under its unary method, with its own trace context or
    the stream's; the stream counts once, as Session, when it ends."""
    caplog.set_level(logging.DEBUG, logger="effectd.access")
    before = requests_total(daemon.daemon.metrics)
    answers = exchange(
        channel,
        [
            message(1, prepare("c1"), traceparent=TRACE_B),
            message(2, pb.GetToolCallRequest(ref=ref("run", "missing"))),
        ],
        (("traceparent", TRACE_A),),
    )
    answers |= exchange(
        channel,
        [
            message(
                3,
                pb.CommitToolRequest(ref=ref("run", "c1"), attempt=1, result=OK_RESULT),
            )
        ],
    )
    assert refusal(answers[2]).code is R.NOT_FOUND
    after = requests_total(daemon.daemon.metrics)
    grew = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k)}
    assert grew == {
        ("effectd.v1.ToolLedger/PrepareTool", "OK"): 1,
        ("effectd.v1.ToolLedger/GetToolCall", "NOT_FOUND"): 1,
        ("effectd.v1.ToolLedger/CommitTool", "OK"): 1,
        ("effectd.v1.ToolLedger/Session", "OK"): 2,
    }
    lines = [
        (r.__dict__["method"], r.__dict__["code"], r.__dict__["trace_id"])
        for r in caplog.records
        if r.name == "effectd.access"
    ]
    of_a, of_b = TRACE_A.split("-")[1], TRACE_B.split("-")[1]
    # The first two were in flight together: either may end first.
    assert sorted(lines[:2]) == [
        ("/effectd.v1.ToolLedger/GetToolCall", "NOT_FOUND", of_a),
        ("/effectd.v1.ToolLedger/PrepareTool", "OK", of_b),
    ]
    assert lines[2:] == [
        ("/effectd.v1.ToolLedger/Session", "OK", of_a),
        ("/effectd.v1.ToolLedger/CommitTool", "OK", None),
        ("/effectd.v1.ToolLedger/Session", "OK", None),
    ]


def test_each_message_is_recorded_in_the_namespace_it_names(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stream resolves each namespace its messages name once: a token of
    namespaces a and b on one stream, its messages recorded each in its own
    (one naming a namespace outside its grants in none), whatever came
    before it on the stream."""
    caplog.set_level(logging.DEBUG, logger="effectd.access")
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        ab = (("authorization", f"Bearer {AGENT_AB}"),)
        named = ["a", "b", "a", "c", "b"]
        answers = exchange(
            channel,
            [
                message(i, pb.GetToolCallRequest(ref=ref("run", f"c{i}", ns)))
                for i, ns in enumerate(named, 1)
            ],
            ab,
        )
    assert {refusal(a).code for a in answers.values()} == {R.NOT_FOUND}
    recorded = Counter(
        r.__dict__["namespace"]
        for r in caplog.records
        if r.name == "effectd.access"
        and r.__dict__["method"] == "/effectd.v1.ToolLedger/GetToolCall"
    )
    assert recorded == Counter({"a": 2, "b": 2, None: 1})


# -- many in flight ------------------------------------------------------------


def test_a_slow_message_does_not_hold_a_fast_one(
    held_channel: grpc.Channel, holds: Holds
) -> None:
    """A prepare held in the service, then a read: the read is answered
    while the prepare is still held, the prepare when it is let go."""
    conversation = Conversation(held_channel)
    conversation.send(message(1, prepare("hold-1")))
    holds.wait_until(lambda h: h.now == 1)
    conversation.send(message(2, pb.GetToolCallRequest(ref=ref("run", "hold-1"))))
    first = conversation.receive()
    assert (first.id, refusal(first).code) == (2, R.NOT_FOUND)
    holds.release()
    second = conversation.receive()
    assert (second.id, second.prepare_tool.decision) == (1, pb.DECISION_EXECUTE)
    assert conversation.close() == []


def _fill(channel: grpc.Channel, holds: Holds, count: int, held: int) -> Holds:
    """Sends `count` held prepares on one stream; once `held` of them are
    held, releases them all and reads every answer."""
    conversation = Conversation(channel)
    conversation.send(*(message(i, prepare(f"hold-{i}")) for i in range(count)))
    holds.wait_until(lambda h: h.now >= held)
    holds.release()
    answers = [conversation.receive() for _ in range(count)]
    assert sorted(a.id for a in answers) == list(range(count))
    assert all(a.prepare_tool.decision == pb.DECISION_EXECUTE for a in answers)
    assert conversation.close() == []
    return holds


def test_at_most_session_max_in_flight_messages_are_served_at_once(
    held_channel: grpc.Channel, holds: Holds
) -> None:
    """Twelve held prepares on a stream whose bound is 4: the service never
    holds more than 4 at once (the daemon reads no further until one is
    answered), and all twelve are answered."""
    _fill(held_channel, holds, 12, 4)
    assert holds.most == 4
    assert holds.entered == 12


def test_negative_control_an_unbounded_stream_is_caught(
    held_channel: grpc.Channel, holds: Holds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the bound lifted, the same twelve prepares are all held at
    once, and the count above says so."""
    honest = session_module._Stream.__init__

    def unbounded(self: Any, *args: Any) -> None:
        honest(self, *args)
        self._room = asyncio.Semaphore(1 << 20)

    monkeypatch.setattr(session_module._Stream, "__init__", unbounded)
    _fill(held_channel, holds, 12, 12)
    assert holds.most > 4


# -- cancel, deadlines, ids ----------------------------------------------------


def test_a_cancelled_message_is_answered_cancelled_and_its_handler_cut(
    held_channel: grpc.Channel, holds: Holds
) -> None:
    """A cancel for a held prepare cuts its handler and answers it
    CANCELLED; a cancel for an id not in flight is not answered; the
    stream serves on."""
    conversation = Conversation(held_channel)
    conversation.send(message(1, prepare("hold-1")))
    holds.wait_until(lambda h: h.now == 1)
    conversation.send(pb.SessionRequest(id=1, cancel=pb.SessionCancel()))
    answer = conversation.receive()
    assert (answer.id, refusal(answer).code) == (1, R.CANCELLED)
    assert holds.cut == 1
    conversation.send(
        pb.SessionRequest(id=99, cancel=pb.SessionCancel()),
        message(2, prepare("c2")),
    )
    answer = conversation.receive()
    assert (answer.id, answer.prepare_tool.decision) == (2, pb.DECISION_EXECUTE)
    assert conversation.close() == []


def test_a_message_past_its_deadline_is_answered_deadline_exceeded(
    config: ServeConfig, holds: Holds
) -> None:
    """A held prepare with timeout_ms, and one with none on a daemon whose
    default deadline is short: each is cut and answered
    DEADLINE_EXCEEDED."""
    limits = dataclasses.replace(config.server_limits, default_deadline_seconds=0.2)
    cfg = dataclasses.replace(config, server_limits=limits)
    with (
        running_daemon(cfg, daemon=HeldDaemon(cfg, holds)) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        conversation = Conversation(channel)
        conversation.send(message(1, prepare("hold-1"), timeout_ms=50))
        first = conversation.receive()
        conversation.send(message(2, prepare("hold-2")))
        second = conversation.receive()
        assert conversation.close() == []
    assert (first.id, refusal(first).code) == (1, R.DEADLINE_EXCEEDED)
    assert (second.id, refusal(second).code) == (2, R.DEADLINE_EXCEEDED)
    assert holds.cut == 2


def test_an_id_in_flight_and_an_empty_request_are_refused_under_their_id(
    held: RunningDaemon, held_channel: grpc.Channel, holds: Holds
) -> None:
    """A second message with the id of one in flight is refused
    INVALID_ARGUMENT (field `id`), and recorded under its RPC, and the
    first is unaffected; a message without a request is refused (field
    `request`)."""
    before = requests_total(held.daemon.metrics)
    conversation = Conversation(held_channel)
    conversation.send(message(5, prepare("hold-5")))
    holds.wait_until(lambda h: h.now == 1)
    conversation.send(message(5, pb.GetToolCallRequest(ref=ref("run", "x"))))
    duplicate = conversation.receive()
    assert duplicate.id == 5
    assert (refusal(duplicate).reason, refusal(duplicate).fields) == (
        "INVALID_REQUEST",
        ("id",),
    )
    conversation.send(pb.SessionRequest(id=6))
    empty = conversation.receive()
    assert (empty.id, refusal(empty).fields) == (6, ("request",))
    holds.release()
    first = conversation.receive()
    assert (first.id, first.prepare_tool.decision) == (5, pb.DECISION_EXECUTE)
    assert conversation.close() == []
    key = ("effectd.v1.ToolLedger/GetToolCall", "INVALID_ARGUMENT")
    assert requests_total(held.daemon.metrics)[key] == before.get(key, 0) + 1


def test_a_message_that_does_not_parse_ends_the_stream_after_those_in_flight(
    held_channel: grpc.Channel, holds: Holds
) -> None:
    """Bytes that are no SessionRequest, behind a held prepare: the prepare
    is answered, then the stream ends INVALID_ARGUMENT."""
    conversation = Conversation(held_channel)
    conversation.send(message(1, prepare("hold-1")))
    holds.wait_until(lambda h: h.now == 1)
    conversation.send(b"\xff\xff\xff")
    holds.release()
    answer = conversation.receive()
    assert (answer.id, answer.prepare_tool.decision) == (1, pb.DECISION_EXECUTE)
    with pytest.raises(grpc.RpcError) as info:
        conversation.receive()
    got = decode(info.value)
    assert (got.code, got.reason) == (R.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert_serving(held_channel)


# -- a stream that breaks, a daemon that stops -------------------------------------


def _settled(running: RunningDaemon) -> tuple[int, int, int, list[str]]:
    """Slots taken in each pool, and the tasks of session streams on the
    daemon's loop."""
    services = running.daemon.services
    assert services is not None
    slots = services.slots

    def of_sessions() -> list[str]:
        names = (t.get_coro().__qualname__ for t in asyncio.all_tasks())  # type: ignore[union-attr]
        return sorted(n for n in names if n.startswith(("_Stream.", "Draining.")))

    return on_loop(
        running,
        lambda: (
            slots.in_flight(Pool.ORDINARY),
            slots.in_flight(Pool.RECORDING),
            slots.in_flight(Pool.SESSION),
            of_sessions(),
        ),
    )


def _eventually(check: Any, want: Any, attempts: int = 300) -> Any:
    """`check()` until it answers `want` (bounded), its last answer."""
    got = check()
    for _ in range(attempts):
        if got == want:
            return got
        threading.Event().wait(0.05)
        got = check()
    return got


def test_a_client_that_goes_leaves_nothing_behind(
    held: RunningDaemon, held_channel: grpc.Channel, holds: Holds
) -> None:
    """A client cancels its stream with two prepares held and a commit
    answered: the held handlers are cut, every slot and task is given back,
    the commit stays, and the daemon serves on."""
    conversation = Conversation(held_channel)
    conversation.send(message(1, prepare("done")))
    assert conversation.receive().prepare_tool.decision == pb.DECISION_EXECUTE
    commit = pb.CommitToolRequest(ref=ref("run", "done"), attempt=1, result=OK_RESULT)
    conversation.send(message(2, commit))
    assert conversation.receive().WhichOneof("response") == "commit_tool"
    conversation.send(message(3, prepare("hold-3")), message(4, prepare("hold-4")))
    holds.wait_until(lambda h: h.now == 2)
    # A control: the probe sees the stream's tasks and the held slots.
    ordinary, _, streams, tasks = _settled(held)
    assert (ordinary, streams) == (2, 1)
    assert tasks == [
        "Draining.wait",
        "_Stream._read",
        "_Stream._serve",
        "_Stream._serve",
        "_Stream._write",
    ]
    conversation.cancel()
    holds.wait_until(lambda h: h.cut == 2)
    assert _eventually(lambda: _settled(held), (0, 0, 0, [])) == (0, 0, 0, [])
    assert_serving(held_channel)
    stub = pb_grpc.ToolLedgerStub(held_channel)
    call = stub.GetToolCall(pb.GetToolCallRequest(ref=ref("run", "done")), timeout=30)
    assert call.call.state == pb.CALL_STATE_COMMITTED


def test_a_stopping_daemon_answers_what_it_has_then_ends_the_stream(
    held: RunningDaemon, held_channel: grpc.Channel, holds: Holds
) -> None:
    """The daemon begins to stop with a prepare held: a message read after
    that is refused UNAVAILABLE/SHUTTING_DOWN, the held one is answered
    once let go, and the stream then ends UNAVAILABLE/SHUTTING_DOWN."""
    services = held.daemon.services
    assert services is not None
    conversation = Conversation(held_channel)
    conversation.send(message(1, prepare("hold-1")))
    holds.wait_until(lambda h: h.now == 1)
    stopped = asyncio.run_coroutine_threadsafe(held.daemon.stop(), held.loop)
    assert _eventually(lambda: services.draining.begun, True)
    conversation.send(message(2, prepare("c2")))
    late = conversation.receive()
    assert (late.id, refusal(late).code, refusal(late).reason) == (
        2,
        R.UNAVAILABLE,
        "SHUTTING_DOWN",
    )
    holds.release()
    first = conversation.receive()
    assert (first.id, first.prepare_tool.decision) == (1, pb.DECISION_EXECUTE)
    with pytest.raises(grpc.RpcError) as info:
        conversation.receive()
    got = decode(info.value)
    assert (got.code, got.reason) == (R.UNAVAILABLE, "SHUTTING_DOWN")
    stopped.result(timeout=30)


def test_a_caller_has_at_most_its_share_of_streams(
    config: ServeConfig, clock: ManualClock
) -> None:
    """With two calls in flight per caller, a caller's third open stream is
    refused CONCURRENCY_LIMITED (idle streams cannot fill the server); once
    one ends, a new one is served."""
    limits = dataclasses.replace(config.server_limits, max_concurrent_rpcs_per_caller=2)
    cfg = dataclasses.replace(config, server_limits=limits)
    get = pb.GetToolCallRequest(ref=ref("run", "missing"))
    with (
        running_daemon(cfg, clock) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        first, second = Conversation(channel), Conversation(channel)
        for conversation in (first, second):
            conversation.send(message(1, get))
            assert refusal(conversation.receive()).code is R.NOT_FOUND
        with pytest.raises(grpc.RpcError) as info:
            exchange(channel, [message(1, get)])
        assert decode(info.value).reason == "CONCURRENCY_LIMITED"
        assert first.close() == []
        assert _eventually(lambda: _settled(running)[2], 1) == 1
        assert refusal(exchange(channel, [message(1, get)])[1]).code is R.NOT_FOUND
        assert second.close() == []


def test_a_failure_in_the_stream_ends_it_internal_and_the_daemon_serves_on(
    channel: grpc.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the stream's own code (here: taking a message) ends that
    stream INTERNAL without details, like a unary handler's failure; the
    daemon serves on."""

    def broken(self: Any, request: Any) -> None:
        raise ValueError("a bug")

    monkeypatch.setattr(session_module._Stream, "_take", broken)
    with pytest.raises(grpc.RpcError) as info:
        exchange(channel, [message(1, prepare("c1"))])
    assert decode(info.value).code is R.INTERNAL
    monkeypatch.undo()
    assert_serving(channel)
