"""Malformed requests through the real server (contract §3.1, §8, §11.1).

Every case is sent as raw bytes on the wire, so a request that the generated
classes would refuse to build (broken wire format, invalid UTF-8) is sent
the same way as one that merely breaks a field rule. Each must answer
INVALID_ARGUMENT with ErrorInfo(effectd, INVALID_REQUEST) and a BadRequest
naming the field, and the daemon must go on serving afterwards.
"""

from __future__ import annotations

import base64
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from effectd.v1 import checkpoints_pb2 as cpb
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import retry_pb2 as rpb
from google.protobuf import timestamp_pb2
from google.protobuf.message import Message

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.testing import RunningDaemon, running_daemon
from tests.rpc.support import (
    DOMAIN,
    assert_serving,
    prepare_request,
    ref,
    refused,
)

MiB = 1 << 20
LEDGER = "/effectd.v1.ToolLedger/"
CHECKPOINTS = "/effectd.v1.Checkpoints/"
# The request as a whole: a message that does not parse has no field to name.
WHOLE = ""


@dataclass(frozen=True, slots=True)
class Case:
    method: str
    request: bytes
    # Each must be reported; every reported field must be one of them or
    # nested under one of them.
    fields: tuple[str, ...]


def case(
    case_id: str,
    method: str,
    request: Message | bytes,
    *fields: str,
) -> object:
    data = request if isinstance(request, bytes) else request.SerializeToString()
    return pytest.param(Case(method, data, fields), id=case_id)


# -- request builders --------------------------------------------------------


def prepare(**changes: object) -> pb.PrepareToolRequest:
    request = prepare_request("run", "call")
    for name, value in changes.items():
        if name in {"namespace", "run_id", "call_id"}:
            setattr(request.ref, name, value)
        elif name == "input":
            request.input.CopyFrom(value)  # type: ignore[arg-type]
        else:
            setattr(request, name, value)
    return request


def no_input() -> pb.PrepareToolRequest:
    request = prepare()
    request.ClearField("input")
    return request


def json_input(text: str) -> pb.PrepareToolRequest:
    return prepare(input=pb.Payload(json=text))


def batch(*calls: pb.PrepareToolRequest) -> pb.PrepareToolsRequest:
    return pb.PrepareToolsRequest(calls=list(calls))


def commit(**result: object) -> pb.CommitToolRequest:
    fields: dict[str, object] = {
        "outcome": pb.OUTCOME_OK,
        "payload": pb.Payload(json="{}"),
        **result,
    }
    return pb.CommitToolRequest(
        ref=ref(),
        attempt=1,
        result=pb.ToolResult(**fields),  # type: ignore[arg-type]
    )


def put(key: str = "k", value: bytes = b"v", **precondition: object) -> bytes:
    request = cpb.PutCheckpointRequest(key=key, value=value)
    for name, flag in precondition.items():
        setattr(request, name, flag)
    return request.SerializeToString()


def compare(key: str, revision: int | None = None) -> cpb.Compare:
    if revision is None:
        return cpb.Compare(key=key, absent=True)
    return cpb.Compare(key=key, revision=revision)


def put_op(key: str, value: bytes = b"v") -> cpb.TxnOp:
    return cpb.TxnOp(put=cpb.TxnPut(key=key, value=value))


def txn(compares: list[cpb.Compare], ops: list[cpb.TxnOp]) -> cpb.CheckpointTxnRequest:
    return cpb.CheckpointTxnRequest(compares=compares, ops=ops)


def token(key: bytes) -> str:
    return base64.urlsafe_b64encode(key).decode()


def length_delimited(field: int, data: bytes) -> bytes:
    """One length-delimited field on the wire (data shorter than 128 bytes)."""
    assert len(data) < 128
    return bytes([field << 3 | 2, len(data)]) + data


# Hand-made wire bytes that no generated class would produce.
NOT_PROTOBUF = b"\xff\xff\xff"
RUN_ID_BAD_UTF8 = length_delimited(1, length_delimited(2, b"\xff"))
JSON_BAD_UTF8 = prepare().SerializeToString() + length_delimited(
    4, length_delimited(1, b'{"a":"\xc3\x28"}')
)
TRUNCATED = length_delimited(1, length_delimited(2, b"run"))[:-1]
KEY_BAD_UTF8 = length_delimited(2, b"k\xe2\x82")

