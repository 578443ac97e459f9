"""The daemon keeps its files only where no other local user can change them
(sidecar/directories.py): the data directory and the socket's directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sidecar.config import ConfigError, ServeConfig
from sidecar.directories import refuse_unsafe_directory
from sidecar.testing import running_daemon

ROOT_ONLY = pytest.mark.skipif(
    os.geteuid() != 0, reason="giving a directory away needs root"
)
NOBODY = 65534

# (mode, sticky accepted, refused)
MODES = [
    (0o700, False, False),
    (0o755, False, False),
    (0o750, True, False),
    (0o770, True, True),  # group-writable
    (0o777, True, True),  # world-writable, not sticky
    (0o1777, True, False),  # like /tmp: only a file's owner may rename it
    (0o1777, False, True),  # the data directory takes no sticky exception
    (0o1770, True, False),
]


@pytest.mark.parametrize(("mode", "sticky_ok", "refused"), MODES)
def test_the_directory_rule(
    short_tmp: Path, mode: int, sticky_ok: bool, refused: bool
) -> None:
    directory = short_tmp / "d"
    directory.mkdir()
    directory.chmod(mode)
    if refused:
        with pytest.raises(ConfigError, match="group- or world-writable"):
            refuse_unsafe_directory(directory, "socket", sticky_ok=sticky_ok)
    else:
        refuse_unsafe_directory(directory, "socket", sticky_ok=sticky_ok)


def test_a_missing_directory_passes(short_tmp: Path) -> None:
    """The daemon creates it, 0700."""
    refuse_unsafe_directory(short_tmp / "new", "data-dir", sticky_ok=False)


def test_a_socket_directory_others_may_write_is_refused(short_tmp: Path) -> None:
    """A socket in a world-writable, non-sticky directory: the daemon does
    not start (issue 10 item 26: fails before the fix: it only warned, and
    another user could rename the live socket and put a fake one there)."""
    shared = short_tmp / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    config = ServeConfig(
        data_dir=short_tmp / "data", init=True, socket=shared / "e.sock"
    )
    with (
        pytest.raises(ConfigError, match=r"socket: .* world-writable"),
        running_daemon(config),
    ):
        pass
    assert not (shared / "e.sock").exists()


def test_a_socket_in_a_sticky_directory_like_tmp_serves(short_tmp: Path) -> None:
    """Control: a sticky world-writable directory owned by root or the
    daemon's user is accepted; the socket itself is still 0600."""
    shared = short_tmp / "sticky"
    shared.mkdir()
    shared.chmod(0o1777)
    config = ServeConfig(
        data_dir=short_tmp / "data", init=True, socket=shared / "e.sock"
    )
    with running_daemon(config) as running:
        assert running.target == f"unix:{shared / 'e.sock'}"
        assert (shared / "e.sock").stat().st_mode & 0o777 == 0o600


@ROOT_ONLY
@pytest.mark.parametrize("which", ["data", "socket"])
def test_a_directory_of_another_user_is_refused(short_tmp: Path, which: str) -> None:
    """A data or socket directory owned by another user (0700, so only they
    can write it) is refused (issue 10 item 27: fails before the fix: a data
    directory of another user was accepted)."""
    data, sockets = short_tmp / "data", short_tmp / "sockets"
    for directory in (data, sockets):
        directory.mkdir(mode=0o700)
    os.chown(data if which == "data" else sockets, NOBODY, -1)
    config = ServeConfig(data_dir=data, init=True, socket=sockets / "e.sock")
    setting = "data-dir" if which == "data" else "socket"
    with (
        pytest.raises(ConfigError, match=f"{setting}: .* owned by another user"),
        running_daemon(config),
    ):
        pass
