"""The daemon's lifecycle: health, reflection, private socket, loopback-only
TCP, graceful shutdown that lets in-flight calls finish."""

from __future__ import annotations

import asyncio
import stat
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from effectd_client import Client, Decision, EffectdError
from sidecar.config import ConfigError, ServeConfig
from sidecar.policy_file import PolicyError
from sidecar.provider.routes import ProvidersError
from sidecar.rpc import summaries
from sidecar.server import Daemon
from sidecar.storage.api import Store, WriteView
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore, _Item
from sidecar.testing import RunningDaemon, running_daemon
from tests.support.events import health_changes


def _health(target: str, service: str = "") -> int:
    with grpc.insecure_channel(target) as ch:
        reply = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
    status: int = reply.status
    return status


@pytest.mark.parametrize(
    "service", ["", "effectd.v1.ToolLedger", "effectd.v1.Checkpoints"]
)
def test_health_is_serving(daemon: RunningDaemon, service: str) -> None:
    """Standard gRPC health answers SERVING for the server and each service."""
    assert _health(daemon.target, service) == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_services(daemon: RunningDaemon) -> None:
    """Reflection lets grpcurl and friends work without the .proto files."""
    with grpc.insecure_channel(daemon.target) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        reply = next(iter(stub.ServerReflectionInfo(iter([request]), timeout=5)))
    names = {s.name for s in reply.list_services_response.service}
    assert {"effectd.v1.ToolLedger", "effectd.v1.Checkpoints"} <= names