# Neither base64 nor a key of any listing.
NOT_A_TOKEN = "not a token"
LONG_ASCII = "x" * 257
# 129 two-byte characters: 258 bytes, although only 129 characters.
LONG_UTF8 = "é" * 129

CASES = [
    # -- PrepareTool: identity (contract §3.1)
    case("prepare-run_id-empty", "PrepareTool", prepare(run_id=""), "ref.run_id"),
    case("prepare-call_id-empty", "PrepareTool", prepare(call_id=""), "ref.call_id"),
    case(
        "prepare-run_id-257-bytes",
        "PrepareTool",
        prepare(run_id=LONG_ASCII),
        "ref.run_id",
    ),
    case(
        "prepare-call_id-258-bytes-multibyte",
        "PrepareTool",
        prepare(call_id=LONG_UTF8),
        "ref.call_id",
    ),
    case("prepare-run_id-colon", "PrepareTool", prepare(run_id="a:b"), "ref.run_id"),
    case("prepare-run_id-newline", "PrepareTool", prepare(run_id="a\nb"), "ref.run_id"),
    case("prepare-run_id-nul", "PrepareTool", prepare(run_id="a\x00b"), "ref.run_id"),
    case(
        "prepare-call_id-c1-control",
        "PrepareTool",
        prepare(call_id="a\x85b"),
        "ref.call_id",
    ),
    case("prepare-call_id-del", "PrepareTool", prepare(call_id="\x7f"), "ref.call_id"),
    case(
        "prepare-namespace-slash",
        "PrepareTool",
        prepare(namespace="a/b"),
        "ref.namespace",
    ),
    case(
        "prepare-namespace-65-chars",
        "PrepareTool",
        prepare(namespace="n" * 65),
        "ref.namespace",
    ),
    case(
        "prepare-namespace-non-ascii",
        "PrepareTool",
        prepare(namespace="ñ"),
        "ref.namespace",
    ),
    # -- PrepareTool: the rest of the request
    case(
        "prepare-tool_name-missing", "PrepareTool", prepare(tool_name=""), "tool_name"
    ),
    case(
        "prepare-tool_name-control",
        "PrepareTool",
        prepare(tool_name="send\temail"),
        "tool_name",
    ),
    case("prepare-input-missing", "PrepareTool", no_input(), "input"),
    case("prepare-input-json-invalid", "PrepareTool", json_input("{"), "input.json"),
    case("prepare-input-json-empty", "PrepareTool", json_input(""), "input.json"),
    case(
        "prepare-input-json-nan", "PrepareTool", json_input('{"x": NaN}'), "input.json"
    ),
    case(
        "prepare-input-json-infinity",
        "PrepareTool",
        json_input("[Infinity]"),
        "input.json",
    ),
    case(
        "prepare-input-json-float-overflow",
        "PrepareTool",
        json_input("1e400"),
        "input.json",
    ),
    case(
        "prepare-input-json-duplicate-keys",
        "PrepareTool",
        json_input('{"a": 1, "a": 2}'),
        "input.json",
    ),
    case(
        "prepare-input-json-int-over-2**53",
        "PrepareTool",
        json_input(f'{{"n": {2**53 + 1}}}'),
        "input.json",
    ),
    case(
        "prepare-input-json-nested-100000-deep",
        "PrepareTool",
        json_input("[" * 100_000 + "]" * 100_000),
        "input.json",
    ),
    case(
        "prepare-input-json-lone-surrogate-escape",
        "PrepareTool",
        json_input('{"k": "\\ud800"}'),
        "input.json",
    ),
    case(
        "prepare-input-json-over-1MiB",
        "PrepareTool",
        json_input('"' + "a" * MiB + '"'),
        "input.json",
    ),
    case(
        "prepare-input-raw-over-1MiB",
        "PrepareTool",
        prepare(input=pb.Payload(raw=b"\x00" * (MiB + 1))),
        "input.raw",
    ),
    case(
        "prepare-effect-99",
        "PrepareTool",
        prepare(effect=pb.Effect.ValueType(99)),
        "effect",
    ),
    case(
        "prepare-lease_ms-over-max",
        "PrepareTool",
        prepare(start=True, lease_ms=3_600_001),
        "lease_ms",
    ),
    case(
        "prepare-everything-missing",
        "PrepareTool",
        pb.PrepareToolRequest(),
        "ref.run_id",
        "ref.call_id",
        "tool_name",
        "input",
    ),
    # -- PrepareTool: bytes that are not a PrepareToolRequest
    case("prepare-not-protobuf", "PrepareTool", NOT_PROTOBUF, WHOLE),
    case("prepare-run_id-invalid-utf8", "PrepareTool", RUN_ID_BAD_UTF8, WHOLE),
    case("prepare-input-json-invalid-utf8", "PrepareTool", JSON_BAD_UTF8, WHOLE),
    case("prepare-truncated", "PrepareTool", TRUNCATED, WHOLE),
    # -- PrepareTools
    case("batch-empty", "PrepareTools", batch(), "calls"),
    case(
        "batch-257-calls",
        "PrepareTools",
        batch(*(prepare_request("run", f"c{i}") for i in range(257))),
        "calls",
    ),
    case(
        "batch-duplicate-ref",
        "PrepareTools",
        batch(prepare_request("run", "a"), prepare_request("run", "a")),
        "calls[1].ref",
    ),
    case(
        "batch-duplicate-ref-default-namespace",
        "PrepareTools",
        batch(
            prepare_request("run", "a"),
            prepare_request("run", "b"),
            prepare_request("run", "a", namespace="default"),
        ),
        "calls[2].ref",
    ),
    case(
        "batch-item-run_id-colon",
        "PrepareTools",
        batch(prepare_request("run", "a"), prepare_request("r:1", "b")),
        "calls[1].ref.run_id",
    ),
    case(
        "batch-item-input-missing",
        "PrepareTools",
        batch(
            prepare_request("run", "a"), pb.PrepareToolRequest(ref=ref(), tool_name="t")
        ),
        "calls[1].input",
    ),
    case("batch-not-protobuf", "PrepareTools", NOT_PROTOBUF, WHOLE),
    # -- StartTool
    case(
        "start-ref-missing",
        "StartTool",
        pb.StartToolRequest(),
        "ref.run_id",
        "ref.call_id",
    ),
    case(
        "start-lease_ms-over-max",
        "StartTool",
        pb.StartToolRequest(ref=ref(), lease_ms=3_600_001),
        "lease_ms",
    ),
    case(
        "start-run_id-colon",
        "StartTool",
        pb.StartToolRequest(ref=ref(run_id="a:b")),
        "ref.run_id",
    ),
    # -- CommitTool
    case(
        "commit-attempt-0",
        "CommitTool",
        pb.CommitToolRequest(ref=ref(), result=pb.ToolResult(outcome=pb.OUTCOME_OK)),
        "attempt",
    ),
    case(
        "commit-result-missing",
        "CommitTool",
        pb.CommitToolRequest(ref=ref(), attempt=1),
        "result",
    ),
    case(
        "commit-outcome-unspecified",
        "CommitTool",
        commit(outcome=pb.OUTCOME_UNSPECIFIED),
        "result.outcome",
    ),
    case(
        "commit-outcome-99",
        "CommitTool",
        commit(outcome=pb.Outcome.ValueType(99)),
        "result.outcome",
    ),
    case(
        "commit-digest-output-only",
        "CommitTool",
        commit(digest="sha256:" + "0" * 64),
        "result.digest",
    ),
    case(
        "commit-payload-json-invalid",
        "CommitTool",
        commit(payload=pb.Payload(json="{'a': 1}")),
        "result.payload.json",
    ),
    case(
        "commit-payload-raw-over-1MiB",
        "CommitTool",
        commit(payload=pb.Payload(raw=b"r" * (MiB + 1))),
        "result.payload.raw",
    ),
    case(
        "commit-error_message-over-4096-bytes",
        "CommitTool",
        commit(outcome=pb.OUTCOME_ERROR, error_code="E", error_message="m" * 4097),
        "result.error_message",
    ),
    # -- ReportUnknown
    case(
        "report-attempt-0",
        "ReportUnknown",
        pb.ReportUnknownRequest(ref=ref(), reason="timeout"),
        "attempt",
    ),
    case(
        "report-reason-control",
        "ReportUnknown",
        pb.ReportUnknownRequest(ref=ref(), attempt=1, reason="lost\x1b[2J"),
        "reason",
    ),
    case(
        "report-reason-over-4096-bytes",
        "ReportUnknown",
        pb.ReportUnknownRequest(ref=ref(), attempt=1, reason="é" * 2049),
        "reason",
    ),
    # -- Heartbeat
    case(
        "heartbeat-attempt-0",
        "Heartbeat",
        pb.HeartbeatRequest(ref=ref()),
        "attempt",
    ),
    case(
        "heartbeat-lease_ms-over-max",
        "Heartbeat",
        pb.HeartbeatRequest(ref=ref(), attempt=1, lease_ms=3_600_001),
        "lease_ms",
    ),
    # -- GetToolCall
    case(
        "get-namespace-bad",
        "GetToolCall",
        pb.GetToolCallRequest(ref=ref(namespace="a b")),
        "ref.namespace",
    ),
    case(
        "get-call_id-258-bytes-multibyte",
        "GetToolCall",
        pb.GetToolCallRequest(ref=ref(call_id=LONG_UTF8)),
        "ref.call_id",
    ),
    case("get-not-protobuf", "GetToolCall", NOT_PROTOBUF, WHOLE),
    # -- ListToolCalls
    case(
        "list-state-42",
        "ListToolCalls",
        pb.ListToolCallsRequest(states=[pb.CallState.ValueType(42)]),
        "states[0]",
    ),
    case(
        "list-second-state-unknown",
        "ListToolCalls",
        pb.ListToolCallsRequest(
            states=[pb.CALL_STATE_PREPARED, pb.CallState.ValueType(42)]
        ),
        "states[1]",
    ),
    case(
        "list-page_size-1001",
        "ListToolCalls",
        pb.ListToolCallsRequest(page_size=1001),
        "page_size",
    ),
    case(
        "list-page_token-garbage",
        "ListToolCalls",
        pb.ListToolCallsRequest(page_token=NOT_A_TOKEN),
        "page_token",
    ),
    case(
        "list-page_token-of-another-namespace",
        "ListToolCalls",
        pb.ListToolCallsRequest(page_token=token(b"other\x00run\x00call")),
        "page_token",
    ),
    case(
        "list-run_id-colon",
        "ListToolCalls",
        pb.ListToolCallsRequest(run_id="a:b"),
        "run_id",
    ),
    case(
        "list-namespace-bad",
        "ListToolCalls",
        pb.ListToolCallsRequest(namespace="a:b"),
        "namespace",
    ),
    # -- Checkpoints.Get
    case("cp-get-key-empty", "Get", cpb.GetCheckpointRequest(), "key"),
    case(
        "cp-get-key-513-bytes",
        "Get",
        cpb.GetCheckpointRequest(key="k" * 513),
        "key",
    ),
    case(
        "cp-get-key-control",
        "Get",
        cpb.GetCheckpointRequest(key="a\x00b"),
        "key",
    ),
    case(
        "cp-get-namespace-bad",
        "Get",
        cpb.GetCheckpointRequest(namespace="../etc", key="k"),
        "namespace",
    ),
    case("cp-get-key-invalid-utf8", "Get", KEY_BAD_UTF8, WHOLE),
    # -- Checkpoints.Put
    case("cp-put-no-precondition", "Put", put(), "precondition"),
    case(
        "cp-put-expect_absent-false", "Put", put(expect_absent=False), "expect_absent"
    ),
    case(
        "cp-put-expected_revision-0",
        "Put",
        put(expected_revision=0),
        "expected_revision",
    ),
    case(
        "cp-put-value-over-1MiB",
        "Put",
        put(value=b"v" * (MiB + 1), expect_absent=True),
        "value",
    ),
    case("cp-put-key-empty", "Put", put(key="", expect_absent=True), "key"),
    # -- Checkpoints.Delete
    case(
        "cp-delete-no-revision",
        "Delete",
        cpb.DeleteCheckpointRequest(key="k"),
        "expected_revision",
    ),
    case(
        "cp-delete-key-empty",
        "Delete",
        cpb.DeleteCheckpointRequest(expected_revision=1),
        "key",
    ),
    # -- Checkpoints.Txn
    case("cp-txn-no-ops", "Txn", txn([compare("a")], []), "ops"),
    case("cp-txn-op-without-compare", "Txn", txn([], [put_op("a")]), "ops[0]"),
    case(
        "cp-txn-key-written-twice",
        "Txn",
        txn([compare("a")], [put_op("a"), cpb.TxnOp(delete=cpb.TxnDelete(key="a"))]),
        "ops[1]",
    ),
    case(
        "cp-txn-op-empty",
        "Txn",
        txn([compare("a")], [put_op("a"), cpb.TxnOp()]),
        "ops[1]",
    ),
    case(
        "cp-txn-compare-without-expect",
        "Txn",
        txn([cpb.Compare(key="a")], [put_op("a")]),
        "compares[0]",
    ),
    case(
        "cp-txn-compare-key-twice",
        "Txn",
        txn([compare("a"), compare("a", 3)], [put_op("a")]),
        "compares[1].key",
    ),
    case(
        "cp-txn-compare-revision-0",
        "Txn",
        txn([compare("a", 0)], [put_op("a")]),
        "compares[0].revision",
    ),
    case(
        "cp-txn-compare-absent-false",
        "Txn",
        txn([cpb.Compare(key="a", absent=False)], [put_op("a")]),
        "compares[0].absent",
    ),
    case(
        "cp-txn-129-ops",
        "Txn",
        txn(
            [compare(f"k{i}") for i in range(129)],
            [put_op(f"k{i}") for i in range(129)],
        ),
        "compares",
        "ops",
    ),
    case(
        "cp-txn-put-value-over-1MiB",
        "Txn",
        txn([compare("a")], [put_op("a", b"v" * (MiB + 1))]),
        "ops[0].put.value",
    ),
    case(
        "cp-txn-op-key-control",
        "Txn",
        txn([compare("a")], [put_op("a"), cpb.TxnOp(delete=cpb.TxnDelete(key="\n"))]),
        "ops[1]",
    ),
    case("cp-txn-not-protobuf", "Txn", NOT_PROTOBUF, WHOLE),
    # -- Checkpoints.List
    case(
        "cp-list-page_size-1001",
        "List",
        cpb.ListCheckpointsRequest(page_size=1001),
        "page_size",
    ),
    case(
        "cp-list-prefix-control",
        "List",
        cpb.ListCheckpointsRequest(prefix="p\x00"),
        "prefix",
    ),
    case(
        "cp-list-page_token-garbage-with-prefix",
        "List",
        cpb.ListCheckpointsRequest(prefix="p/", page_token=NOT_A_TOKEN),
        "page_token",
    ),
    case(
        "cp-list-page_token-garbage",
        "List",
        cpb.ListCheckpointsRequest(page_token=NOT_A_TOKEN),
        "page_token",
    ),
    case(
        "cp-list-page_token-not-utf8",
        "List",
        cpb.ListCheckpointsRequest(page_token=token(b"\xff\xfe")),
        "page_token",
    ),
]


