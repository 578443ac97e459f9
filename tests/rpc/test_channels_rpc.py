"""The call's channel through the real server (ADR-010 D5, D6): recorded by
PrepareTool, shown on the record, part of the identity, and its retry rules
decide StartTool(retry) and DecideRetry about the call alike."""

from __future__ import annotations

import grpc
import pytest
from effectd.v1 import errors_pb2, retry_pb2_grpc
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import retry_pb2 as ypb
from effectd.v1.ledger_pb2_grpc import ToolLedgerStub

from effectd_client import Channel, Client, Effect, McpNoReplay
from tests.rpc.support import expect_refusal, prepare_request, ref, refused

PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


def _prepare(
    channel: pb.CallChannel.ValueType, effect: pb.Effect.ValueType = pb.EFFECT_READ
) -> pb.PrepareToolRequest:
    request = prepare_request(effect=effect, start=True)
    request.channel = channel
    return request


def test_unspecified_is_a_tool_call(ledger_stub: ToolLedgerStub) -> None:
    """A prepare that names no channel records TOOL."""
    answer = ledger_stub.PrepareTool(_prepare(pb.CALL_CHANNEL_UNSPECIFIED), timeout=5)
    assert answer.call.channel == pb.CALL_CHANNEL_TOOL
    again = ledger_stub.PrepareTool(_prepare(pb.CALL_CHANNEL_TOOL), timeout=5)
    assert again.decision == pb.DECISION_IN_PROGRESS


def test_an_mcp_call_of_unknown_outcome_is_never_started_again(
    ledger_stub: ToolLedgerStub, channel: grpc.Channel
) -> None:
    """An MCP READ reported unknown: StartTool(retry) and PrepareTool(start,
    retry) are FAILED_PRECONDITION MCP_NO_REPLAY, and DecideRetry about the
    call denies it whatever context it names (issue 10 item 11: fails before
    the fix: StartTool(retry) started attempt 2 as a plain tool call)."""
    ledger_stub.PrepareTool(_prepare(pb.CALL_CHANNEL_MCP), timeout=5)
    call = ledger_stub.ReportUnknown(
        pb.ReportUnknownRequest(ref=ref(), attempt=1, reason="transport"), timeout=5
    ).call
    assert call.channel == pb.CALL_CHANNEL_MCP
    expect_refusal(
        lambda: ledger_stub.StartTool(
            pb.StartToolRequest(ref=ref(), retry=True), timeout=5
        ),
        PRECONDITION,
        "MCP_NO_REPLAY",
    )
    retry = _prepare(pb.CALL_CHANNEL_MCP)
    retry.retry = True
    expect_refusal(
        lambda: ledger_stub.PrepareTool(retry, timeout=5),
        PRECONDITION,
        "MCP_NO_REPLAY",
    )
    decided = retry_pb2_grpc.RetryPolicyStub(channel).DecideRetry(
        ypb.DecideRetryRequest(call=ref(), context=ypb.RETRY_CONTEXT_TOOL), timeout=5
    )
    assert not decided.allow
    assert errors_pb2.ErrorReason.Name(decided.reason) == "MCP_NO_REPLAY"


def test_another_channel_on_a_repeat_is_input_mismatch(
    ledger_stub: ToolLedgerStub,
) -> None:
    """The channel is part of the identity check on a repeat prepare."""
    ledger_stub.PrepareTool(_prepare(pb.CALL_CHANNEL_MCP), timeout=5)
    got = expect_refusal(
        lambda: ledger_stub.PrepareTool(_prepare(pb.CALL_CHANNEL_TOOL), timeout=5),
        PRECONDITION,
        "INPUT_MISMATCH",
    )
    assert "MCP" in (got.message or "")


def test_an_unknown_channel_is_invalid(ledger_stub: ToolLedgerStub) -> None:
    """A channel value the protos do not define is INVALID_ARGUMENT naming it."""
    got = refused(lambda: ledger_stub.PrepareTool(_prepare(99), timeout=5))  # type: ignore[arg-type]
    assert got.code is grpc.StatusCode.INVALID_ARGUMENT
    assert got.fields == ("channel",)


@pytest.mark.parametrize("channel", list(Channel))
def test_the_python_client_sends_and_reads_the_channel(
    client: Client, channel: Channel
) -> None:
    """Client.prepare_tool(channel=...) records it; the record shows it; an
    MCP call of unknown outcome is refused a retry (McpNoReplay)."""
    p = client.prepare_tool(
        "run",
        channel.name,
        "lookup",
        {},
        effect=Effect.READ,
        start=True,
        channel=channel,
    )
    assert p.call.channel is channel
    client.report_unknown("run", channel.name, 1, "reset")
    if channel is Channel.MCP:
        with pytest.raises(McpNoReplay):
            client.start_tool("run", channel.name, retry=True)
    else:
        assert client.start_tool("run", channel.name, retry=True).attempt_held


@pytest.mark.parametrize(
    ("recorded", "effect", "asked", "reason"),
    [
        # ADR-010 D5: the attempt failed over MCP, whatever the record says.
        (pb.CALL_CHANNEL_DURABLE_BACKGROUND, pb.EFFECT_READ, "MCP", "MCP_NO_REPLAY"),
        (pb.CALL_CHANNEL_CHILD_FOREGROUND, pb.EFFECT_READ, "MCP", "MCP_NO_REPLAY"),
        # ADR-010 R5: a whole run is retried only when read-only.
        (
            pb.CALL_CHANNEL_CHILD_FOREGROUND,
            pb.EFFECT_IDEMPOTENT_WRITE,
            "RUN",
            "RUN_NOT_READ_ONLY",
        ),
    ],
)
def test_the_context_asked_about_a_call_still_applies_beside_its_channel(  # noqa: PLR0917 - fixtures and columns
    ledger_stub: ToolLedgerStub,
    channel: grpc.Channel,
    recorded: pb.CallChannel.ValueType,
    effect: pb.Effect.ValueType,
    asked: str,
    reason: str,
) -> None:
    """DecideRetry about a call of another channel than TOOL applies the
    rules of both the context asked and the call's channel: the first denial
    wins. Fails before the fix: the recorded channel replaced the context
    asked, so an MCP transport failure (or a whole run) was allowed a retry
    (found by the model-based torture test, issue 15)."""
    ledger_stub.PrepareTool(_prepare(recorded, effect), timeout=5)
    ledger_stub.ReportUnknown(
        pb.ReportUnknownRequest(ref=ref(), attempt=1, reason="lost"), timeout=5
    )
    decided = retry_pb2_grpc.RetryPolicyStub(channel).DecideRetry(
        ypb.DecideRetryRequest(
            call=ref(),
            context=ypb.RetryContext.Value("RETRY_CONTEXT_" + asked),
            error=ypb.AttemptError(kind=ypb.FAILURE_KIND_TRANSPORT),
        ),
        timeout=5,
    )
    assert not decided.allow
    assert errors_pb2.ErrorReason.Name(decided.reason) == reason
