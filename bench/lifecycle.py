"""Full tool-call lifecycle against a plain gRPC echo, measured in one run.

One lifecycle is PrepareTool(start=True) + CommitTool over the Unix socket,
durable (fsync on every commit, the daemon's default). The baseline is a
plain grpc.aio echo server answering the same two round trips with no work.
Both servers are separate processes; the load comes from a third, with 1 and
32 calls in flight. A second daemon with authentication on (a bearer token
on every call) and metrics served measures what the gate costs (token check,
metrics, the access log line) against the first. The machine is shared and
noisy: read the ratios, not the absolute numbers.

    python bench/lifecycle.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
ECHO = "/bench.Echo/Echo"
TOKEN = "bench-token-0123456789abcdef"  # noqa: S105 (a made-up token)
TOKENS = f"""
[[token]]
name = "bench"
secret = "{TOKEN}"
roles = ["agent"]
namespaces = ["default"]
"""


async def echo_server(address: str) -> None:
    """A grpc.aio server that returns each request as its reply."""

    async def echo(request: bytes, _: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request

    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(echo)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("bench.Echo", {"Echo": handler}),)
    )
    server.add_insecure_port(address)
    await server.start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(0)


Op = Callable[[int], Awaitable[None]]


async def measure(op: Op, in_flight: int, seconds: float) -> dict[str, float]:
    """Runs `op` from `in_flight` tasks for `seconds` after a short warm-up."""
    latencies: list[int] = []
    counter = iter(range(1 << 62))
    deadline = 0.0
    warm = time.monotonic() + min(0.5, seconds / 4)

    async def loop() -> None:
        while (now := time.monotonic()) < deadline or deadline == 0.0:
            start = time.perf_counter_ns()
            await op(next(counter))
            if now >= warm:
                latencies.append(time.perf_counter_ns() - start)

    deadline = warm + seconds
    began = time.monotonic()
    await asyncio.gather(*(loop() for _ in range(in_flight)))
    elapsed = time.monotonic() - max(began, warm)
    latencies.sort()

    def pct(q: float) -> float:
        if not latencies:  # nothing finished in time (a loaded machine)
            return float("nan")
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] / 1e6

    return {"ops_s": len(latencies) / elapsed, "p50_ms": pct(0.5), "p99_ms": pct(0.99)}


async def client(kind: str, target: str, in_flight: int, seconds: float) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        await channel.channel_ready()
        run = f"bench-{os.getpid()}-{in_flight}"
        if kind == "echo":
            call = channel.unary_unary(ECHO, None, None)
            body = pb.PrepareToolRequest(
                ref=pb.CallRef(run_id=run, call_id="c"),
                tool_name="t",
                input=pb.Payload(json='{"a":1}'),
            ).SerializeToString()

            async def op(i: int) -> None:
                await call(body)
                await call(body)

        else:
            stub = ledger_pb2_grpc.ToolLedgerStub(channel)
            md = (("authorization", f"Bearer {TOKEN}"),) if kind == "auth" else ()

            async def op(i: int) -> None:
                ref = pb.CallRef(run_id=run, call_id=str(i))
                started = await stub.PrepareTool(
                    pb.PrepareToolRequest(
                        ref=ref,
                        tool_name="t",
                        input=pb.Payload(json='{"a":1}'),
                        start=True,
                    ),
                    metadata=md,
                )
                result = pb.ToolResult(
                    outcome=pb.OUTCOME_OK, payload=pb.Payload(json="{}")
                )
                await stub.CommitTool(
                    pb.CommitToolRequest(
                        ref=ref, attempt=started.call.attempt, result=result
                    ),
                    metadata=md,
                )

        print(json.dumps(await measure(op, in_flight, seconds)), flush=True)


def _spawn(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def _daemon(
    data_dir: str, *flags: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """A daemon, once it is ready; its log (one access line per call) is
    drained in a thread so a full pipe never stalls it."""
    serve = ["-m", "sidecar", "serve", "--data-dir", data_dir, "--init"]
    proc = _spawn([*serve, *flags], env)
    assert proc.stderr is not None
    while "ready" not in proc.stderr.readline():
        if proc.poll() is not None:
            raise RuntimeError("the daemon did not start")
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc


def _load(kind: str, target: str, in_flight: int, seconds: float) -> dict[str, float]:
    proc = _spawn([__file__, "--client", kind, target, str(in_flight), str(seconds)])
    out, err = proc.communicate(timeout=seconds * 4 + 60)
    if proc.returncode != 0:
        raise RuntimeError(err)
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def _row(*cells: object) -> None:
    n, name, *numbers = cells
    print(f"{n!s:>9} {name!s:<22}" + "".join(f"{x!s:>10}" for x in numbers))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--client", nargs=4, metavar=("KIND", "TARGET", "N", "S"))
    parser.add_argument("--echo-server", metavar="ADDRESS")
    args = parser.parse_args()
    if args.echo_server:
        asyncio.run(echo_server(args.echo_server))
        return 0
    if args.client:
        kind, target, n, s = args.client
        asyncio.run(client(kind, target, int(n), float(s)))
        return 0

    with tempfile.TemporaryDirectory(prefix="effectd-bench-", dir="/tmp") as tmp:
        echo_target = f"unix:{tmp}/echo.sock"
        echo = _spawn([__file__, "--echo-server", echo_target])
        procs = [echo]
        try:
            assert echo.stdout is not None
            echo.stdout.readline()
            procs.append(_daemon(f"{tmp}/data"))
            procs.append(
                _daemon(
                    f"{tmp}/auth",
                    "--metrics-listen",
                    "127.0.0.1:0",
                    env={"EFFECTD_TOKENS": TOKENS},
                )
            )
            target = f"unix:{tmp}/data/effectd.sock"
            auth_target = f"unix:{tmp}/auth/effectd.sock"
            print(f"effectd lifecycle bench: {args.seconds:g} s a point, durable")
            _row("in flight", "what", "ops/s", "p50 ms", "p99 ms")
            keys = ("ops_s", "p50_ms", "p99_ms")
            for n in (1, 32):
                base = _load("echo", echo_target, n, args.seconds)
                life = _load("lifecycle", target, n, args.seconds)
                auth = _load("auth", auth_target, n, args.seconds)
                for name, r in (
                    ("echo x2 (baseline)", base),
                    ("lifecycle", life),
                    ("lifecycle, auth+metrics", auth),
                ):
                    _row(n, name, *(f"{r[k]:.2f}" for k in keys))
                _row(
                    n,
                    "ratio lifecycle/echo",
                    *(f"{life[k] / base[k]:.2f}" for k in keys),
                )
                _row(
                    n, "ratio auth/no auth", *(f"{auth[k] / life[k]:.2f}" for k in keys)
                )
        finally:
            for proc in procs:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.terminate()
                proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