@pytest.fixture(scope="module")
def served() -> Iterator[RunningDaemon]:
    """One daemon for the whole module: it must survive every case in turn."""
    with (
        tempfile.TemporaryDirectory(prefix="effectd-", dir="/tmp") as tmp,
        running_daemon(ServeConfig(data_dir=Path(tmp) / "data"), ManualClock()) as d,
    ):
        yield d


@pytest.fixture(scope="module")
def wire(served: RunningDaemon) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(served.target) as channel:
        yield channel


def send(channel: grpc.Channel, method: str, data: bytes) -> bytes:
    service = (
        CHECKPOINTS if method in {"Get", "Put", "Delete", "Txn", "List"} else LEDGER
    )
    call = channel.unary_unary(
        service + method, request_serializer=None, response_deserializer=None
    )
    answer: bytes = call(data, timeout=10)
    return answer


def test_there_are_enough_cases() -> None:
    """The table covers at least 35 malformed requests over 13 RPCs."""
    methods = {p.values[0].method for p in CASES}  # type: ignore[attr-defined]
    assert len(CASES) >= 35
    assert len(methods) == 13


@pytest.mark.parametrize("bad", CASES)
def test_malformed_request_is_invalid_argument(wire: grpc.Channel, bad: Case) -> None:
    """A malformed request answers INVALID_REQUEST naming its field, and the
    daemon goes on serving."""
    got = refused(lambda: send(wire, bad.method, bad.request))
    assert got.code is grpc.StatusCode.INVALID_ARGUMENT, got
    assert (got.domain, got.reason) == (DOMAIN, "INVALID_REQUEST"), got
    assert got.fields is not None, got
    assert set(bad.fields) <= set(got.fields), got
    for field in got.fields:
        assert any(field == f or field.startswith(f + ".") for f in bad.fields), got
    assert_serving(wire)


