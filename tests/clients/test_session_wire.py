"""The session's pure parts: every message kind is mapped, a message's
error reads as the unary call's, and the end of a stream settles each of its
messages by the rule of `effectd_client._session_wire.ended`."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2

from effectd_client import Client, EffectdError, InvalidRequest, RateLimited
from effectd_client import _requests as req
from effectd_client import _session_calls as session_calls
from effectd_client import _session_wire as wire


class Stopped(grpc.RpcError, grpc.Call):
    """A stream's end as grpc raises it (code, details, and the daemon's
    ErrorInfo `reason` in the trailer when given)."""

    def __init__(
        self, code: grpc.StatusCode, details: str = "stopped", reason: str = ""
    ) -> None:
        self._code = code
        self._details = details
        self._trailer: tuple[tuple[str, bytes], ...] = ()
        if reason:
            status = status_pb2.Status(code=code.value[0], message=details)
            status.details.add().Pack(
                error_details_pb2.ErrorInfo(reason=reason, domain="effectd")
            )
            key = "grpc-status-details-bin"
            self._trailer = ((key, status.SerializeToString()),)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    # grpc-stubs types this trailer as `_Metadatum`s; grpc gives (key, value).
    def trailing_metadata(self) -> grpc.Metadata:  # type: ignore[override]
        return self._trailer


def test_every_message_kind_is_mapped() -> None:
    """The session's table names every request and answer of the protos
    (but `cancel` and `error`), each field the same in both."""
    requests = {
        f.name for f in pb.SessionRequest.DESCRIPTOR.oneofs_by_name["request"].fields
    }
    answers = {
        f.name for f in pb.SessionResponse.DESCRIPTOR.oneofs_by_name["response"].fields
    }
    assert set(wire.FIELDS.values()) == requests - {"cancel"} == answers - {"error"}


def status_with_details() -> status_pb2.Status:
    status = status_pb2.Status(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
    status.message = "slow down"
    status.details.add().Pack(
        error_details_pb2.ErrorInfo(
            reason="RATE_LIMITED", domain="effectd", metadata={"quota": "rate"}
        )
    )
    status.details.add().Pack(
        error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(nanos=50_000_000))
    )
    return status


def test_an_answered_error_reads_as_the_unary_calls() -> None:
    """The answer's google.rpc.Status becomes the client's exception of its
    reason, with the message, the metadata and the retry delay."""
    answer = pb.SessionResponse(id=7, error=status_with_details())
    with pytest.raises(grpc.RpcError) as raised:
        wire.outcome("PrepareTool", answer)
    error = EffectdError.from_rpc_error(raised.value)
    assert isinstance(error, RateLimited)
    assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (error.message, error.metadata) == ("slow down", {"quota": "rate"})
    assert error.retry_delay == 0.05


def test_bad_request_field_violations_survive() -> None:
    status = status_pb2.Status(
        code=grpc.StatusCode.INVALID_ARGUMENT.value[0], message="bad"
    )
    status.details.add().Pack(error_details_pb2.ErrorInfo(reason="INVALID_REQUEST"))
    status.details.add().Pack(
        error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field="ref.run_id", description="empty"
                )
            ]
        )
    )
    with pytest.raises(grpc.RpcError) as raised:
        wire.outcome("GetToolCall", pb.SessionResponse(id=1, error=status))
    error = EffectdError.from_rpc_error(raised.value)
    assert isinstance(error, InvalidRequest)
    assert [v.field for v in error.violations] == ["ref.run_id"]


def test_an_answer_of_the_right_kind_is_returned_and_another_refused() -> None:
    call = pb.ToolCall(tool_name="t")
    ok = pb.SessionResponse(id=1, get_tool_call=pb.GetToolCallResponse(call=call))
    assert wire.outcome("GetToolCall", ok).call.tool_name == "t"
    with pytest.raises(grpc.RpcError) as raised:
        wire.outcome("PrepareTool", ok)
    assert EffectdError.from_rpc_error(raised.value).code is grpc.StatusCode.INTERNAL


@pytest.mark.parametrize(
    ("applied", "said"), [(True, "true"), (False, "false")], ids=["sent", "unsent"]
)
def test_a_broken_stream_is_unavailable_and_says_if_applied(
    applied: bool, said: str
) -> None:
    error = EffectdError.from_rpc_error(wire.broken(applied, "gone"))
    assert error.code is grpc.StatusCode.UNAVAILABLE
    assert error.metadata == {wire.MAY_HAVE_BEEN_APPLIED: said}


@pytest.mark.parametrize(
    ("timeout", "ms"),
    [(None, 0), (10.0, 10_000), (0.0001, 1), (0.0015, 2), (1e9, 2**32 - 1)],
)
def test_the_timeout_is_the_messages_deadline_rounded_up(
    timeout: float | None, ms: int
) -> None:
    assert wire.timeout_ms(timeout) == ms


# The daemon without room for another stream, as its admission refuses one.
FULL = Stopped(
    grpc.StatusCode.RESOURCE_EXHAUSTED, "no room", reason="CONCURRENCY_LIMITED"
)
# The daemon ending a stream as it stops, every message it read answered.
STOPPING = Stopped(grpc.StatusCode.UNAVAILABLE, "stopping", reason="SHUTTING_DOWN")
# gRPC ending a stream whose answer was over the client's message size limit.
TOO_BIG = Stopped(
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    "Received message larger than max (5000000 vs. 4194304)",
)


def table_of_three() -> tuple[wire.InFlight[str], list[wire.Entry[str]]]:
    """Three messages on stream "s": one taken, one not, one not sent twice."""
    table: wire.InFlight[str] = wire.InFlight()
    body = req.get_tool_call("", "r", "c")
    entries = [table.add("GetToolCall", body, 1.0, w) for w in ("a", "b", "c")]
    for e in entries:
        e.stream = "s"
    entries[0].sent = True
    entries[2].resends = wire.RESENDS
    return table, entries


@pytest.mark.parametrize(
    ("error", "closing", "expected"),
    [
        # Taken: unknown outcome. Not taken: sent again once, then failed.
        (Stopped(grpc.StatusCode.UNAVAILABLE), False, (False, "ac", "", "b")),
        (None, False, (False, "ac", "", "b")),
        # Refused as a whole: nothing served; asked by unary calls...
        (Stopped(grpc.StatusCode.UNIMPLEMENTED), False, (True, "", "abc", "")),
        (Stopped(grpc.StatusCode.PERMISSION_DENIED), False, (True, "", "abc", "")),
        # ...for a while, when the daemon has no room for the stream.
        (FULL, False, (False, "", "abc", "")),
        (
            Stopped(grpc.StatusCode.RESOURCE_EXHAUSTED, reason="RATE_LIMITED"),
            False,
            (False, "", "abc", ""),
        ),
        # gRPC's own RESOURCE_EXHAUSTED (an answer over the client's size
        # limit) names no limit of the daemon: a broken stream, whose
        # message taken may have been applied, never asked again.
        (TOO_BIG, False, (False, "ac", "", "b")),
        # ...but an unknown token is refused as any call would be.
        (Stopped(grpc.StatusCode.UNAUTHENTICATED), False, (False, "abc", "", "")),
        # The daemon stopping answers every message it read before it ends
        # the stream: as a break, but the message taken was not read.
        (STOPPING, False, (False, "ac", "", "b")),
        # Closing: all fail, whatever the end.
        (Stopped(grpc.StatusCode.CANCELLED), True, (False, "abc", "", "")),
        (Stopped(grpc.StatusCode.UNIMPLEMENTED), True, (False, "abc", "", "")),
    ],
)
def test_the_end_of_a_stream_settles_each_message(
    error: Exception | None, closing: bool, expected: tuple[bool, str, str, str]
) -> None:
    """Which messages fail, are asked by unary calls, or are sent again."""
    unary, failed, fallback, again = expected
    table, _ = table_of_three()
    end = wire.ended(table, "s", error, closing)
    assert end.unary is unary
    assert "".join(e.waiter for e, _ in end.failed) == failed
    assert "".join(e.waiter for e in end.fallback) == fallback
    assert "".join(e.waiter for e in end.again) == again
    assert len(table) == len(again)  # only those sent again stay in flight
    full = error is not None and wire.refused(error) and not unary and not failed
    assert end.pause == (wire.FULL_PAUSE if full else 0.0)


def test_a_stream_ended_as_the_daemon_stops_failed_its_messages_not_sent() -> None:
    """Even the message taken: the daemon answered all it read before it
    ended the stream. Any other UNAVAILABLE leaves a message taken unknown."""
    for end, taken in (
        (STOPPING, "false"),
        (Stopped(grpc.StatusCode.UNAVAILABLE), "true"),
    ):
        table, _ = table_of_three()
        failed = wire.ended(table, "s", end, False).failed
        said = {e.waiter: _applied(f) for e, f in failed}
        assert said["a"] == taken, end


def _applied(failure: Exception) -> str:
    """What a message's failure says of whether it may have been applied."""
    assert isinstance(failure, grpc.RpcError)
    return EffectdError.from_rpc_error(failure).metadata[wire.MAY_HAVE_BEEN_APPLIED]


