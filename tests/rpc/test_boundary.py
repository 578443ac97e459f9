"""The request boundary: every call passes its steps in one order (the gate
authenticates, then enter, admit, deadline, handler, domain error to status,
record), so a call that several steps would refuse gets the answer of the
first, and each call is recorded once however it ended. The caller is
resolved once per call, and the translation layer reads requests against the
caller it is handed, never the call's context.

The order is pinned on a bare server behind the gate, with a rate limit that
refuses one namespace, a short default deadline and servicers that do what
the request asks (hang, refuse, crash, answer); the single resolution on a
real daemon with tokens.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path
from typing import Any

import grpc
import pytest
from effectd.v1 import admin_pb2, checkpoints_pb2, provider_pb2
from effectd.v1 import checkpoints_pb2 as cpb
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import provider_pb2 as ppb

from sidecar.auth.access import Credential, Credentials, Principal, Role
from sidecar.errors import NotFound, RateLimited
from sidecar.ledger import quota
from sidecar.ledger.validation import Limits, Violations
from sidecar.rpc import boundary, caller, convert, operator_orders
from sidecar.rpc.concurrency import Slots
from sidecar.rpc.gate import Gate
from sidecar.rpc.handlers import generic_handler
from sidecar.rpc.session import SESSION, Draining, LedgerSession
from tests.auth.support import AGENT_AB, OPERATOR_ALL, authenticated_daemon, stubs
from tests.rpc.support import decode, decode_status, prepare_request, ref

Context = grpc.aio.ServicerContext[Any, Any]

GET = "/effectd.v1.Checkpoints/Get"
GET_TOOL_CALL = "/effectd.v1.ToolLedger/GetToolCall"
STREAM = "/effectd.v1.Provider/ProviderStream"
# The default deadline of a call that brings none; only the "hang" handler
# waits for it.
DEADLINE = 0.5
LIMITED, OPEN = "limited", "open"
SECRETS = {LIMITED: "limited-secret-0123456789", OPEN: "open-secret-0123456789"}
# Each token acts in the namespace of its name, and is charged to it.
CREDENTIALS = Credentials(
    Credential(
        sha256(secret.encode()).digest(),
        Principal(name, frozenset({Role.AGENT}), frozenset({name})),
    )
    for name, secret in SECRETS.items()
)


class Scripted:
    """Checkpoints and Provider servicers that do what the request says: the
    checkpoint key or the provider route names the act."""

    def __init__(self) -> None:
        self.entered: list[str] = []

    async def Get(
        self, req: cpb.GetCheckpointRequest, _: Context
    ) -> cpb.GetCheckpointResponse:
        self.entered.append(req.key)
        if req.key == "hang":
            await asyncio.Event().wait()
        elif req.key == "refuse":
            raise NotFound("no such checkpoint")
        elif req.key == "crash":
            raise ValueError("a bug")
        return cpb.GetCheckpointResponse()

    Put = Delete = Txn = List = ProviderCall = Get

    async def GetToolCall(
        self, req: pb.GetToolCallRequest, context: Context
    ) -> pb.GetToolCallResponse:
        """The ledger read, scripted by its call id (served as a session
        message)."""
        await self.Get(cpb.GetCheckpointRequest(key=req.ref.call_id), context)
        return pb.GetToolCallResponse()

    PrepareTool = PrepareTools = StartTool = CommitTool = GetToolCall
    ReportUnknown = Heartbeat = DecideApproval = Reconcile = GetToolCall
    ListToolCalls = GetToolCall

    async def ProviderStream(
        self, req: ppb.ProviderRequest, _: Context
    ) -> AsyncIterator[ppb.ProviderStreamMessage]:
        self.entered.append(req.route)
        yield ppb.ProviderStreamMessage()
        if req.route == "refuse":
            raise NotFound("no such route")
        if req.route == "crash":
            raise ValueError("a bug")


class Limit:
    """A rate limit that refuses the namespace `limited`, and remembers
    whom each call was charged to."""

    def __init__(self) -> None:
        self.charged: list[quota.Caller] = []

    def admit(self, charged: quota.Caller) -> None:
        self.charged.append(charged)
        if charged.namespace == LIMITED:
            raise RateLimited("over the rate", {"namespace": LIMITED})


class Observer:
    def __init__(self) -> None:
        self.finished: list[tuple[str, grpc.StatusCode]] = []
        self.refusals: list[str] = []

    def rpc_finished(self, method: str, code: grpc.StatusCode, _: float) -> None:
        self.finished.append((method, code))

    def refused(self, reason: str) -> None:
        self.refusals.append(reason)


@contextmanager
def gated(target: str, gate: Gate, servicer: Scripted) -> Iterator[None]:
    """A gRPC server behind `gate`, on an event loop of its own in a thread;
    stopped at the end, once every call has ended and been recorded."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=30)

    async def start() -> grpc.aio.Server:
        server = grpc.aio.server(interceptors=[gate])
        server.add_generic_rpc_handlers(
            (
                generic_handler(
                    checkpoints_pb2.DESCRIPTOR.services_by_name["Checkpoints"],
                    servicer,
                ),
                generic_handler(
                    provider_pb2.DESCRIPTOR.services_by_name["Provider"], servicer
                ),
                generic_handler(
                    pb.DESCRIPTOR.services_by_name["ToolLedger"],
                    servicer,
                    LedgerSession(servicer, max_in_flight=8, draining=Draining()),
                ),
            )
        )
        server.add_insecure_port(target)
        await server.start()
        return server

    server = run(start())
    try:
        yield
    finally:
        run(server.stop(5))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


