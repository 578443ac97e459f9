"""Every field of every RPC, with bad values generated from the descriptors
(tests/rpc/wire.py), through a real daemon: the answer is never UNKNOWN or
INTERNAL, and nothing changes in the store.

The RPCs are found from the descriptors of every `effectd.v1` service and of
gRPC health, so a new RPC or field is covered without editing this file.
Each request is sent three ways: from an empty base, from one with a
plausible value in every field, and, where this file knows one, from a
request that would succeed (and change the store) if its one bad field were
accepted: those bases name records seeded before the test.

The session stream is sent its own fields' bad values like any RPC, and
every kind of request it carries the bad values of that request's fields
(`Session:<kind>`), from the same three bases: each message is answered a
refusal (or the stream ends INVALID_ARGUMENT when it does not parse), never
UNKNOWN or INTERNAL, and nothing is written.

Randomized: which values of each kind are sent is drawn from a seed,
printed (`EFFECTD_BAD_INPUT_SEED` replays one). The default is fast; set
`EFFECTD_BAD_INPUT=deep` for every value of every kind, larger oversized
values (up to past the transport's limit) and longer repeated fields.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import random
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import effectd.v1
import grpc
import pytest
from effectd.v1 import checkpoints_pb2 as cpb
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import provider_pb2 as ppb
from effectd.v1 import recovery_pb2 as rcpb
from effectd.v1 import retry_pb2 as rpb
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig, ServerLimits
from sidecar.provider import prepare
from sidecar.rpc import convert
from sidecar.seams import Seams
from sidecar.server import Daemon
from sidecar.storage.api import Store, Table
from sidecar.testing import RunningDaemon, running_daemon
from tests.provider.support import FakeSleep
from tests.provider.upstream import Reply, serving
from tests.rpc import wire
from tests.rpc.support import (
    DOMAIN,
    Refusal,
    assert_serving,
    decode,
    decode_status,
    prepare_request,
    ref,
)

DEEP = os.environ.get("EFFECTD_BAD_INPUT", "") == "deep"
SEED = int(
    os.environ.get("EFFECTD_BAD_INPUT_SEED") or random.SystemRandom().randrange(1 << 32)
)
# Oversized: past every size limit of a request field (1 MiB payloads), and
# deep also past the transport's 8 MiB message limit.
DEPTH = (
    wire.Depth(((1 << 20) + 1, 4 << 20, 9 << 20), (10_001, 300_000), 0)
    if DEEP
    else wire.Depth(((1 << 20) + 1,), (10_001,), 2)
)
NEVER = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
MAX_MESSAGE = ServerLimits().max_message_bytes
NS, RUN = "seeded", "run"


def _methods() -> list[Any]:
    modules = [
        importlib.import_module(f"effectd.v1.{m.name}")
        for m in pkgutil.iter_modules(effectd.v1.__path__)
        if m.name.endswith("_pb2")
    ]
    files = [m.DESCRIPTOR for m in modules] + [health_pb2.DESCRIPTOR]
    return [
        method
        for file in files
        for service in file.services_by_name.values()
        for method in service.methods
    ]


METHODS = {f"/{m.containing_service.full_name}/{m.name}": m for m in _methods()}
SESSION = "/effectd.v1.ToolLedger/Session"
# The RPCs whose requests become HTTP requests: their fields are also sent
# text that no header or URL carries (`wire.NOT_HTTP`).
PROVIDER = "/effectd.v1.Provider/"
# The requests a session message carries, by field of SessionRequest, with
# the unary RPC of each.
KINDS = {
    f.name: (f, f"/effectd.v1.ToolLedger/{m.name}")
    for f in pb.SessionRequest.DESCRIPTOR.oneofs_by_name["request"].fields
    for m in pb.DESCRIPTOR.services_by_name["ToolLedger"].methods
    if f.message_type is m.input_type
}


class SeededDaemon(Daemon):
    """Keeps the store it opens, so the test can read it whole."""

    store: Store

    def open_store(self) -> Store:
        self.store = super().open_store()
        return self.store


def snapshot(store: Store) -> tuple[tuple[str, tuple[tuple[bytes, bytes], ...]], ...]:
    """Every entry of every table."""
    return store.read(
        lambda view: tuple(
            (table.value, tuple(view.scan(table, b""))) for table in Table
        )
    )


@dataclass(frozen=True, slots=True)
class Seeded:
    running: RunningDaemon
    channel: grpc.Channel
    store: Store
    # Valid requests that would change the store, by full method name.
    bases: dict[str, Message]


def _seed(channel: grpc.Channel) -> dict[str, Message]:
    """Records in every state, a checkpoint, and the requests that would
    move each on."""
    ledger = channel.unary_unary(
        "/effectd.v1.ToolLedger/PrepareTool",
        request_serializer=pb.PrepareToolRequest.SerializeToString,
        response_deserializer=pb.PrepareToolResponse.FromString,
    )
    call = _unary(channel)

    def prepared(call_id: str, **kw: Any) -> pb.ToolCall:
        request = prepare_request(RUN, call_id, namespace=NS, **kw)
        answer: pb.PrepareToolResponse = ledger(request, timeout=10)
        return answer.call

    def at(call_id: str) -> pb.CallRef:
        return ref(RUN, call_id, NS)

    result = pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json="{}"))
    prepared("prepared")
    prepared("started", start=True, lease_ms=3_600_000)
    prepared("unknown", start=True)
    call(
        "ToolLedger/ReportUnknown",
        pb.ReportUnknownRequest(ref=at("unknown"), attempt=1),
    )
    awaiting = prepared("awaiting", require_approval=True)
    prepared("committed", start=True)
    call(
        "ToolLedger/CommitTool",
        pb.CommitToolRequest(ref=at("committed"), attempt=1, result=result),
    )
    put = cpb.PutCheckpointResponse.FromString(
        call(
            "Checkpoints/Put",
            cpb.PutCheckpointRequest(
                namespace=NS, key="k", value=b"v", expect_absent=True
            ),
        )
    )
    revision = put.revision
    started_rev = pb.GetToolCallResponse.FromString(
        call("ToolLedger/GetToolCall", pb.GetToolCallRequest(ref=at("unknown")))
    ).call.revision
    return {
        "/effectd.v1.ToolLedger/PrepareTool": prepare_request(
            RUN, "new", namespace=NS, start=True
        ),
        "/effectd.v1.ToolLedger/PrepareTools": pb.PrepareToolsRequest(
            calls=[prepare_request(RUN, "new", namespace=NS)]
        ),
        "/effectd.v1.ToolLedger/StartTool": pb.StartToolRequest(ref=at("prepared")),
        "/effectd.v1.ToolLedger/CommitTool": pb.CommitToolRequest(
            ref=at("started"), attempt=1, result=result
        ),
        "/effectd.v1.ToolLedger/Heartbeat": pb.HeartbeatRequest(
            ref=at("started"), attempt=1, lease_ms=60_000
        ),
        "/effectd.v1.ToolLedger/ReportUnknown": pb.ReportUnknownRequest(
            ref=at("started"), attempt=1, reason="lost"
        ),
        "/effectd.v1.ToolLedger/DecideApproval": pb.DecideApprovalRequest(
            ref=at("awaiting"),
            approve=True,
            approver="ann",
            expected_revision=awaiting.revision,
            input_fingerprint=awaiting.input_fingerprint,
        ),
        "/effectd.v1.ToolLedger/Reconcile": pb.ReconcileRequest(
            ref=at("unknown"),
            expected_revision=started_rev,
            not_executed=True,
            operator="ops",
            reason="checked",
            evidence="no trace in the target",
        ),
        "/effectd.v1.Recovery/AcknowledgeRecovery": rcpb.AcknowledgeRecoveryRequest(
            namespace=NS, run_id=RUN, call_ids=["committed"]
        ),
        "/effectd.v1.Checkpoints/Put": cpb.PutCheckpointRequest(
            namespace=NS, key="k", value=b"w", expected_revision=revision
        ),
        "/effectd.v1.Checkpoints/Delete": cpb.DeleteCheckpointRequest(
            namespace=NS, key="k", expected_revision=revision
        ),
        "/effectd.v1.Checkpoints/Txn": cpb.CheckpointTxnRequest(
            namespace=NS,
            compares=[cpb.Compare(key="k", revision=revision)],
            ops=[cpb.TxnOp(put=cpb.TxnPut(key="k", value=b"w"))],
        ),
        # Reaches the upstream: every header and the route's Idempotency-Key
        # are sent, so a value HTTP cannot carry meets the HTTP client.
        f"{PROVIDER}ProviderCall": PROVIDER_REQUEST,
        f"{PROVIDER}ProviderStream": PROVIDER_REQUEST,
        "/effectd.v1.RetryPolicy/DecideRetry": rpb.DecideRetryRequest(
            facts=rpb.RetryFacts(effect=pb.EFFECT_READ, state=pb.CALL_STATE_UNKNOWN),
            context=rpb.RETRY_CONTEXT_TOOL,
            error=rpb.AttemptError(kind=rpb.FAILURE_KIND_TIMEOUT),
            attempts_used=1,
        ),
    }


PROVIDER_REQUEST = ppb.ProviderRequest(
    route="up",
    path="/v1/chat",
    headers=[ppb.Header(name="x-agent", value="1")],
    body=b"{}",
    idempotency_key="run:call",
)


def _providers(tmp: Path, base_url: str) -> Path:
    """A providers file whose route `up` sends to `base_url` with the
    request's Idempotency-Key."""
    (tmp / "key").write_text("sk-test")
    providers = tmp / "providers.toml"
    providers.write_text(
        f'[routes.up]\nbase_url = "{base_url}"\ncredential_file = "{tmp / "key"}"\n'
        'idempotency_key = true\npaths = ["/v1/"]\n'
    )
    return providers


