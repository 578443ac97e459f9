"""ProviderStream against a direct httpx stream to the same local server.

A local server on 127.0.0.1 (its own process) answers every request with a
server-sent-events stream of `--events` events. The baseline reads it with
one httpx client; the measured path is ProviderStream through a daemon on a
Unix socket (its own process: it parses, holds until the first event, and
forwards what each read brought as one gRPC message). Reported: time to
first event and events per second (medians of `--rounds`), each as the ratio
ProviderStream / direct. The machine is shared and noisy: read the ratios,
not the absolute numbers.

    python bench/provider_stream.py [--events 5000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import httpx
from effectd.v1 import provider_pb2 as pb
from effectd.v1 import provider_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
EVENT = b'data: {"choices":[{"delta":{"content":"hello world, token"}}]}\n\n'


async def sse_server(events: int) -> None:
    """An HTTP/1.1 server on 127.0.0.1 streaming `events` events per request;
    prints its port, serves until stdin closes."""

    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        chunk = f"{len(EVENT):x}\r\n".encode() + EVENT + b"\r\n"
        try:
            for _ in range(100_000):
                head = await reader.readuntil(b"\r\n\r\n")
                size = 0
                for line in head.decode("latin-1").split("\r\n"):
                    if line.lower().startswith("content-length:"):
                        size = int(line.split(":", 1)[1])
                await reader.readexactly(size)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                for i in range(events):
                    writer.write(chunk)
                    if i % 64 == 0:
                        await writer.drain()
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    server.close()


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def measure(
    stream: Callable[[], AsyncIterator[object]], events: int
) -> tuple[float, float]:
    """(seconds to the first event, events per second) of one stream."""
    start = time.perf_counter()
    first = 0.0
    count = 0
    async for _ in stream():
        if count == 0:
            first = time.perf_counter() - start
        count += 1
    total = time.perf_counter() - start
    assert count >= events, f"got {count} of {events} events"
    return first, count / total


async def run(base_url: str, target: str, events: int, rounds: int) -> None:
    async with (
        httpx.AsyncClient(trust_env=False) as http,
        grpc.aio.insecure_channel(target) as channel,
    ):
        stub = provider_pb2_grpc.ProviderStub(channel)
        request = pb.ProviderRequest(route="bench", path="/v1/stream", body=b"{}")

        async def direct() -> AsyncIterator[object]:
            async with http.stream("POST", f"{base_url}/v1/stream", content=b"{}") as r:
                async for line in r.aiter_lines():
                    if line.startswith("data:"):
                        yield line

        async def proxied() -> AsyncIterator[object]:
            async for message in stub.ProviderStream(request, timeout=60):
                for event in message.events:
                    yield event

        results: dict[str, list[tuple[float, float]]] = {"direct": [], "proxied": []}
        for fn in (direct, proxied):
            await measure(fn, events)  # warm-up: connections, caches
        for _ in range(rounds):
            for name, fn in (("direct", direct), ("proxied", proxied)):
                results[name].append(await measure(fn, events))
    ttfe = {k: statistics.median(f for f, _ in v) for k, v in results.items()}
    rate = {k: statistics.median(r for _, r in v) for k, v in results.items()}
    print(f"events per stream: {events}, rounds: {rounds}")
    for name in ("direct", "proxied"):
        print(
            f"{name:8} time to first event {ttfe[name] * 1e3:8.2f} ms   "
            f"{rate[name]:10.0f} events/s"
        )
    print(
        f"ratio time to first event (ProviderStream / direct): "
        f"{ttfe['proxied'] / ttfe['direct']:.2f}"
    )
    print(
        f"ratio events/s (ProviderStream / direct): "
        f"{rate['proxied'] / rate['direct']:.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--upstream", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upstream:
        asyncio.run(sse_server(args.events))
        return 0
    with tempfile.TemporaryDirectory(prefix="effectd-bench-", dir="/tmp") as tmp:
        upstream = _spawn([__file__, "--upstream", "--events", str(args.events)])
        daemon: subprocess.Popen[str] | None = None
        try:
            assert upstream.stdout is not None
            base_url = f"http://127.0.0.1:{int(upstream.stdout.readline())}"
            providers = Path(tmp) / "providers.toml"
            providers.write_text(f'[routes.bench]\nbase_url = "{base_url}"\n')
            daemon = _spawn(
                [
                    "-m",
                    "sidecar",
                    "serve",
                    "--data-dir",
                    f"{tmp}/data",
                    "--providers",
                    str(providers),
                ]
            )
            assert daemon.stderr is not None
            for _ in range(1000):
                if "ready" in daemon.stderr.readline():
                    break
            target = f"unix:{tmp}/data/effectd.sock"
            asyncio.run(run(base_url, target, args.events, args.rounds))
        finally:
            for proc in (upstream, daemon):
                if proc is None:
                    continue
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.terminate()
                proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