@dataclass(frozen=True, slots=True)
class Case:
    token: str | None
    method: str
    request: bytes
    code: grpc.StatusCode
    reason: str | None
    # The act the handler was asked for, when the call reached it.
    handled: str | None
    # Whether the call was charged to the rate limit.
    charged: bool = True


def get(namespace: str, act: str) -> bytes:
    return cpb.GetCheckpointRequest(namespace=namespace, key=act).SerializeToString()


def stream(act: str) -> bytes:
    return ppb.ProviderRequest(route=act, path="/v1/x").SerializeToString()


GARBAGE = b"\xff\xff\xff"
R = grpc.StatusCode

CASES = [
    # Authentication comes first: the hanging, rate-limited call is refused
    # before it is parsed, charged or run.
    pytest.param(
        Case(
            None,
            GET,
            get(LIMITED, "hang"),
            R.UNAUTHENTICATED,
            "UNAUTHENTICATED",
            None,
            charged=False,
        ),
        id="unauthenticated-before-admission",
    ),
    # Admission before the deadline and the handler: a call that would
    # outlive its deadline but is over its rate is refused at once.
    pytest.param(
        Case(
            LIMITED,
            GET,
            get(LIMITED, "hang"),
            R.RESOURCE_EXHAUSTED,
            "RATE_LIMITED",
            None,
        ),
        id="rate-limited-before-deadline",
    ),
    # Admission before the parse check: bad bytes cost a token too.
    pytest.param(
        Case(LIMITED, GET, GARBAGE, R.RESOURCE_EXHAUSTED, "RATE_LIMITED", None),
        id="rate-limited-before-parse",
    ),
    pytest.param(
        Case(OPEN, GET, GARBAGE, R.INVALID_ARGUMENT, "INVALID_REQUEST", None),
        id="unparsed-refused-before-the-handler",
    ),
    pytest.param(
        Case(OPEN, GET, get(OPEN, "hang"), R.DEADLINE_EXCEEDED, None, "hang"),
        id="deadline-cuts-the-handler",
    ),
    pytest.param(
        Case(OPEN, GET, get(OPEN, "refuse"), R.NOT_FOUND, "NOT_FOUND", "refuse"),
        id="domain-error-to-status",
    ),
    pytest.param(
        Case(OPEN, GET, get(OPEN, "crash"), R.INTERNAL, None, "crash"),
        id="failure-to-internal",
    ),
    pytest.param(
        Case(OPEN, GET, get(OPEN, "answer"), R.OK, None, "answer"), id="answered"
    ),
    pytest.param(
        Case(
            LIMITED,
            STREAM,
            stream("answer"),
            R.RESOURCE_EXHAUSTED,
            "RATE_LIMITED",
            None,
        ),
        id="stream-rate-limited",
    ),
    pytest.param(
        Case(OPEN, STREAM, stream("refuse"), R.NOT_FOUND, "NOT_FOUND", "refuse"),
        id="stream-domain-error-midway",
    ),
    pytest.param(
        Case(OPEN, STREAM, stream("crash"), R.INTERNAL, None, "crash"),
        id="stream-failure-midway",
    ),
    pytest.param(
        Case(OPEN, STREAM, stream("answer"), R.OK, None, "answer"), id="stream-answered"
    ),
]


