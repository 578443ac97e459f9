"""Readiness under systemd (`Type=notify`, issue 25 item 16): the daemon
sends READY=1 to `$NOTIFY_SOCKET` once its socket serves, and STOPPING=1 as
it begins to stop; received here on a real Unix datagram socket."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.sdnotify import READY, STOPPING, notify
from tests.support.processes import ROOT

TIMEOUT = 30.0


@pytest.fixture
def manager(short_tmp: Path) -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket standing in for the service manager's."""
    path = short_tmp / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(TIMEOUT)
        yield sock, str(path)


def test_a_state_is_one_datagram_to_the_socket_named(
    manager: tuple[socket.socket, str],
) -> None:
    sock, path = manager
    assert notify(
        READY, "STATUS=serving\non two lines", environ={"NOTIFY_SOCKET": path}
    )
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving on two lines"


def test_an_abstract_socket_is_named_with_an_at_sign() -> None:
    name = f"effectd-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(TIMEOUT)
        assert notify(STOPPING, environ={"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(4096) == b"STOPPING=1"


def test_without_the_variable_nothing_is_sent() -> None:
    assert not notify(READY, environ={})


def test_a_socket_that_is_not_there_is_logged_not_raised(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = str(short_tmp / "gone")
    assert not notify(READY, environ={"NOTIFY_SOCKET": missing})
    assert "cannot tell the service manager READY=1" in caplog.text
    assert any(r.levelno == logging.WARNING for r in caplog.records)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_daemon_says_ready_once_it_serves_and_stopping_as_it_stops(
    short_tmp: Path, manager: tuple[socket.socket, str]
) -> None:
    """READY=1 comes when the socket is there (a unit ordered after effectd
    may connect at once), with a STATUS line; SIGTERM brings STOPPING=1,
    then exit 0 (fails before the fix: nothing was sent, and the unit was
    Type=exec: ready as soon as the process ran)."""
    sock, path = manager
    data = short_tmp / "data"
    env = {**os.environ, "NOTIFY_SOCKET": path}
    command = [sys.executable, "-m", "sidecar", "serve", "--data-dir", str(data)]
    with subprocess.Popen(
        [*command, "--init"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as daemon:
        try:
            ready = sock.recv(4096).decode()
            assert (data / "effectd.sock").exists()
            lines = ready.splitlines()
            assert lines[0] == "READY=1"
            assert lines[1].startswith("STATUS=effectd ")
            assert f"ready on unix:{data / 'effectd.sock'}" in lines[1]
            daemon.send_signal(signal.SIGTERM)
            assert sock.recv(4096).decode().splitlines()[0] == "STOPPING=1"
            assert daemon.wait(timeout=TIMEOUT) == 0
        finally:
            if daemon.poll() is None:
                daemon.kill()