def _unary(channel: grpc.Channel) -> Callable[[str, Message], bytes]:
    def call(method: str, request: Message) -> bytes:
        stub = channel.unary_unary(
            f"/effectd.v1.{method}", request_serializer=None, response_deserializer=None
        )
        answer: bytes = stub(request.SerializeToString(), timeout=10)
        return answer

    return call


@pytest.fixture(scope="module")
def seeded() -> Iterator[Seeded]:
    """One daemon for every RPC: it must survive all of them in turn."""
    with (
        tempfile.TemporaryDirectory(prefix="effectd-", dir="/tmp") as tmp,
        serving(Reply(200, events=[b"data: {}\n\n"])) as upstream,
    ):
        config = ServeConfig(
            data_dir=Path(tmp) / "data",
            providers_file=_providers(Path(tmp), upstream.base_url),
        )
        clock = ManualClock()
        # A retry's backoff moves the manual clock instead of waiting.
        seams = Seams(clock=clock, backoff_sleep=FakeSleep(clock))
        daemon = SeededDaemon(config, seams)
        with (
            running_daemon(config, daemon=daemon) as running,
            grpc.insecure_channel(
                running.target,
                options=[("grpc.max_send_message_length", 64 << 20)],
            ) as channel,
        ):
            yield Seeded(running, channel, daemon.store, _seed(channel))


