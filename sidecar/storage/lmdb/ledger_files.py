"""Whether a data directory holds an LMDB ledger, judged before anything is
created in it.

A ledger exists when the directory's data file (`data.mdb`) is there and not
empty: LMDB writes its meta pages into the file as it creates it, so a file
that held even one commit is never empty. Nothing else counts: not the
directory (an empty one, such as a new volume), not the locks the daemon
takes before it opens the store (`effectd.lock`, `effectd.sock.lock`), not
LMDB's own `lock.mdb` (recreated at every open), not an empty `data.mdb`
(nothing was ever committed to it). A daemon creates a ledger only when asked
(`ServeConfig.init`), so that a mistyped or unmounted data directory is
refused instead of served as a new, empty memory.
"""

from __future__ import annotations

import enum
import stat
from pathlib import Path

DATA_FILE = "data.mdb"


class Found(enum.Enum):
    """What a data directory holds, as far as the ledger goes."""

    LEDGER = "a ledger"
    # No directory at the path (nor, maybe, its parents).
    NOTHING = "nothing"
    # A directory without a data file.
    NO_DATA_FILE = f"no {DATA_FILE}"
    # A data file of 0 bytes: created, never written.
    EMPTY_DATA_FILE = f"an empty {DATA_FILE}"
    # A data file that is not a regular file.
    ODD_DATA_FILE = f"a {DATA_FILE} that is not a file"
    # The path names something that is not a directory.
    NOT_A_DIRECTORY = "not a directory"
    # A path above it is a file: no directory can be made there.
    UNDER_A_FILE = "under a file"


def inspect(path: Path) -> Found:
    """What `path`, a data directory, holds.

    Raises:
        OSError: the path cannot be examined (a permission, an I/O error).
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        return Found.NOTHING
    except NotADirectoryError:
        return Found.UNDER_A_FILE
    if not stat.S_ISDIR(st.st_mode):
        return Found.NOT_A_DIRECTORY
    try:
        data = (path / DATA_FILE).stat()
    except FileNotFoundError:
        return Found.NO_DATA_FILE
    if not stat.S_ISREG(data.st_mode):
        return Found.ODD_DATA_FILE
    return Found.LEDGER if data.st_size > 0 else Found.EMPTY_DATA_FILE


# What `init` turns into a new ledger; the other findings are refused anyway.
CREATABLE = frozenset({Found.NOTHING, Found.NO_DATA_FILE, Found.EMPTY_DATA_FILE})


def why_not(path: Path, found: Found) -> str:
    """Why a daemon cannot serve `path` as it is, `found` not being a
    ledger; for a finding in `CREATABLE`, unless it is asked to create one."""
    if found is Found.NOT_A_DIRECTORY:
        return f"{path} is not a directory"
    if found is Found.UNDER_A_FILE:
        return f"{path} cannot be a directory: a path above it is a file"
    if found is Found.ODD_DATA_FILE:
        return f"{path / DATA_FILE} is not a file"
    if found is Found.NOTHING:
        return f"{path} does not exist"
    return f"{path} holds no ledger ({found.value})"