INT64 = (-(1 << 63), (1 << 63) - 1)
UNKNOWN_STATE = pb.CALL_STATE_UNKNOWN


@pytest.mark.parametrize(
    ("seconds", "nanos"),
    [
        pytest.param(0, -1, id="negative-nanos"),
        pytest.param(0, 1_000_000_000, id="nanos-a-second"),
        pytest.param(-62_135_596_801, 0, id="before-year-1"),
        pytest.param(253_402_300_800, 0, id="after-year-9999"),
        pytest.param(INT64[0], 0, id="int64-min"),
        pytest.param(INT64[1], (1 << 31) - 1, id="int64-max"),
    ],
)
def test_an_out_of_range_retry_deadline_is_invalid_argument(
    wire: grpc.Channel, seconds: int, nanos: int
) -> None:
    """DecideRetry with a deadline Timestamp outside timestamp.proto's range
    answers INVALID_REQUEST naming `deadline` (issue 10 item 22: fails before
    the fix: the conversion raised ValueError and the answer was INTERNAL)."""
    request = rpb.DecideRetryRequest(
        facts=rpb.RetryFacts(effect=pb.EFFECT_READ, state=pb.CALL_STATE_UNKNOWN),
        context=rpb.RETRY_CONTEXT_TOOL,
        deadline=timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos),
    )
    call = wire.unary_unary(
        "/effectd.v1.RetryPolicy/DecideRetry",
        request_serializer=None,
        response_deserializer=None,
    )
    got = refused(lambda: call(request.SerializeToString(), timeout=10))
    assert (got.code, got.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
    )
    assert got.fields == ("deadline",)
    assert_serving(wire)


