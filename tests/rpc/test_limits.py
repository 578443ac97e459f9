"""Transport limits and the rate limit: overload and abuse get clear
refusals while others keep being served (issue: limits; reliability-anchors
§7 "Resource limits")."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.composition import Services
from sidecar.config import ServeConfig, ServerLimits
from sidecar.ledger.quota import Quotas
from sidecar.ledger.rules import Answer, PrepareSpec
from sidecar.server import Daemon
from sidecar.services.ledger import LedgerService
from sidecar.storage.api import Store
from sidecar.testing import running_daemon
from tests.rpc.support import refused


def prepare(call_id: str, namespace: str = "", size: int = 2) -> pb.PrepareToolRequest:
    return pb.PrepareToolRequest(
        ref=pb.CallRef(namespace=namespace, run_id="r", call_id=call_id),
        tool_name="t",
        input=pb.Payload(json='"' + "x" * (size - 2) + '"'),
    )


class HeldLedger(LedgerService):
    """Holds every prepare until the test lets them go."""

    entered = threading.Semaphore(0)
    release: asyncio.Event

    async def prepare(self, spec: PrepareSpec) -> Answer:
        self.entered.release()
        await self.release.wait()
        return await super().prepare(spec)


class HeldDaemon(Daemon):
    ledger: HeldLedger

    def compose(self, store: Store) -> Services:
        services = super().compose(store)
        self.ledger = HeldLedger(
            store, self.seams.clock, self.config.limits, services.policy
        )
        self.ledger.release = asyncio.Event()
        return replace(services, ledger=self.ledger)


def test_an_oversized_message_is_resource_exhausted(short_tmp: Path) -> None:
    limits = ServerLimits(max_message_bytes=64 << 10)
    config = ServeConfig(data_dir=short_tmp / "data", init=True, server_limits=limits)
    with (
        running_daemon(config) as daemon,
        grpc.insecure_channel(daemon.target) as channel,
    ):
        ledger = ledger_pb2_grpc.ToolLedgerStub(channel)
        big = prepare("big", size=65 << 10)
        refusal = refused(lambda: ledger.PrepareTool(big))
        assert refusal.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        # Just under the limit is served.
        assert ledger.PrepareTool(prepare("fits", size=60 << 10)).call.revision == 1


def test_calls_beyond_the_concurrency_limit_are_refused(short_tmp: Path) -> None:
    limits = ServerLimits(max_concurrent_rpcs=2, max_concurrent_rpcs_per_caller=2)
    config = ServeConfig(data_dir=short_tmp / "data", init=True, server_limits=limits)
    daemon = HeldDaemon(config)
    with (
        running_daemon(config, daemon=daemon) as running,
        grpc.insecure_channel(running.target) as channel,
        ThreadPoolExecutor(2) as pool,
    ):
        ledger = ledger_pb2_grpc.ToolLedgerStub(channel)
        held = [pool.submit(ledger.PrepareTool, prepare(f"h{i}")) for i in range(2)]
        for _ in held:
            assert daemon.ledger.entered.acquire(timeout=10)
        refusal = refused(lambda: ledger.PrepareTool(prepare("third"), timeout=10))
        assert refusal.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refusal.reason == "CONCURRENCY_LIMITED"
        running.loop.call_soon_threadsafe(daemon.ledger.release.set)
        assert all(f.result(timeout=10).call.revision == 1 for f in held)
        # Once they finished, calls are served again.
        assert ledger.PrepareTool(prepare("after")).call.revision == 1


def test_a_call_without_a_deadline_gets_the_default_one(short_tmp: Path) -> None:
    limits = ServerLimits(default_deadline_seconds=0.2)
    config = ServeConfig(data_dir=short_tmp / "data", init=True, server_limits=limits)
    daemon = HeldDaemon(config)
    with (
        running_daemon(config, daemon=daemon) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        ledger = ledger_pb2_grpc.ToolLedgerStub(channel)
        refusal = refused(lambda: ledger.PrepareTool(prepare("slow")))
        assert refusal.code is grpc.StatusCode.DEADLINE_EXCEEDED
        running.loop.call_soon_threadsafe(daemon.ledger.release.set)


def test_a_namespace_over_its_rate_is_refused_and_others_are_served(
    short_tmp: Path,
) -> None:
    # One request per 100 s after a burst of 3: the 4th within the test is
    # over the rate whatever the machine's speed.
    quotas = Quotas(requests_per_second=0.01, burst=3)
    config = ServeConfig(data_dir=short_tmp / "data", init=True, quotas=quotas)
    with (
        running_daemon(config) as daemon,
        grpc.insecure_channel(daemon.target) as channel,
    ):
        ledger = ledger_pb2_grpc.ToolLedgerStub(channel)
        for i in range(3):
            ledger.PrepareTool(prepare(f"a{i}", namespace="noisy"))
        refusal = refused(lambda: ledger.PrepareTool(prepare("a3", namespace="noisy")))
        assert refusal.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refusal.reason == "RATE_LIMITED"
        assert refusal.metadata["namespace"] == "noisy"
        # The well-behaved namespace has its own bucket.
        for i in range(3):
            ledger.PrepareTool(prepare(f"b{i}", namespace="quiet"))


def test_the_health_port_serves_only_health(short_tmp: Path) -> None:
    config = replace(
        ServeConfig(data_dir=short_tmp / "data", init=True), health_listen="127.0.0.1:0"
    )
    with running_daemon(config) as running:
        address = running.daemon.health_address
        assert address is not None
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=10).status
            assert status == health_pb2.HealthCheckResponse.SERVING
            ledger = ledger_pb2_grpc.ToolLedgerStub(channel)
            refusal = refused(lambda: ledger.PrepareTool(prepare("c"), timeout=10))
            assert refusal.code is grpc.StatusCode.UNIMPLEMENTED


def test_a_world_writable_data_directory_is_refused(short_tmp: Path) -> None:
    data = short_tmp / "data"
    data.mkdir()
    data.chmod(0o777)
    daemon = Daemon(ServeConfig(data_dir=data, init=True))
    with pytest.raises(ValueError, match="world-writable"):
        asyncio.run(daemon.start())


# -- the HTTP/2 limits, as a raw client sees them ----------------------------

SETTINGS, GOAWAY = 4, 7
MAX_CONCURRENT_STREAMS = 3


def _frames(sock: socket.socket, until: float) -> list[tuple[int, bytes]]:
    """(type, payload) of every HTTP/2 frame the server sends before it
    closes the connection or `until` seconds pass without a byte."""
    sock.settimeout(until)
    data = b""
    with contextlib.suppress(TimeoutError):
        while chunk := sock.recv(4096):
            data += chunk
    frames = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        frames.append((data[3], data[9 : 9 + length]))
        data = data[9 + length :]
    return frames


def _settings(payload: bytes) -> dict[int, int]:
    return {
        int.from_bytes(payload[i : i + 2], "big"): int.from_bytes(
            payload[i + 2 : i + 6], "big"
        )
        for i in range(0, len(payload), 6)
    }


@contextlib.contextmanager
def _raw_connection(short_tmp: Path, handshake: float) -> Iterator[socket.socket]:
    limits = ServerLimits(
        handshake_timeout_seconds=handshake,
        max_concurrent_streams=7,
    )
    config = ServeConfig(
        data_dir=short_tmp / "data",
        init=True,
        listen="127.0.0.1:0",
        server_limits=limits,
    )
    with running_daemon(config) as daemon:
        assert daemon.endpoints.tcp is not None
        host, port = daemon.endpoints.tcp.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            yield sock


def test_a_client_that_never_finishes_the_handshake_is_dropped(
    short_tmp: Path,
) -> None:
    """A connection that sends nothing is told GOAWAY and closed once the
    handshake timeout passes; the server's SETTINGS carry the stream limit."""
    with _raw_connection(short_tmp, handshake=0.2) as sock:
        frames = _frames(sock, until=10)
    settings = [_settings(p) for t, p in frames if t == SETTINGS]
    assert settings[0][MAX_CONCURRENT_STREAMS] == 7
    goaways = [p for t, p in frames if t == GOAWAY]
    assert goaways
    assert b"handshake timeout" in goaways[0]


def test_within_the_handshake_timeout_the_connection_stays(short_tmp: Path) -> None:
    """Control: with a long handshake timeout the same silent connection is
    still open (no GOAWAY) when the client stops listening."""
    with _raw_connection(short_tmp, handshake=60) as sock:
        frames = _frames(sock, until=1.0)
    types = [t for t, _ in frames]
    assert SETTINGS in types
    assert GOAWAY not in types
