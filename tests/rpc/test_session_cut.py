"""A session stream its client ends while the daemon still writes the last
answer (the client read it and cancelled before gRPC told the daemon the
write was done) ended between calls: no message was left unanswered
(`Messages.cut` is 0), and the boundary logs it at debug, not as a cut call
at info. The stream is driven with stand-ins for gRPC's context and the
boundary, and the test holds the write, so the order is the test's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from effectd.v1 import ledger_pb2 as pb

from sidecar.rpc.session import Draining, Kind, _Stream

WAIT = 10.0


class Written:
    """gRPC's context, whose write the test holds."""

    def __init__(self) -> None:
        self.writing = asyncio.Event()
        self.done = asyncio.Event()

    async def write(self, response: object) -> None:
        self.writing.set()
        await self.done.wait()


class Answered:
    """The boundary: each message served at once."""

    def __init__(self) -> None:
        self.cut = -1

    async def answer(self, method: str, request: object, run: Any, **_: object) -> Any:
        return await run()


async def _prepared(request: object, context: object) -> pb.PrepareToolResponse:
    return pb.PrepareToolResponse()


async def _one_message() -> AsyncIterator[pb.SessionRequest]:
    yield pb.SessionRequest(id=1, prepare_tool=pb.PrepareToolRequest())
    await asyncio.Event().wait()  # the client never half-closes


def test_a_stream_ended_while_its_last_answer_is_written_left_none_unanswered() -> None:
    context, messages = Written(), Answered()
    kind = Kind(
        "/effectd.v1.ToolLedger/PrepareTool", _prepared, "prepare_tool", "prepare_tool"
    )

    async def run() -> None:
        stream = _Stream(
            {"prepare_tool": kind},
            context,  # type: ignore[arg-type]
            messages,  # type: ignore[arg-type]
            4,
            Draining(),
        )
        serving = asyncio.ensure_future(stream.serve(_one_message()))
        await asyncio.wait_for(context.writing.wait(), WAIT)
        serving.cancel()  # the client ends the stream
        await asyncio.gather(serving, return_exceptions=True)

    asyncio.run(run())
    assert messages.cut == 0
