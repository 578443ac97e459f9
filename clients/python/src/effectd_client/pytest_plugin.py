"""pytest fixtures of `effectd_client.testing`, opt in with

    pytest_plugins = ["effectd_client.pytest_plugin"]

in the root `conftest.py`: `effectd_daemon`, a real daemon on a temporary
data directory for one test (`effectd_client.testing.running_daemon`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from effectd_client._testing_daemon import TestDaemon, running_daemon


@pytest.fixture
def effectd_daemon() -> Iterator[TestDaemon]:
    """A real daemon for this test; `effectd_daemon.target` to connect."""
    with running_daemon() as daemon:
        yield daemon