def test_socket_is_private(daemon: RunningDaemon, config: ServeConfig) -> None:
    """The Unix socket is 0600 in a 0700 directory."""
    assert stat.S_IMODE(config.socket_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(config.data_dir.stat().st_mode) == 0o700


@pytest.mark.parametrize(
    ("setting", "refusal"),
    [
        ("tokens_file", ConfigError),
        ("policy_file", PolicyError),
        ("providers_file", ProvidersError),
    ],
)
def test_constructing_a_daemon_reads_no_file(
    short_tmp: Path, setting: str, refusal: type[Exception]
) -> None:
    """Construction does no I/O: a tokens, policy or routes file that does not
    exist is found by `start`, which leaves nothing held behind (issue 11
    item 6: fails before the fix: the constructor read each file)."""
    missing = short_tmp / "missing"
    data = short_tmp / "data"
    config = ServeConfig(data_dir=data, init=True, **{setting: missing})  # type: ignore[arg-type]
    daemon = Daemon(config)
    with pytest.raises(refusal, match="missing"):
        asyncio.run(daemon.start())
    with running_daemon(ServeConfig(data_dir=config.data_dir, init=True)):
        pass


def test_tcp_listener_on_loopback(short_tmp: Path) -> None:
    """--listen 127.0.0.1:0 serves the same API on a free loopback port."""
    cfg = ServeConfig(data_dir=short_tmp / "data", init=True, listen="127.0.0.1:0")
    with running_daemon(cfg) as d:
        assert d.endpoints.tcp is not None
        with Client(d.endpoints.tcp) as c:
            assert c.prepare_tool("r", "c", "t", {}).decision is Decision.EXECUTE


def test_tcp_port_is_not_shared(short_tmp: Path) -> None:
    """A second daemon on a taken port fails (no silent SO_REUSEPORT sharing)."""
    first = ServeConfig(data_dir=short_tmp / "a", init=True, listen="127.0.0.1:0")
    with running_daemon(first) as d:
        assert d.endpoints.tcp is not None
        port = d.endpoints.tcp.rsplit(":", 1)[1]
        second = ServeConfig(
            data_dir=short_tmp / "b", init=True, listen=f"127.0.0.1:{port}"
        )
        with pytest.raises(RuntimeError), running_daemon(second):
            pass


@pytest.mark.parametrize(
    ("listen", "message"),
    [
        ("0.0.0.0:50051", "not a loopback"),
        ("10.0.0.1:50051", "not a loopback"),
        ("example.com:1", "not a loopback"),
        ("127.0.0.1", "HOST:PORT"),
        ("127.0.0.1:99999", "HOST:PORT"),
    ],
)
def test_listen_must_be_loopback(short_tmp: Path, listen: str, message: str) -> None:
    """Without authentication, TCP is served on loopback only."""
    with pytest.raises(ConfigError, match=message):
        ServeConfig(data_dir=short_tmp, listen=listen).validate()


def test_socket_path_length_is_checked(short_tmp: Path) -> None:
    """A socket path longer than the kernel allows fails with a clear message."""
    with pytest.raises(ConfigError, match="longer than 107"):
        ServeConfig(data_dir=short_tmp / ("d" * 120)).validate()


T = TypeVar("T")


class _HeldStore(LmdbStore):
    """Once armed, holds each commit until the test releases it."""

    def __init__(self, path: Path, options: LmdbOptions) -> None:
        self.armed = False
        self.holding = threading.Event()
        self.release = threading.Event()
        super().__init__(path, options)  # starts the writer

    async def write(self, fn: Callable[[WriteView], T]) -> T:
        # Through the writer thread: a commit held on the loop would hold
        # the loop itself, and the stop could not begin while it waits.
        return await asyncio.wrap_future(self.submit(fn))

    def _commit(self, batch: list[_Item]) -> None:
        if self.armed:
            self.holding.set()
            self.release.wait(30)
        super()._commit(batch)


class _HeldDaemon(Daemon):
    held: _HeldStore

    def open_store(self) -> Store:
        self.held = _HeldStore(
            self.config.data_dir, LmdbOptions(summarize=summaries.summarize)
        )
        return self.held


@pytest.mark.slow
def test_graceful_stop_finishes_in_flight_calls(short_tmp: Path) -> None:
    """On stop, health turns NOT_SERVING and a call in flight still completes."""
    cfg = ServeConfig(data_dir=short_tmp / "data", init=True, grace_seconds=10)
    daemon = _HeldDaemon(cfg)
    # The late call is refused at once: its client does not wait for the
    # daemon to come back (`reconnect_wait`), which it never will.
    with (
        running_daemon(cfg, daemon=daemon) as d,
        Client(d.target, reconnect_wait=0) as c,
    ):
        answer: Future[Decision] = Future()

        def call() -> None:
            answer.set_result(c.prepare_tool("r", "in-flight", "t", {}).decision)

        daemon.held.armed = True
        threading.Thread(target=call).start()
        assert daemon.held.holding.wait(10)  # the prepare waits on its commit
        with health_changes(d.target) as health:
            assert health() == health_pb2.HealthCheckResponse.SERVING
            stopping = asyncio.run_coroutine_threadsafe(daemon.stop(), d.loop)
            assert health() == health_pb2.HealthCheckResponse.NOT_SERVING
        daemon.held.release.set()
        assert answer.result(10) is Decision.EXECUTE
        stopping.result(10)
        with pytest.raises(EffectdError) as refused:
            c.prepare_tool("r", "late", "t", {})
        assert refused.value.code is grpc.StatusCode.UNAVAILABLE
    assert not cfg.socket_path.exists()


def test_full_storage_answers_storage_full_and_keeps_serving(short_tmp: Path) -> None:
    """A full map is RESOURCE_EXHAUSTED / STORAGE_FULL; reads and health go on."""
    cfg = ServeConfig(data_dir=short_tmp / "data", init=True, map_size=1 << 20)
    with running_daemon(cfg) as d, Client(d.target) as c:
        c.put_checkpoint("first", b"x")
        refusal = None
        for i in range(64):
            try:
                c.put_checkpoint(f"big-{i}", bytes(64 << 10))
            except EffectdError as exc:
                refusal = exc
                break
        assert refusal is not None
        assert refusal.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refusal.reason == "STORAGE_FULL"
        first = c.get_checkpoint("first")
        assert first is not None
        assert first.value == b"x"
        assert _health(d.target) == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "no-sync"])
def test_no_sync_says_at_start_that_a_side_effect_can_run_twice(
    short_tmp: Path, caplog: pytest.LogCaptureFixture, sync: bool
) -> None:
    """With --no-sync the daemon warns at start what a power loss can then do;
    with sync it says nothing of the kind (issue 10 item 18: fails before the
    fix: it started silently)."""
    config = ServeConfig(data_dir=short_tmp / "data", init=True, sync=sync)
    with caplog.at_level("WARNING", logger="sidecar.server"), running_daemon(config):
        pass
    warned = [r.getMessage() for r in caplog.records if "power loss" in r.getMessage()]
    if sync:
        assert warned == []
    else:
        [message] = warned
        assert "--no-sync" in message
        assert "side effect run twice" in message