def test_the_edges_of_the_timestamp_range_are_accepted(wire: grpc.Channel) -> None:
    """Year 1 and the last nanosecond of year 9999 are valid deadlines (one
    long past: the retry is denied, not refused)."""
    call = wire.unary_unary(
        "/effectd.v1.RetryPolicy/DecideRetry",
        request_serializer=None,
        response_deserializer=None,
    )
    for seconds, nanos in ((-62_135_596_800, 0), (253_402_300_799, 999_999_999)):
        request = rpb.DecideRetryRequest(
            facts=rpb.RetryFacts(effect=pb.EFFECT_READ, state=pb.CALL_STATE_UNKNOWN),
            context=rpb.RETRY_CONTEXT_TOOL,
            error=rpb.AttemptError(kind=rpb.FAILURE_KIND_TIMEOUT),
            attempts_used=1,
            deadline=timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos),
        )
        answer = rpb.DecideRetryResponse.FromString(
            call(request.SerializeToString(), timeout=10)
        )
        assert answer.allow is (seconds > 0)


def edge(call_id: str, **changes: object) -> pb.PrepareToolRequest:
    """A valid prepare of its own call in run `edge`, with `changes`."""
    return prepare(**{"run_id": "edge", "call_id": call_id, **changes})


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(edge("c1", run_id="é" * 128), id="run_id-256-bytes-multibyte"),
        pytest.param(edge("x" * 256), id="call_id-256-bytes"),
        pytest.param(edge("c2", namespace="n" * 64), id="namespace-64-chars"),
        pytest.param(edge("c3", namespace="A.z_0-9"), id="namespace-all-classes"),
        pytest.param(edge("a:b"), id="call_id-colon"),
        pytest.param(edge("c4", run_id="运行-🚀"), id="run_id-non-ascii"),
        pytest.param(
            edge("c5", input=pb.Payload(json=f"[{2**53 - 1}]")), id="json-int-2**53-1"
        ),
        pytest.param(
            edge("c6", input=pb.Payload(raw=b"\x00" * MiB)), id="raw-exactly-1MiB"
        ),
        pytest.param(edge("c7", start=True, lease_ms=3_600_000), id="lease_ms-max"),
        pytest.param(edge("c8", tool_name="t" * 256), id="tool_name-256-bytes"),
        pytest.param(
            edge("c9", tool_name="é" * 128), id="tool_name-256-bytes-multibyte"
        ),
    ],
)
def test_boundary_values_are_accepted(
    wire: grpc.Channel, request_: pb.PrepareToolRequest
) -> None:
    """Values at the edge of each rule are accepted, so the refusals above
    come from the rules and not from an overly strict check."""
    answer = pb.PrepareToolResponse.FromString(
        send(wire, "PrepareTool", request_.SerializeToString())
    )
    assert answer.decision == pb.DECISION_EXECUTE
    assert answer.call.ref.run_id == request_.ref.run_id
    assert answer.call.ref.call_id == request_.ref.call_id