def test_the_failures_of_a_broken_stream_say_what_was_sent() -> None:
    table, _ = table_of_three()
    end = wire.ended(table, "s", Stopped(grpc.StatusCode.UNAVAILABLE), False)
    said = {
        e.waiter: EffectdError.from_rpc_error(f).metadata[wire.MAY_HAVE_BEEN_APPLIED]  # type: ignore[arg-type]
        for e, f in end.failed
    }
    assert said == {"a": "true", "c": "false"}


# How grpc ends a stream that found no connection to the daemon.
NO_CONNECTION = Stopped(
    grpc.StatusCode.UNAVAILABLE,
    "failed to connect to all addresses; last error: UNKNOWN: unix:/x.sock: "
    "connect failed: Connection refused",
)


def test_a_stream_that_never_connected_sent_none_of_its_messages() -> None:
    """Even the message gRPC had taken from the queue fails as not sent, and
    none is sent again at once (a new stream would find no connection
    either): the client waits for the daemon instead."""
    table, _ = table_of_three()
    end = wire.ended(table, "s", NO_CONNECTION, False)
    said = {
        e.waiter: EffectdError.from_rpc_error(f).metadata[wire.MAY_HAVE_BEEN_APPLIED]  # type: ignore[arg-type]
        for e, f in end.failed
    }
    assert said == {"a": "false", "b": "false", "c": "false"}
    assert end.again == []
    assert len(table) == 0


