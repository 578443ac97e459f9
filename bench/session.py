"""The tool-call lifecycle over unary RPCs against the session stream, in one
run (issue 12 item 1).

One lifecycle is PrepareTool(start=True) + CommitTool, durable (fsync on
every commit, the daemon's default), over the Unix socket of one daemon
process. The unary client calls the two RPCs; the session client sends the
same two requests as messages of one `ToolLedger.Session` stream (one
writer, one reader that hands each answer to the lifecycle waiting for it
by id). Each load is a process of its own, with 1 and 32 lifecycles in
flight; the two kinds alternate, `--rounds` times, and each ratio is taken
round by round (both sides saw the same moment of the machine), its median
printed. Beside the rate, the daemon's CPU time per lifecycle (user +
system, from /proc, over every lifecycle of the load, warm-up included):
what the stream saves the daemon, which a busy machine disturbs less than
the rate. The machine is shared and noisy: read the ratios.

    python bench/session.py [--seconds 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import grpc
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc
from lifecycle import _daemon, _row, _spawn, measure

KINDS = ("unary", "session")


class Session:
    """One session stream shared by every lifecycle of the client: writes
    go out one at a time, and the reader resolves each answer's future."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        session: Any = ledger_pb2_grpc.ToolLedgerStub(channel).Session
        self._call: Any = session()
        self._waiting: dict[int, asyncio.Future[pb.SessionResponse]] = {}
        self._writing = asyncio.Lock()
        self._ids = iter(range(1, 1 << 62))
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            answer = await self._call.read()
            if not isinstance(answer, pb.SessionResponse):
                return  # EOF: the stream ended
            self._waiting.pop(answer.id).set_result(answer)

    async def ask(self, **request: Any) -> pb.SessionResponse:
        id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._waiting[id] = future
        async with self._writing:
            await self._call.write(pb.SessionRequest(id=id, **request))
        answer: pb.SessionResponse = await future
        if answer.WhichOneof("response") == "error":
            raise RuntimeError(f"refused: {answer.error}")
        return answer

    async def close(self) -> None:
        await self._call.done_writing()
        await self._reader


async def client(kind: str, target: str, in_flight: int, seconds: float) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        await channel.channel_ready()
        run = f"bench-{kind}-{os.getpid()}-{in_flight}"
        result = pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json="{}"))

        def started(i: int) -> pb.PrepareToolRequest:
            return pb.PrepareToolRequest(
                ref=pb.CallRef(run_id=run, call_id=str(i)),
                tool_name="t",
                input=pb.Payload(json='{"a":1}'),
                start=True,
            )

        def commit(i: int, attempt: int) -> pb.CommitToolRequest:
            ref = pb.CallRef(run_id=run, call_id=str(i))
            return pb.CommitToolRequest(ref=ref, attempt=attempt, result=result)

        done = 0
        if kind == "unary":
            stub = ledger_pb2_grpc.ToolLedgerStub(channel)

            async def op(i: int) -> None:
                nonlocal done
                answer = await stub.PrepareTool(started(i))
                await stub.CommitTool(commit(i, answer.call.attempt))
                done += 1

            got = await measure(op, in_flight, seconds)
        else:
            session = Session(channel)

            async def op_in_session(i: int) -> None:
                nonlocal done
                answer = await session.ask(prepare_tool=started(i))
                attempt = answer.prepare_tool.call.attempt
                await session.ask(commit_tool=commit(i, attempt))
                done += 1

            got = await measure(op_in_session, in_flight, seconds)
            await session.close()
        print(json.dumps({**got, "ops": done}), flush=True)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load(
    kind: str, target: str, in_flight: int, seconds: float, daemon: int
) -> dict[str, float]:
    """One load's rate and latencies, and the daemon's CPU ms per op."""
    before = _cpu_seconds(daemon)
    proc = _spawn([__file__, "--client", kind, target, str(in_flight), str(seconds)])
    out, err = proc.communicate(timeout=seconds * 4 + 60)
    if proc.returncode != 0:
        raise RuntimeError(err)
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    result["cpu_ms"] = (_cpu_seconds(daemon) - before) * 1000 / result.pop("ops")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--client", nargs=4, metavar=("KIND", "TARGET", "N", "S"))
    args = parser.parse_args()
    if args.client:
        kind, target, n, s = args.client
        asyncio.run(client(kind, target, int(n), float(s)))
        return 0

    with tempfile.TemporaryDirectory(prefix="effectd-bench-", dir="/tmp") as tmp:
        daemon = _daemon(f"{tmp}/data")
        try:
            target = f"unix:{tmp}/data/effectd.sock"
            print(
                f"effectd session bench: {args.seconds:g} s a point, "
                f"{args.rounds} rounds, durable"
            )
            _row("in flight", "what", "ops/s", "p50 ms", "p99 ms", "cpu ms/op")
            keys = ("ops_s", "p50_ms", "p99_ms", "cpu_ms")
            for n in (1, 32):
                got: dict[str, list[dict[str, float]]] = {k: [] for k in KINDS}
                for r in range(args.rounds):
                    # Alternate which kind goes first in a round.
                    for kind in KINDS if r % 2 == 0 else KINDS[::-1]:
                        got[kind].append(
                            _load(kind, target, n, args.seconds, daemon.pid)
                        )
                for kind in KINDS:
                    medians = [statistics.median(x[k] for x in got[kind]) for k in keys]
                    _row(n, f"lifecycle, {kind}", *(f"{m:.2f}" for m in medians))
                ratios = [
                    statistics.median(
                        s[k] / u[k]
                        for u, s in zip(got["unary"], got["session"], strict=True)
                    )
                    for k in keys
                ]
                _row(n, "ratio session/unary", *(f"{x:.2f}" for x in ratios))
        finally:
            if daemon.stdin is not None:
                daemon.stdin.close()
            daemon.terminate()
            daemon.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