def test_largest_batch_and_txn_are_accepted(wire: grpc.Channel) -> None:
    """A batch of 256 calls and a Txn of 128 ops are within the limits."""
    calls = [prepare_request("edge-batch", f"c{i}") for i in range(256)]
    answer = pb.PrepareToolsResponse.FromString(
        send(wire, "PrepareTools", batch(*calls).SerializeToString())
    )
    assert len(answer.results) == 256
    assert {r.decision for r in answer.results} == {pb.DECISION_EXECUTE}
    request = txn(
        [compare(f"edge/{i}") for i in range(128)],
        [put_op(f"edge/{i}") for i in range(128)],
    )
    revision = cpb.CheckpointTxnResponse.FromString(
        send(wire, "Txn", request.SerializeToString())
    ).revision
    assert revision > 0


def test_many_bad_fields_are_named_in_a_bounded_answer(wire: grpc.Channel) -> None:
    """256 empty calls (over a thousand violations) answer INVALID_REQUEST
    with the first 32 violations and the count of the rest, small enough for
    a client to read (fails before the fix: the BadRequest of every
    violation passed gRPC's metadata limit, and the client saw
    RESOURCE_EXHAUSTED without any ErrorInfo)."""
    request = batch(*[pb.PrepareToolRequest() for _ in range(256)])
    got = refused(lambda: send(wire, "PrepareTools", request.SerializeToString()))
    assert (got.code, got.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
    )
    assert got.fields is not None
    assert len(got.fields) == 32
    assert int(got.metadata["omittedViolations"]) > 900