def test_a_stream_broken_otherwise_may_have_applied_what_it_took() -> None:
    """The connection broke under a stream (the daemon killed): what it
    took may have been applied, whatever grpc says of the connection."""
    table, _ = table_of_three()
    reset = Stopped(grpc.StatusCode.UNAVAILABLE, "Stream removed (Socket closed)")
    end = wire.ended(table, "s", reset, False)
    assert [e.waiter for e, _ in end.failed] == ["a", "c"]
    assert wire.never_connected(NO_CONNECTION)
    assert not wire.never_connected(reset)


def test_closing_fails_the_unsent_as_cancelled() -> None:
    table, _ = table_of_three()
    end = wire.ended(table, "s", Stopped(grpc.StatusCode.CANCELLED), True)
    codes = {
        e.waiter: EffectdError.from_rpc_error(f).code  # type: ignore[arg-type]
        for e, f in end.failed
    }
    assert codes == {
        "a": grpc.StatusCode.UNAVAILABLE,
        "b": grpc.StatusCode.CANCELLED,
        "c": grpc.StatusCode.CANCELLED,
    }


@pytest.mark.parametrize(
    ("option", "env", "expected"),
    [
        (None, None, True),
        (None, "1", True),
        (None, "0", False),
        (None, "false", False),
        (None, " OFF ", False),
        (True, "0", True),
        (False, None, False),
        (False, "1", False),
    ],
)
def test_the_option_else_effectd_session_chooses_the_stream(
    monkeypatch: pytest.MonkeyPatch,
    option: bool | None,
    env: str | None,
    expected: bool,
) -> None:
    if env is None:
        monkeypatch.delenv(session_calls.SESSION_ENV, raising=False)
    else:
        monkeypatch.setenv(session_calls.SESSION_ENV, env)
    assert session_calls.wanted(option) is expected


def test_a_client_without_the_option_reads_effectd_session(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(session_calls.SESSION_ENV, "0")
    with Client(f"unix:{tmp_path}/absent.sock") as off:
        assert off._session is None
    monkeypatch.setenv(session_calls.SESSION_ENV, "1")
    with Client(f"unix:{tmp_path}/absent.sock") as on:
        assert on._session is not None
