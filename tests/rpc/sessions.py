"""Helpers for tests of the ledger session stream: send messages on one
stream, read the answers, decode refusals as the unary tests do."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import grpc
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc

from tests.rpc.support import Refusal, decode_status

SESSION = "/effectd.v1.ToolLedger/Session"
Metadata = tuple[tuple[str, str], ...]

# The field of SessionRequest (and of SessionResponse) of each unary RPC.
FIELDS = {
    "PrepareTool": "prepare_tool",
    "PrepareTools": "prepare_tools",
    "StartTool": "start_tool",
    "CommitTool": "commit_tool",
    "ReportUnknown": "report_unknown",
    "Heartbeat": "heartbeat",
    "GetToolCall": "get_tool_call",
}


def message(id: int, request: Any, **fields: Any) -> pb.SessionRequest:
    """A SessionRequest carrying `request` in the field of its type."""
    name = type(request).DESCRIPTOR.name.removesuffix("Request")
    return pb.SessionRequest(id=id, **{FIELDS[name]: request}, **fields)


def exchange(
    channel: grpc.Channel,
    messages: Iterable[pb.SessionRequest],
    metadata: Metadata = (),
    timeout: float = 30,
) -> dict[int, pb.SessionResponse]:
    """Sends `messages` on one stream, half-closes it, and returns every
    answer by id (the stream must end OK)."""
    stub = ledger_pb2_grpc.ToolLedgerStub(channel)
    answers: dict[int, pb.SessionResponse] = {}
    for answer in stub.Session(
        iter(list(messages)), metadata=metadata, timeout=timeout
    ):
        assert answer.id not in answers, f"{answer.id} answered twice"
        answers[answer.id] = answer
    return answers


def answer_of(response: pb.SessionResponse) -> Any:
    """The answer a session response carries, or its refusal."""
    which = response.WhichOneof("response")
    assert which is not None, response
    if which == "error":
        return refusal(response)
    return getattr(response, which)


def refusal(response: pb.SessionResponse) -> Refusal:
    assert response.WhichOneof("response") == "error", response
    return decode_status(response.error)


class SessionRefused(grpc.RpcError):
    """Every message of a stream was refused: the first non-isolating code
    among them (else the first), and all their messages."""

    def __init__(self, refusals: Sequence[Refusal]) -> None:
        super().__init__()
        self.refusals = list(refusals)

    def code(self) -> grpc.StatusCode:
        return self.refusals[0].code

    def details(self) -> str:
        return "; ".join(r.message for r in self.refusals)


def all_refused(
    answers: dict[int, pb.SessionResponse], expected: set[grpc.StatusCode]
) -> list[pb.SessionResponse]:
    """The answers that are not a refusal with one of `expected` codes."""
    return [
        a
        for a in answers.values()
        if a.WhichOneof("response") != "error" or refusal(a).code not in expected
    ]