def send(channel: grpc.Channel, method: Any, data: bytes) -> grpc.StatusCode:
    """Sends raw request bytes; the code answered (for a stream: OK once its
    first message came, then it is cancelled; for the session stream, the
    code of that message's answer)."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    kind = (method.client_streaming, method.server_streaming)
    try:
        if kind == (False, False):
            channel.unary_unary(path, None, None)(data, timeout=30)
        elif kind == (False, True):
            stream: Any = channel.unary_stream(path, None, None)(data, timeout=30)
            next(stream, None)
            stream.cancel()
        elif kind == (True, False):
            channel.stream_unary(path, None, None)(iter([data]), timeout=30)
        else:
            stream = channel.stream_stream(path, None, None)(iter([data]), timeout=30)
            first = next(stream, None)
            stream.cancel()
            if path == SESSION and first is not None:
                return _session_answer(pb.SessionResponse.FromString(first), data)
    except grpc.RpcError as exc:
        code: grpc.StatusCode = exc.code()
        if code not in NEVER and path.startswith("/effectd."):
            _check_refusal(decode(exc), len(data))
        return code
    return grpc.StatusCode.OK


def _session_answer(answer: pb.SessionResponse, data: bytes) -> grpc.StatusCode:
    """The code of a session message's answer; its refusal checked as a
    unary one's."""
    sent = pb.SessionRequest.FromString(data)
    assert answer.id == sent.id, f"answered {answer.id} for {sent.id}"
    if answer.WhichOneof("response") != "error":
        return grpc.StatusCode.OK
    got = decode_status(answer.error)
    if got.code not in NEVER:
        _check_refusal(got, len(data))
    return got.code


