"""Callers of the effectd side of `bench/versus_dbos.py`: the safe call's
lifecycle over the daemon's Unix socket, PrepareTool(start) then, when the
ledger says EXECUTE, the tool's body, then CommitTool(acknowledge) with its
result; a duplicate is the same PrepareTool again, answered RETURN_RESULT
from the ledger.

    python effectd_caller.py TARGET CALLERS PHASE PREFIX FIRST COUNT

`CALLERS` callers (tasks) each take COUNT keys from FIRST on (caller c:
FIRST + c * COUNT ...). Prints "ready" once connected and warmed up, waits
for a line on stdin, runs the phase and prints one JSON line as
`bench/dbos_caller.py` does.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import grpc
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc


async def _call(stub: Any, key: str, ran: dict[str, int], wrong: list[str]) -> None:
    run, call = key.rsplit("-", 1)
    ref = pb.CallRef(run_id=run, call_id=call)
    answer = await stub.PrepareTool(
        pb.PrepareToolRequest(
            ref=ref, tool_name="t", input=pb.Payload(json='{"a":1}'), start=True
        )
    )
    if answer.decision == pb.DECISION_EXECUTE:
        ran[key] = ran.get(key, 0) + 1
        result = pb.ToolResult(
            outcome=pb.OUTCOME_OK, payload=pb.Payload(json=json.dumps(key))
        )
        await stub.CommitTool(
            pb.CommitToolRequest(
                ref=ref,
                attempt=answer.call.attempt,
                result=result,
                acknowledge=True,
            )
        )
    elif (
        answer.decision != pb.DECISION_RETURN_RESULT
        or answer.call.result.payload.json != json.dumps(key)
    ):
        wrong.append(key)


async def _main(
    target: str, callers: int, *, phase: str, prefix: str, first: int, count: int
) -> None:
    ran: dict[str, int] = {}
    wrong: list[str] = []
    async with grpc.aio.insecure_channel(target) as channel:
        await channel.channel_ready()
        stub = ledger_pb2_grpc.ToolLedgerStub(channel)
        # Keys of its own (from FIRST): callers of several processes warming
        # up on the same keys would race on them, as no measured call does.
        for i in range(5):
            await _call(stub, f"{prefix}w{first}-{i}", {}, [])
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        latencies: list[int] = []

        async def caller(c: int) -> None:
            for i in range(first + c * count, first + (c + 1) * count):
                start = time.perf_counter_ns()
                await _call(stub, f"{prefix}-{i}", ran, wrong)
                latencies.append(time.perf_counter_ns() - start)

        began = time.time()
        await asyncio.gather(*(caller(c) for c in range(callers)))
        ended = time.time()
    keys = [f"{prefix}-{i}" for i in range(first, first + callers * count)]
    print(
        json.dumps(
            {
                "phase": phase,
                "latencies": latencies,
                "began": began,
                "ended": ended,
                "bodies": {k: ran.get(k, 0) for k in keys},
                "wrong": wrong,
            }
        ),
        flush=True,
    )


def main() -> int:
    target, callers, phase, prefix, first, count = sys.argv[1:7]
    asyncio.run(
        _main(
            target,
            int(callers),
            phase=phase,
            prefix=prefix,
            first=int(first),
            count=int(count),
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
