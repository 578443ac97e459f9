"""ProviderStream's time to the first event, against a direct httpx stream.

    python bench/provider_stream.py [--iterations 300] [--events 5000]
                                    [--gap-ms 2] [--paths direct,stub,transport]

A fake provider (its own process, an HTTP/1.1 server on 127.0.0.1) answers
every request with a server-sent-events stream whose first event it writes
at once. Two shapes, both measured in the same run:

  trickle  the first event alone, then 4 more `--gap-ms` apart (a model
           streaming tokens): the first event is all there is to read
  burst    the first event, then `--events` - 1 more in one write (5000 in
           all by default): a read brings hundreds of events, which a proxy
           must not parse and forward all before the first one

Paths, on one pooled connection each, measured interleaved (every
iteration runs each path once, in an order that rotates):

  direct     an `httpx.AsyncClient` stream to the fake provider
  stub       effectd's ProviderStream through the generated stub, on the
             Python client's aio channel (a daemon on a Unix socket, its
             own process)
  transport  the client's `AsyncEffectdTransport` under an `httpx.AsyncClient`
             (what an SDK's `http_client=` gets)
  grpc       the floor of a proxy's extra hop: a bare grpc.aio server (its own
             process, no upstream, no effectd) whose ProviderStream answers
             the same stream at once; stub - direct - grpc is effectd's own work

The time to the first event runs from the request to the first event in
the reader's hands; every stream is then read to its end. Printed per
shape and path: the median and p90, the overhead over direct in ms and as
a ratio (of medians and of p90s), and for the burst shape events/s. The
machine is shared and noisy: compare the paths within one run.
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
from typing import Any

import grpc
import httpx
from effectd.v1 import provider_pb2 as pb
from effectd.v1 import provider_pb2_grpc

from effectd_client import AsyncEffectdTransport, Connection

ROOT = Path(__file__).resolve().parents[1]
EVENT = b'data: {"choices":[{"delta":{"content":"hello world, token"}}]}\n\n'
CHUNK = f"{len(EVENT):x}\r\n".encode() + EVENT + b"\r\n"
TRICKLE_EVENTS = 5
SHAPES = ("trickle", "burst")
PATHS = ("direct", "stub", "transport", "grpc")

Stream = Callable[[str], AsyncIterator[object]]


async def fake_provider(events: int, gap: float) -> None:
    """Serves both shapes (`/v1/trickle`, `/v1/burst`) on 127.0.0.1; prints
    its port, serves until stdin closes."""

    # One write: the provider's own CPU should not compete with the paths.
    rest = CHUNK * (events - 1)

    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            for _ in range(1_000_000):
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                size = 0
                for line in lines:
                    if line.lower().startswith("content-length:"):
                        size = int(line.split(":", 1)[1])
                await reader.readexactly(size)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n" + CHUNK
                )
                await writer.drain()
                if "/v1/trickle" in lines[0]:
                    for _ in range(TRICKLE_EVENTS - 1):
                        await asyncio.sleep(gap)
                        writer.write(CHUNK)
                else:
                    writer.write(rest)
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


async def measure(stream: Stream, path: str, least: int) -> tuple[float, float]:
    """(seconds to the first event, events per second) of one stream."""
    start = time.perf_counter()
    first = 0.0
    count = 0
    async for _ in stream(path):
        if count == 0:
            first = time.perf_counter() - start
        count += 1
    total = time.perf_counter() - start
    assert count >= least, f"got {count} of {least} events"
    return first, count / total


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(
    shape: str, ttfe: dict[str, list[float]], rate: dict[str, list[float]]
) -> None:
    base50 = statistics.median(ttfe["direct"])
    base90 = quantile(ttfe["direct"], 0.9)
    print(f"\n{shape}: time to first event (ms), {len(ttfe['direct'])} streams each")
    print(
        f"  {'path':10} {'p50':>7} {'p90':>7} {'+p50':>7} {'+p90':>7}"
        f" {'x p50':>6} {'x p90':>6} {'events/s':>10}"
    )
    for path, values in ttfe.items():
        p50, p90 = statistics.median(values), quantile(values, 0.9)
        print(
            f"  {path:10} {p50 * 1e3:7.2f} {p90 * 1e3:7.2f}"
            f" {(p50 - base50) * 1e3:+7.2f} {(p90 - base90) * 1e3:+7.2f}"
            f" {p50 / base50:6.2f} {p90 / base90:6.2f}"
            f" {statistics.median(rate[path]):10.0f}"
        )
    if "grpc" not in ttfe:
        return
    hop = statistics.median(ttfe["grpc"])
    for path in ("stub", "transport"):
        if path in ttfe:
            own = statistics.median(ttfe[path]) - base50 - hop
            print(
                f"  {path} - direct - grpc (~ effectd's own work): {own * 1e3:+.2f} ms"
            )


async def run(
    base_url: str,
    daemon: Connection,
    bare: Connection,
    *,
    paths: list[str],
    iterations: int,
    events: int,
) -> None:
    channel = daemon.aio_channel()
    stub = provider_pb2_grpc.ProviderStub(channel)
    bare_channel = bare.aio_channel()
    bare_stub = provider_pb2_grpc.ProviderStub(bare_channel)
    transport = AsyncEffectdTransport(daemon, route="bench")
    async with (
        httpx.AsyncClient(trust_env=False, timeout=60) as direct_http,
        httpx.AsyncClient(transport=transport, timeout=60) as effectd_http,
    ):

        async def lines(http: httpx.AsyncClient, url: str) -> AsyncIterator[object]:
            headers = {"accept": "text/event-stream"}
            async with http.stream("POST", url, content=b"{}", headers=headers) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data:"):
                        yield line

        async def direct(path: str) -> AsyncIterator[object]:
            async for line in lines(direct_http, f"{base_url}{path}"):
                yield line

        async def via_transport(path: str) -> AsyncIterator[object]:
            async for line in lines(effectd_http, f"http://effectd{path}"):
                yield line

        async def via_stub(path: str) -> AsyncIterator[object]:
            request = pb.ProviderRequest(route="bench", path=path, body=b"{}")
            async for message in stub.ProviderStream(request, timeout=60):
                for event in message.events:
                    yield event

        async def via_bare(path: str) -> AsyncIterator[object]:
            request = pb.ProviderRequest(route="bench", path=path, body=b"{}")
            async for message in bare_stub.ProviderStream(request, timeout=60):
                for event in message.events:
                    yield event

        streams: dict[str, Stream] = {
            "direct": direct,
            "stub": via_stub,
            "transport": via_transport,
            "grpc": via_bare,
        }
        chosen = [(p, streams[p]) for p in paths]
        print(f"paths: {', '.join(paths)}; iterations: {iterations}")
        for shape in SHAPES:
            path = f"/v1/{shape}"
            least = TRICKLE_EVENTS if shape == "trickle" else events
            rounds = iterations if shape == "trickle" else max(10, iterations // 5)
            for _, stream in chosen:
                await measure(stream, path, least)  # warm-up: connections
            ttfe: dict[str, list[float]] = {p: [] for p in paths}
            rate: dict[str, list[float]] = {p: [] for p in paths}
            for i in range(rounds):
                k = i % len(chosen)
                for name, stream in chosen[k:] + chosen[:k]:
                    first, per_second = await measure(stream, path, least)
                    ttfe[name].append(first)
                    rate[name].append(per_second)
            report(shape, ttfe, rate)
    await channel.close(None)
    await bare_channel.close(None)


class Bare(provider_pb2_grpc.ProviderServicer):
    """ProviderStream without effectd or an upstream: the gRPC hop alone."""

    def __init__(self, events: int, gap: float) -> None:
        self._events = events
        self._gap = gap

    async def ProviderCall(
        self, request: pb.ProviderRequest, context: Any
    ) -> pb.ProviderResponse:
        return pb.ProviderResponse(status=200)

    async def ProviderStream(
        self, request: pb.ProviderRequest, context: Any
    ) -> AsyncIterator[pb.ProviderStreamMessage]:
        event = pb.SseEvent(event="message", data=EVENT[6:-2].decode())
        first = pb.ProviderStreamMessage(events=[event])
        first.head.status = 200
        first.head.headers.add(name="content-type", value="text/event-stream")
        yield first
        if request.path.endswith("/trickle"):
            for _ in range(TRICKLE_EVENTS - 1):
                await asyncio.sleep(self._gap)
                yield pb.ProviderStreamMessage(events=[event])
        else:
            left = self._events - 1
            while left > 0:
                batch = min(left, 1000)
                yield pb.ProviderStreamMessage(events=[event] * batch)
                left -= batch
        yield pb.ProviderStreamMessage(end=pb.StreamEnd(committed=True))


async def bare_server(socket: str, events: int, gap: float) -> None:
    """Serves `Bare` on the Unix socket `socket` until stdin closes."""
    server = grpc.aio.server()
    provider_pb2_grpc.add_ProviderServicer_to_server(Bare(events, gap), server)
    server.add_insecure_port(f"unix:{socket}")
    await server.start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(None)


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--gap-ms", type=float, default=2.0)
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--upstream", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bare", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upstream:
        asyncio.run(fake_provider(args.events, args.gap_ms / 1e3))
        return 0
    if args.bare:
        asyncio.run(bare_server(args.bare, args.events, args.gap_ms / 1e3))
        return 0
    paths = args.paths.split(",")
    if paths[0] != "direct" or not set(paths) <= set(PATHS):
        parser.error(f"--paths: direct first, then any of {', '.join(PATHS[1:])}")
    with tempfile.TemporaryDirectory(prefix="effectd-bench-", dir="/tmp") as tmp:
        shape = ["--events", str(args.events), "--gap-ms", str(args.gap_ms)]
        upstream = _spawn([__file__, "--upstream", *shape])
        bare = _spawn([__file__, "--bare", f"{tmp}/bare.sock", *shape])
        daemon: subprocess.Popen[str] | None = None
        try:
            assert bare.stdout is not None
            assert bare.stdout.readline().strip() == "ready"
            assert upstream.stdout is not None
            base_url = f"http://127.0.0.1:{int(upstream.stdout.readline())}"
            providers = Path(tmp) / "providers.toml"
            providers.write_text(f'[routes.bench]\nbase_url = "{base_url}"\n')
            serve = ["-m", "sidecar", "serve", "--data-dir", f"{tmp}/data", "--init"]
            daemon = _spawn([*serve, "--providers", str(providers)])
            assert daemon.stderr is not None
            for _ in range(1000):
                if "ready" in daemon.stderr.readline():
                    break
            target = Connection(f"unix:{tmp}/data/effectd.sock", token="")
            floor = Connection(f"unix:{tmp}/bare.sock", token="")
            asyncio.run(
                run(
                    base_url,
                    target,
                    floor,
                    paths=paths,
                    iterations=args.iterations,
                    events=args.events,
                )
            )
        finally:
            for proc in (upstream, bare, daemon):
                if proc is None:
                    continue
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.terminate()
                proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