def _check_refusal(got: Refusal, size: int) -> None:
    """An effectd refusal carries its ErrorInfo; bad input its BadRequest.
    Only the transport's RESOURCE_EXHAUSTED for a message over its limit
    carries neither."""
    if size > MAX_MESSAGE and got.code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return
    assert got.domain == DOMAIN, f"{got} (a request of {size} bytes)"
    if got.code is grpc.StatusCode.INVALID_ARGUMENT:
        assert got.reason == "INVALID_REQUEST", got
        assert got.fields, got


def bases(seeded: Seeded, method: Any) -> dict[str, Message]:
    request = GetMessageClass(method.input_type)
    found = {"empty": request(), "filled": wire.filled(method.input_type)}
    path = f"/{method.containing_service.full_name}/{method.name}"
    if path in seeded.bases:
        found["valid"] = seeded.bases[path]
    return found


def test_every_rpc_is_found() -> None:
    """The descriptors give every service the daemon serves and each of
    their RPCs (a control that the discovery works)."""
    services = {name.rsplit("/", 2)[1] for name in METHODS}
    assert services >= {
        "effectd.v1.ToolLedger",
        "effectd.v1.Recovery",
        "effectd.v1.RetryPolicy",
        "effectd.v1.Checkpoints",
        "effectd.v1.Provider",
        "effectd.v1.Admin",
        "grpc.health.v1.Health",
    }
    assert len(METHODS) >= 27
    # Every kind of session message but cancel carries a ledger request.
    assert (
        len(KINDS)
        == len(pb.SessionRequest.DESCRIPTOR.oneofs_by_name["request"].fields) - 1
    )


def mutated(seeded: Seeded, path: str, rng: random.Random) -> Iterator[Case]:
    """Every mutation of the RPC's request from each base, or for
    `Session:<kind>` of that kind of request inside a session message."""
    if path.startswith("Session:"):
        field, unary = KINDS[path.removeprefix("Session:")]
        assert field.message_type is not None
        for base_name, inner in bases(seeded, METHODS[unary]).items():
            session = pb.SessionRequest(id=7)
            getattr(session, field.name).CopyFrom(inner)
            head = session.SerializeToString()
            for m in wire.mutations(
                field.message_type, inner, DEPTH, rng, prefix=f"{field.name}."
            ):
                data = head + wire.delimited(field, m.data)
                yield Case(METHODS[SESSION], base_name, str(m), data)
        return
    method = METHODS[path]
    http = path.startswith(PROVIDER)
    for base_name, base in bases(seeded, method).items():
        for mutation, data in wire.requests(base, DEPTH, rng, http=http):
            yield Case(method, base_name, str(mutation), data)


@dataclass(frozen=True, slots=True)
class Case:
    method: Any
    base: str
    mutation: str
    data: bytes


def failures(seeded: Seeded, path: str) -> list[str]:
    """Sends every mutation of the RPC's request from each base; what went
    wrong: an UNKNOWN or INTERNAL answer, or a change in the store."""
    rng = random.Random(f"{SEED}:{path}")  # noqa: S311 - not a secret
    before = snapshot(seeded.store)
    found = []
    for case in mutated(seeded, path, rng):
        where = f"{path} from the {case.base} base, {case.mutation} (seed {SEED})"
        try:
            code = send(seeded.channel, case.method, case.data)
            if code in NEVER:
                found.append(f"{code.name}: {where}")
        except AssertionError as exc:
            found.append(f"{exc}: {where}")
        if snapshot(seeded.store) != before:
            found.append(f"the store changed: {where}")
            before = snapshot(seeded.store)
    return found


