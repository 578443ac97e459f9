"""Which directories the daemon keeps its files in: ones no other local user
can change under it.

Whoever can write a directory can rename or replace what is in it: the
ledger's files in the data directory (making the daemon replay or forget
side effects), or the Unix socket (a socket of their own there collects the
agents' bearer tokens and answers in the daemon's name). So a directory is
refused when it is owned by another user (root excepted), or when its group
or other users may write it. The one exception is a sticky directory owned
by root or by the daemon's user, such as /tmp (mode 1777, owner root), and
only where it is allowed (the socket's): there only a file's owner may
rename or delete it. `disk_space` reads how full the data directory's
filesystem is, for the stats and the metrics.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable
from pathlib import Path

from sidecar.config import ConfigError, ServeConfig
from sidecar.ledger.quota import DiskSpace

ROOT = 0


def refuse_unsafe_directory(path: Path, setting: str, *, sticky_ok: bool) -> None:
    """Raises ConfigError, naming `setting`, for a directory another user
    could change under the daemon; a missing one passes (the daemon creates
    it, 0700).

    Args:
        path: the directory.
        setting: the key of the setting that chose it (`data_dir`, `socket`).
        sticky_ok: accept a sticky directory owned by root or by the daemon's
            user although others may write it (like /tmp).
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    mode = stat.S_IMODE(st.st_mode)
    me = os.geteuid()
    if st.st_uid not in (me, ROOT):
        raise ConfigError(
            setting,
            f"{path} is owned by another user (uid {st.st_uid}, the daemon runs "
            f"as uid {me}), who could change what the daemon keeps there; use a "
            "directory of the daemon's user",
        )
    if not mode & 0o022:
        return
    if sticky_ok and mode & stat.S_ISVTX:
        return
    sticky = (
        "; a sticky directory owned by root or by the daemon's user (like /tmp) "
        "is accepted too"
        if sticky_ok
        else ""
    )
    raise ConfigError(
        setting,
        f"{path} is group- or world-writable (mode {mode:04o}): another user "
        f"could rename or replace what the daemon keeps there; chmod 700 it{sticky}",
    )


def disk_space(path: Path, *, holds_store: bool) -> DiskSpace:
    """The filesystem `path` is on, as statvfs(3) reports it now.

    Raises:
        OSError: `path` cannot be examined.
    """
    st = os.statvfs(path)
    return DiskSpace(
        path=str(path),
        holds_store=holds_store,
        free_bytes=st.f_bavail * st.f_frsize,
        total_bytes=st.f_blocks * st.f_frsize,
    )


def data_disk(cfg: ServeConfig) -> Callable[[], DiskSpace]:
    """Reads the filesystem of `cfg`'s data directory (`disk_space`) when
    called; it holds the store unless the store is a shared one."""
    return functools.partial(disk_space, cfg.data_dir, holds_store=cfg.store is None)