def send(
    channel: grpc.Channel, case: Case, *, session: bool = False
) -> tuple[grpc.StatusCode, str | None]:
    """Sends the case's request without a deadline; its code and reason."""
    metadata: tuple[tuple[str, str | bytes], ...] = (
        (("authorization", f"Bearer {SECRETS[case.token]}"),) if case.token else ()
    )
    try:
        if session:
            return _send_in_session(channel, case, metadata)
        if case.method == STREAM:
            list(
                channel.unary_stream(case.method, None, None)(
                    case.request, metadata=metadata
                )
            )
        else:
            channel.unary_unary(case.method, None, None)(
                case.request, metadata=metadata
            )
    except grpc.RpcError as exc:
        refusal = decode(exc)
        return refusal.code, refusal.reason
    return grpc.StatusCode.OK, None


def _send_in_session(
    channel: grpc.Channel, case: Case, metadata: tuple[tuple[str, str | bytes], ...]
) -> tuple[grpc.StatusCode, str | None]:
    """Sends the case's Get as the GetToolCall message of a session (its
    namespace and act in the call's ref); garbage stays garbage. The code
    and reason of the message's answer, or of the stream's end."""
    data = case.request
    if data != GARBAGE:
        get = cpb.GetCheckpointRequest.FromString(data)
        data = pb.SessionRequest(
            id=1,
            get_tool_call=pb.GetToolCallRequest(
                ref=pb.CallRef(namespace=get.namespace, run_id="run", call_id=get.key)
            ),
        ).SerializeToString()
    stream = channel.stream_stream(SESSION, None, pb.SessionResponse.FromString)
    [answer] = list(stream(iter([data]), metadata=metadata))
    if answer.WhichOneof("response") != "error":
        return grpc.StatusCode.OK, None
    refusal = decode_status(answer.error)
    return refusal.code, refusal.reason


@dataclass(frozen=True, slots=True)
class Served:
    """What became of one call: its answer, whether it reached the handler
    and was charged, and its records."""

    answer: tuple[grpc.StatusCode, str | None]
    entered: list[str]
    charged: int
    finished: list[tuple[str, grpc.StatusCode]]
    refusals: list[str]
    log_lines: list[str]


def serve(
    short_tmp: Path,
    caplog: pytest.LogCaptureFixture,
    case: Case,
    *,
    session: bool = False,
) -> Served:
    """Sends the case to a fresh gated server and stops it."""
    caplog.set_level(logging.DEBUG, logger="effectd.access")
    servicer, limit, observer = Scripted(), Limit(), Observer()
    gate = Gate(
        CREDENTIALS,
        admission=limit,
        observer=observer,
        default_deadline=DEADLINE,
        slots=Slots(8, 8),
    )
    target = f"unix:{short_tmp / 's.sock'}"
    with gated(target, gate, servicer), grpc.insecure_channel(target) as channel:
        answer = send(channel, case, session=session)
    method = GET_TOOL_CALL if session else case.method
    lines = [
        r.__dict__["code"]
        for r in caplog.records
        if r.name == "effectd.access" and r.__dict__.get("method") == method
    ]
    return Served(
        answer,
        servicer.entered,
        len(limit.charged),
        observer.finished,
        observer.refusals,
        lines,
    )


