"""`python -m sidecar.probe` exits 0 only while a real daemon says SERVING.

The image's HEALTHCHECK and service managers act on its exit code, so each
case runs against a real daemon on a temporary socket: serving, absent, and
stopping (health NOT_SERVING, new calls refused) while a call is in flight.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path

import grpc
import httpx
import pytest
from effectd.v1 import provider_pb2, provider_pb2_grpc
from grpc_health.v1 import health_pb2

from sidecar import probe
from sidecar.config import ServeConfig
from sidecar.seams import Seams
from sidecar.testing import RunningDaemon, running_daemon
from tests.support.events import health_changes
from tests.support.processes import ROOT

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HeldUpstream(httpx.AsyncBaseTransport):
    """An upstream that answers only when the test releases it: a call in
    flight that keeps a stopping daemon in its grace period."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._release: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self._loop = asyncio.get_running_loop()
        self._release = asyncio.Event()
        self.entered.set()
        await self._release.wait()
        return httpx.Response(200, content=b"{}")

    def release(self) -> None:
        if self._loop is not None and self._release is not None:
            self._loop.call_soon_threadsafe(self._release.set)


def test_serving_daemon_exits_0(daemon: RunningDaemon) -> None:
    """The module, run as the HEALTHCHECK runs it, exits 0 on SERVING."""
    done = subprocess.run(
        [sys.executable, "-m", "sidecar.probe", "--timeout", "10", daemon.target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_default_target_is_the_daemons_socket(
    daemon: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a target the probe finds the socket as the daemon does:
    EFFECTD_SOCKET first, else the data directory's effectd.sock."""
    sock = daemon.daemon.config.socket_path
    monkeypatch.delenv("EFFECTD_SOCKET", raising=False)
    monkeypatch.setenv("EFFECTD_DATA_DIR", str(sock.parent))
    assert probe.main(["--timeout", "10"]) == probe.SERVING
    monkeypatch.setenv("EFFECTD_SOCKET", str(sock.parent / "elsewhere.sock"))
    assert probe.main(["--timeout", "10"]) == probe.UNREACHABLE
    assert probe.main(["--timeout", "10", str(sock)]) == probe.SERVING


def test_unknown_service_is_not_serving(daemon: RunningDaemon) -> None:
    """A server that does not know the service named is up but not SERVING."""
    code = probe.main(
        ["--service", "no.such.Service", "--timeout", "10", daemon.target]
    )
    assert code == probe.NOT_SERVING


def test_nothing_listening_exits_non_zero(short_tmp: Path) -> None:
    """No socket file, or a TCP port nobody listens on: UNREACHABLE, at once."""
    assert probe.main([str(short_tmp / "absent.sock"), "--timeout", "10"]) == 3
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The port was free a moment ago and nothing binds it in between here.
    assert probe.main([f"127.0.0.1:{port}", "--timeout", "10"]) == probe.UNREACHABLE


def test_stopping_daemon_exits_non_zero(short_tmp: Path) -> None:
    """While a SIGTERM'd daemon lets its in-flight calls finish, it is no
    longer healthy: the socket refuses new calls, and the health port (what
    Kubernetes probes) answers NOT_SERVING."""
    providers = short_tmp / "providers.toml"
    providers.write_text('[routes.up]\nbase_url = "http://127.0.0.1:9"\n')
    config = ServeConfig(
        data_dir=short_tmp / "data",
        init=True,
        providers_file=providers,
        grace_seconds=60,
        health_listen="127.0.0.1:0",
    )
    upstream = HeldUpstream()
    with running_daemon(config, seams=Seams(transport=upstream)) as running:
        daemon = running.daemon
        health = daemon.health_address
        assert health is not None
        for target in (running.target, health):
            assert probe.main([target, "--timeout", "10"]) == probe.SERVING
        with grpc.insecure_channel(running.target) as channel:
            call = provider_pb2_grpc.ProviderStub(channel).ProviderCall.future(
                provider_pb2.ProviderRequest(route="up", path="/v1/x", body=b"{}"),
                timeout=60,
            )
            assert upstream.entered.wait(timeout=30)
            try:
                with health_changes(health) as change:
                    assert change() == SERVING
                    stopping: Future[None] = asyncio.run_coroutine_threadsafe(
                        daemon.stop(), running.loop
                    )
                    # The stop has begun on the daemon's loop when the health
                    # port says so; then probe as an orchestrator would.
                    assert change() == NOT_SERVING
                on_health_port = probe.main([health, "--timeout", "10"])
                on_socket = probe.main([running.target, "--timeout", "10"])
                # The stop is still waiting for the held call: it was stopping
                # when probed, not yet stopped.
                assert not stopping.done()
            finally:
                upstream.release()
            assert call.result(timeout=30).status == 200
            stopping.result(timeout=30)
    assert on_socket in {probe.NOT_SERVING, probe.UNREACHABLE}
    assert on_health_port == probe.NOT_SERVING


def test_usage_errors_exit_2() -> None:
    """A bad option is a usage error, not a health verdict."""
    with pytest.raises(SystemExit) as exited:
        probe.main(["--timeout", "0"])
    assert exited.value.code == probe.USAGE


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/run/effectd/effectd.sock", "unix:/run/effectd/effectd.sock"),
        ("./x.sock", "unix:./x.sock"),
        ("unix:/a.sock", "unix:/a.sock"),
        ("127.0.0.1:50052", "127.0.0.1:50052"),
    ],
)
def test_targets(target: str, expected: str) -> None:
    """A bare path means a Unix socket; anything else is a gRPC target."""
    assert probe.grpc_target(target) == expected


def test_default_target_without_environment() -> None:
    """With nothing set, the default data directory's socket."""
    assert probe.default_target({}) == "unix:.effectd/effectd.sock"
    env = {"EFFECTD_DATA_DIR": "/var/lib/effectd"}
    assert probe.default_target(env) == "unix:/var/lib/effectd/effectd.sock"