@pytest.mark.parametrize(
    "path", sorted(METHODS) + [f"Session:{k}" for k in sorted(KINDS)]
)
def test_bad_values_in_every_field_are_refused_and_change_nothing(
    seeded: Seeded, path: str
) -> None:
    """Each bad value of each field of the RPC's request, from each base:
    never UNKNOWN or INTERNAL, an effectd refusal carries its ErrorInfo, and
    the store is as it was (issue 10 item 22: fails before the fix: a
    DecideRetry deadline out of range answered INTERNAL, and a health
    request that did not parse UNKNOWN; each `Session:<kind>` is the same
    request inside a session message)."""
    print(f"seed {SEED} (EFFECTD_BAD_INPUT_SEED), deep={DEEP}")
    assert failures(seeded, path) == []
    assert_serving(seeded.channel)


def test_negative_control_an_unchecked_conversion_is_caught(
    seeded: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With DecideRetry's deadline converted unchecked again, the generated
    requests find the INTERNAL answer."""
    monkeypatch.setattr(convert, "timestamp_ns", lambda _v, _f, ts: ts.ToNanoseconds())
    found = failures(seeded, "/effectd.v1.RetryPolicy/DecideRetry")
    assert any(f.startswith("INTERNAL: ") and "deadline" in f for f in found)


def test_negative_control_a_header_value_http_cannot_carry_is_caught(
    seeded: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With header values checked only for line breaks again, the generated
    requests find the INTERNAL answer of a value the HTTP client cannot
    encode (issue 25 item 18)."""
    monkeypatch.setattr(
        prepare, "is_field_value", lambda v: not any(c in v for c in "\r\n\0")
    )
    found = failures(seeded, f"{PROVIDER}ProviderCall")
    assert any(f.startswith("INTERNAL: ") and "headers[+].value" in f for f in found), (
        found
    )


def test_negative_control_an_accepted_write_is_caught(seeded: Seeded) -> None:
    """The store check sees a write: a valid new prepare changes the
    snapshot."""
    before = snapshot(seeded.store)
    method = METHODS["/effectd.v1.ToolLedger/PrepareTool"]
    data = pb.PrepareToolRequest(
        ref=ref(RUN, "control", NS), tool_name="t", input=pb.Payload(json="{}")
    ).SerializeToString()
    assert send(seeded.channel, method, data) is grpc.StatusCode.OK
    assert snapshot(seeded.store) != before


def test_negative_control_a_session_message_answered_internal_is_caught(
    seeded: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With Heartbeat's lease converted by a function that fails on a huge
    value, the session message carrying it is answered INTERNAL, and the
    generated requests find it."""
    honest = convert.lease_ms

    def failing(v: Any, ms: int, limits: Any) -> Any:
        if ms > 1 << 31:
            raise ZeroDivisionError("a bug")
        return honest(v, ms, limits)

    monkeypatch.setattr(convert, "lease_ms", failing)
    found = failures(seeded, "Session:heartbeat")
    assert any(f.startswith("INTERNAL: ") and "heartbeat.lease_ms" in f for f in found)


def test_negative_control_a_write_through_a_session_is_caught(seeded: Seeded) -> None:
    """The store check sees a write a session message makes."""
    before = snapshot(seeded.store)
    request = pb.SessionRequest(
        id=1,
        prepare_tool=pb.PrepareToolRequest(
            ref=ref(RUN, "session-control", NS),
            tool_name="t",
            input=pb.Payload(json="{}"),
        ),
    )
    data = request.SerializeToString()
    assert send(seeded.channel, METHODS[SESSION], data) is grpc.StatusCode.OK
    assert snapshot(seeded.store) != before