@pytest.mark.parametrize("case", CASES)
def test_a_call_gets_the_answer_of_the_first_step_that_refuses_it(
    short_tmp: Path, caplog: pytest.LogCaptureFixture, case: Case
) -> None:
    """Each call is answered by the first step that refuses it (the table's
    comments give the order), reaches its handler only if none did, and is
    recorded once: one count, one refusal reason, one access-log line."""
    served = serve(short_tmp, caplog, case)
    assert served.answer == (case.code, case.reason)
    assert served.entered == ([case.handled] if case.handled else [])
    assert served.charged == (1 if case.charged else 0)
    assert served.finished == [(case.method, case.code)]
    assert served.refusals == ([case.reason] if case.reason else [])
    assert served.log_lines == [case.code.name]


def test_negative_control_a_handler_run_before_admission_is_caught(
    short_tmp: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With admission moved after the handler (here: skipped), the hanging
    call over its rate reaches its handler and answers DEADLINE_EXCEEDED,
    which the table above refuses."""
    monkeypatch.setattr(boundary, "admit", lambda *_: None)
    [row] = [p.values[0] for p in CASES if p.id == "rate-limited-before-deadline"]
    assert isinstance(row, Case)
    served = serve(short_tmp, caplog, row)
    assert served.answer == (grpc.StatusCode.DEADLINE_EXCEEDED, None)
    assert served.entered == ["hang"]


UNARY_CASES = [
    p for p in CASES if isinstance(p.values[0], Case) and p.values[0].method == GET
]


@pytest.mark.parametrize("row", UNARY_CASES)
def test_a_session_message_passes_the_same_steps_in_the_same_order(
    short_tmp: Path, caplog: pytest.LogCaptureFixture, row: Case
) -> None:
    """The unary rows of the table, each sent as a GetToolCall message of a
    session stream: the same answer from the same step, the same handler
    reached, the same charge, and one record under GetToolCall beside the
    stream's own as Session. Two rows differ, as the protos say: bytes that
    do not parse cannot be known as any RPC's, so they end the stream
    INVALID_ARGUMENT uncharged, and a refused credential refuses the whole
    stream; either way only the stream is recorded."""
    served = serve(short_tmp, caplog, row, session=True)
    whole_stream = row.request == GARBAGE or row.token is None
    if whole_stream:
        code = row.code if row.token is None else grpc.StatusCode.INVALID_ARGUMENT
        reason = row.reason if row.token is None else "INVALID_REQUEST"
        assert served.answer == (code, reason)
        assert served.entered == []
        assert served.charged == 0
        assert served.finished == [(SESSION, code)]
        assert served.refusals == [reason]
        assert served.log_lines == []
        return
    assert served.answer == (row.code, row.reason)
    assert served.entered == ([row.handled] if row.handled else [])
    assert served.charged == (1 if row.charged else 0)
    assert served.finished == [(GET_TOOL_CALL, row.code), (SESSION, grpc.StatusCode.OK)]
    assert served.refusals == ([row.reason] if row.reason else [])
    assert served.log_lines == [row.code.name]


def test_negative_control_a_message_run_before_admission_is_caught(
    short_tmp: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With admission skipped, the hanging message over its rate reaches
    its handler and is answered DEADLINE_EXCEEDED, which the session's rows
    refuse."""
    monkeypatch.setattr(boundary, "admit", lambda *_: None)
    [row] = [p.values[0] for p in CASES if p.id == "rate-limited-before-deadline"]
    assert isinstance(row, Case)
    served = serve(short_tmp, caplog, row, session=True)
    assert served.answer == (grpc.StatusCode.DEADLINE_EXCEEDED, None)
    assert served.entered == ["hang"]


# -- the caller, resolved once ---------------------------------------------------


def test_the_caller_is_resolved_once_per_call(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch naming two namespaces, a listing of every namespace, an
    operator's stats and a checkpoint write: one resolution per call, by the
    boundary, however many namespaces or caller questions the call has."""
    resolved: list[str] = []
    honest = caller.resolve

    def counting(principal: Principal | None, request: object) -> caller.Caller:
        resolved.append(principal.name if principal else "")
        return honest(principal, request)

    monkeypatch.setattr(caller, "resolve", counting)
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        resolved.clear()  # the readiness probes
        ab, everyone = stubs(channel, AGENT_AB), stubs(channel, OPERATOR_ALL)
        batch = [
            prepare_request("run", f"c{i}", namespace=n) for i, n in enumerate("aba")
        ]
        ab.ledger.PrepareTools(
            pb.PrepareToolsRequest(calls=batch), metadata=ab.metadata
        )
        listed = ab.ledger.ListToolCalls(
            pb.ListToolCallsRequest(all_namespaces=True), metadata=ab.metadata
        )
        everyone.admin.GetStats(admin_pb2.GetStatsRequest(), metadata=everyone.metadata)
        ab.checkpoints.Put(
            cpb.PutCheckpointRequest(namespace="b", key="k", expect_absent=True),
            metadata=ab.metadata,
        )
    assert sorted(c.ref.namespace for c in listed.calls) == ["a", "a", "b"]
    assert resolved == ["agent-ab", "agent-ab", "operator-all", "agent-ab"]


AGENT_OF_A = Principal("agent-a", frozenset({Role.AGENT}), frozenset({"a"}))


def test_translation_reads_requests_against_the_caller_it_is_handed() -> None:
    """Outside any call (no caller in the context), `convert` and
    `operator_orders` place namespaces and name actors by the `Caller`
    given to them: the credential decides, and nothing is looked up."""
    with pytest.raises(LookupError):
        caller.current()
    limits = Limits()
    of_a = caller.resolve(AGENT_OF_A, pb.GetToolCallRequest())
    anyone = caller.resolve(None, pb.GetToolCallRequest())
    assert convert.ref(Violations(), of_a, ref("r", "c"), limits).namespace == "a"
    assert (
        convert.ref(Violations(), anyone, ref("r", "c", "b"), limits).namespace == "b"
    )
    with pytest.raises(NotFound):
        convert.ref(Violations(), of_a, ref("r", "c", "b"), limits)
    v = Violations()
    named = operator_orders.operator_action(v, of_a, limits, "mallory", "why")
    assert (named, [i.field for i in v.items]) == ("agent-a", ["operator"])
    assert (
        operator_orders.operator_action(Violations(), anyone, limits, "ops", "why")
        == "ops"
    )


@pytest.mark.parametrize("module", [convert, operator_orders])
def test_translation_never_reaches_for_the_call_context(module: Any) -> None:
    """The translation modules import no call state: of the request
    boundary's modules only the `Caller` type, and read no context variable."""
    tree = ast.parse(Path(module.__file__).read_text())
    imported = {
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    reached = {
        name
        for source, name in imported
        if source and source.startswith(("sidecar.rpc", "sidecar.callstate"))
    }
    assert reached <= {"Caller", "result"}, reached
    attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not attributes & {"current", "CURRENT"}


def test_resolution_places_the_request_in_the_grants() -> None:
    """The resolved caller: a token bound to one namespace acts and is
    charged there whatever the request names; without a token the request's
    valid namespace decides, and invalid ones share one bucket."""
    named_b = pb.GetToolCallRequest(ref=ref("r", "c", "b"))
    rows: list[tuple[Principal | None, Any, str, quota.Caller]] = [
        (AGENT_OF_A, pb.GetToolCallRequest(), "a", quota.Caller(namespace="a")),
        (AGENT_OF_A, named_b, "", quota.Caller(namespace="a")),
        (None, named_b, "b", quota.Caller(namespace="b")),
        (None, pb.GetToolCallRequest(ref=ref("r", "c", "b/x")), "", quota.Caller()),
        (None, b"not parsed", "default", quota.Caller(namespace="default")),
    ]
    for principal, request, acting, charged in rows:
        who = caller.resolve(principal, request)
        assert (who.namespace, who.charged) == (acting, charged), request
