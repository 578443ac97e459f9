"""Callers of the effectd side of `bench/versus_dbos.py`: the safe call's
lifecycle over the daemon's Unix socket, PrepareTool(start) then, when the
ledger says EXECUTE, the tool's body, then CommitTool(acknowledge) with its
result; a duplicate is the same PrepareTool again, answered RETURN_RESULT
from the ledger.

    python effectd_caller.py TARGET CALLERS PHASE PREFIX FIRST COUNT [unary|client]

`CALLERS` callers each take COUNT keys from FIRST on (caller c: FIRST + c *
COUNT ...). `unary` (the default): tasks of one grpc.aio channel, a unary
call each; `client`: threads of the Python client's sync `Client` on its
defaults (the framed transport of a daemon on this host, else the session
stream), as an agent calls effectd. Prints "ready" once connected and warmed up, waits
for a line on stdin, runs the phase and prints one JSON line as
`bench/dbos_caller.py` does.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
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
    _report(phase, keys, latencies, (began, ended), ran=ran, wrong=wrong)


def _report(
    phase: str,
    keys: list[str],
    latencies: list[int],
    span: tuple[float, float],
    *,
    ran: dict[str, int],
    wrong: list[str],
) -> None:
    """The phase's one JSON line, as `bench/dbos_caller.py` prints it."""
    report = {
        "phase": phase,
        "latencies": latencies,
        "began": span[0],
        "ended": span[1],
        "bodies": {k: ran.get(k, 0) for k in keys},
        "wrong": wrong,
    }
    print(json.dumps(report), flush=True)


def _client_main(
    target: str, callers: int, *, phase: str, prefix: str, first: int, count: int
) -> None:
    from effectd_client import Client, Decision  # noqa: PLC0415

    ran: dict[str, int] = {}
    wrong: list[str] = []
    lock = threading.Lock()
    with Client(target) as client:

        def call(key: str) -> None:
            run, call_id = key.rsplit("-", 1)
            got = client.prepare_tool(run, call_id, "t", {"a": 1}, start=True)
            if got.decision is Decision.EXECUTE:
                with lock:
                    ran[key] = ran.get(key, 0) + 1
                attempt = got.call.attempt
                client.commit_tool(run, call_id, attempt, key, acknowledge=True)
            elif (
                got.decision is not Decision.RETURN_RESULT
                or got.call.result is None
                or got.call.result.value != key
            ):
                with lock:
                    wrong.append(key)

        for i in range(5):
            call(f"{prefix}w{first}-{i}")
        print("ready", flush=True)
        sys.stdin.readline()
        latencies: list[int] = []

        def caller(c: int) -> None:
            for i in range(first + c * count, first + (c + 1) * count):
                start = time.perf_counter_ns()
                call(f"{prefix}-{i}")
                latencies.append(time.perf_counter_ns() - start)

        threads = [threading.Thread(target=caller, args=(c,)) for c in range(callers)]
        began = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ended = time.time()
    keys = [f"{prefix}-{i}" for i in range(first, first + callers * count)]
    _report(phase, keys, latencies, (began, ended), ran=ran, wrong=wrong)


def main() -> int:
    target, callers, phase, prefix, first, count = sys.argv[1:7]
    how = sys.argv[7] if len(sys.argv) > 7 else "unary"
    n, start, keys = int(callers), int(first), int(count)
    if how == "client":
        _client_main(target, n, phase=phase, prefix=prefix, first=start, count=keys)
    else:
        coro = _main(target, n, phase=phase, prefix=prefix, first=start, count=keys)
        asyncio.run(coro)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
