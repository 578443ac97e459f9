"""The daemon as a separate process, for crash tests: start, wait, kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]


class DaemonProcess:
    def __init__(
        self, data_dir: Path, module: str = "sidecar", args: Sequence[str] = ()
    ) -> None:
        self.data_dir = data_dir
        self.target = f"unix:{data_dir / 'effectd.sock'}"
        self._log = open(data_dir.parent / f"{data_dir.name}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", module, "serve"),
                *("--data-dir", str(data_dir), *args),
            ],
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            self._wait_serving()
        except BaseException:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self._log.close()
            raise

    def _wait_serving(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"daemon exited with {self.proc.returncode}: {self.log()}"
                )
            try:
                with grpc.insecure_channel(self.target) as ch:
                    reply = health_pb2_grpc.HealthStub(ch).Check(
                        health_pb2.HealthCheckRequest(), timeout=1
                    )
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"daemon not serving after {timeout} s: {self.log()}")

    def log(self) -> str:
        self._log.flush()
        return (self.data_dir.parent / f"{self.data_dir.name}.log").read_text(
            errors="replace"
        )

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill9()
        self._log.close()


@contextmanager
def daemon_process(
    data_dir: Path, module: str = "sidecar", args: Sequence[str] = ()
) -> Iterator[DaemonProcess]:
    d = DaemonProcess(data_dir, module, args)
    try:
        yield d
    finally:
        d.close()
