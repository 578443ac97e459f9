"""`effectd ctl` run in-process through `sidecar.cli.main` against the real
daemon of the `daemon` fixture, and an agent that makes calls for it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from effectd_client import Client
from sidecar.cli import main
from sidecar.testing import RunningDaemon

Ctl = Callable[..., tuple[int, str, str]]


@pytest.fixture
def ctl(daemon: RunningDaemon, capsys: pytest.CaptureFixture[str]) -> Ctl:
    """Runs `effectd ctl --target <daemon> ARGS`; answers (code, out, err)."""

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["ctl", "--target", daemon.target, *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def agent(daemon: RunningDaemon) -> Iterator[Client]:
    with Client(daemon.target, session=False) as c:
        yield c