@pytest.mark.parametrize(
    ("method", "request_", "field"),
    [
        ("PrepareTools", batch(*[pb.PrepareToolRequest()] * 10_001), "calls"),
        ("Txn", txn([], [cpb.TxnOp()] * 10_001), "ops"),
        (
            "ListToolCalls",
            pb.ListToolCallsRequest(run_id="r", states=[UNKNOWN_STATE] * 10_001),
            "states",
        ),
    ],
    ids=["calls", "ops", "states"],
)
def test_an_over_long_list_is_refused_before_its_elements_are_read(
    wire: grpc.Channel, method: str, request_: Message, field: str
) -> None:
    """A list past its limit is refused for its length alone: the answer
    names the list, not each of its elements (fails before the fix: each
    element was read; the violations of ten thousand overflowed the trailer,
    300 000 held the event loop for half a minute, and ten thousand valid
    states were accepted)."""
    got = refused(lambda: send(wire, method, request_.SerializeToString()))
    assert (got.code, got.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
    )
    assert got.fields is not None
    assert field in got.fields
    assert not [f for f in got.fields if f.startswith(field + "[")]


def test_message_over_transport_limit_is_resource_exhausted(wire: grpc.Channel) -> None:
    """A request over the 8 MiB gRPC message limit is refused by the transport
    with RESOURCE_EXHAUSTED, and the daemon goes on serving."""
    huge = prepare(call_id="huge", input=pb.Payload(raw=b"\x00" * (9 * MiB)))
    got = refused(lambda: send(wire, "PrepareTool", huge.SerializeToString()))
    assert got.code is grpc.StatusCode.RESOURCE_EXHAUSTED, got
    assert_serving(wire)


def test_refused_requests_wrote_nothing(wire: grpc.Channel) -> None:
    """After the refusals, nothing they named was written: run `run` and the
    checkpoint keys are used only by malformed requests."""
    answer = pb.ListToolCallsResponse.FromString(
        send(
            wire,
            "ListToolCalls",
            pb.ListToolCallsRequest(run_id="run").SerializeToString(),
        )
    )
    assert list(answer.calls) == []
    got = refused(
        lambda: send(
            wire, "GetToolCall", pb.GetToolCallRequest(ref=ref()).SerializeToString()
        )
    )
    assert (got.code, got.reason) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    # The only checkpoints are those of the valid 128-op Txn.
    listed = cpb.ListCheckpointsResponse.FromString(
        send(
            wire, "List", cpb.ListCheckpointsRequest(page_size=1000).SerializeToString()
        )
    )
    assert {cp.key for cp in listed.checkpoints} <= {f"edge/{i}" for i in range(128)}
    assert_serving(wire)
