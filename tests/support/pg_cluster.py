"""A private PostgreSQL 15 cluster for one test: a test that stops, kills
or restarts its database must never touch the shared server other tests
use at the same time.

`private_cluster()` runs `initdb` into a new temporary directory (as the
`postgres` user when the tests run as root: the server refuses to run as
root), starts the server on a free loopback port with its Unix socket in
that directory, `fsync` on, and at exit stops it (immediate mode) and
removes the directory. Every step is bounded in time. A cluster that cannot
be made or started fails the test: it is never skipped.

`EFFECTD_TEST_PG_BIN` names the directory of the server's programs
(default /usr/lib/postgresql/15/bin).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import psycopg
import pytest

from tests.support import postgres

BIN = Path(os.environ.get("EFFECTD_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
SERVER_USER = "postgres"
# Seconds one initdb, start or stop may take on a loaded machine.
STEP_SECONDS = 60
StopMode = Literal["smart", "fast", "immediate"]

# Written once into postgresql.conf: every restart keeps them.
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "on",
    "synchronous_commit": "on",
    "max_connections": "100",
    "shared_buffers": "'16MB'",
    "log_min_messages": "warning",
    "log_connections": "off",
    # After a crash the data directory is synced before recovery: one
    # syncfs of the file system, not an fsync of every file.
    "recovery_init_sync_method": "syncfs",
    "log_disconnections": "off",
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateCluster:
    """A PostgreSQL cluster in `directory` of its own (data in `data`, the
    socket and server log beside it), served on 127.0.0.1:`port`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.data = directory / "data"
        self.server_log = directory / "server.log"
        self.port = 0
        self._as_server_user = os.geteuid() == 0

    @property
    def url(self) -> str:
        """The URL of its `postgres` database, as the superuser."""
        return f"postgresql://{SERVER_USER}@127.0.0.1:{self.port}/postgres"

    def _run(self, argv: Sequence[str], *, timeout: float = STEP_SECONDS) -> None:
        command = [str(BIN / argv[0]), *argv[1:]]
        if self._as_server_user:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} failed ({done.returncode}): "
                f"{done.stdout}{done.stderr}{self.tail_of_log()}"
            )

    def tail_of_log(self, lines: int = 30) -> str:
        """The end of the server's log, for a failure's message."""
        try:
            text = self.server_log.read_text(errors="replace")
        except OSError:
            return ""
        return "\nserver log:\n" + "\n".join(text.splitlines()[-lines:])

    def init(self) -> None:
        """initdb, trust authentication for local connections, the
        settings; the directory belongs to the server's user."""
        if self._as_server_user:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.directory, user.pw_uid, user.pw_gid)
        self._run(
            [
                "initdb",
                *("-D", str(self.data)),
                *("-U", SERVER_USER),
                *("--auth", "trust"),
                *("--encoding", "UTF8"),
                "--locale=C",
                # initdb's own files need not reach the disk before the
                # server starts; the server itself runs with fsync on.
                "--no-sync",
                "--no-instructions",
            ]
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            for name, value in SETTINGS.items():
                conf.write(f"{name} = {value}\n")
            conf.write(f"unix_socket_directories = '{self.directory}'\n")

    def start(self) -> None:
        """Starts the server on the port it had (a free one the first time),
        waiting until it accepts connections."""
        for _ in range(3):
            if self.port == 0:
                self.port = _free_port()
            try:
                self._run(
                    [
                        "pg_ctl",
                        "start",
                        *("-D", str(self.data)),
                        *("-l", str(self.server_log)),
                        *("-o", f"-p {self.port}"),
                        "-w",
                        *("-t", str(STEP_SECONDS)),
                    ],
                    timeout=STEP_SECONDS + 10,
                )
                return
            except RuntimeError:
                # Another process took the port first: a new one, once more.
                if "could not bind" not in self.tail_of_log(5):
                    raise
                self.port = 0
        raise RuntimeError(f"PostgreSQL found no free port{self.tail_of_log()}")

    def stop(self, mode: StopMode = "fast") -> None:
        """`pg_ctl stop -m mode`, waiting until the server is gone: fast
        rolls back every open transaction and ends the sessions; immediate
        ends every process at once, as a crash does (recovery at the next
        start replays the WAL)."""
        self._run(
            [
                "pg_ctl",
                "stop",
                *("-D", str(self.data)),
                *("-m", mode),
                "-w",
                *("-t", str(STEP_SECONDS)),
            ],
            timeout=STEP_SECONDS + 10,
        )

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def restart(self, mode: StopMode = "fast", down_seconds: float = 0.0) -> None:
        """Stopped in `mode`, left down `down_seconds`, started again."""
        self.stop(mode)
        time.sleep(down_seconds)
        self.start()

    def connect(self) -> psycopg.Connection[tuple[object, ...]]:
        """An autocommit connection to its `postgres` database."""
        return psycopg.connect(self.url, autocommit=True, connect_timeout=10)

    def terminate(self, application_name: str) -> int:
        """Ends every connection whose application name starts with
        `application_name` (`pg_terminate_backend`); returns how many."""
        with self.connect() as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE starts_with(application_name, %s) AND pid <> pg_backend_pid()",
                (application_name,),
            ).fetchall()
        return len(rows)


@contextmanager
def private_cluster() -> Iterator[PrivateCluster]:
    """A started cluster of its own, stopped and removed at exit; fails
    (never skips) the test when it cannot be made or started."""
    directory = Path(tempfile.mkdtemp(prefix="effectd-pg-", dir="/tmp"))
    cluster = PrivateCluster(directory)
    try:
        try:
            cluster.init()
            cluster.start()
        except (RuntimeError, OSError, subprocess.TimeoutExpired, KeyError) as exc:
            pytest.fail(
                f"a private PostgreSQL cluster could not be started with the "
                f"programs of {BIN} ({exc}); the restart tests need it (set "
                "EFFECTD_TEST_PG_BIN)"
            )
        yield cluster
    finally:
        if cluster.running():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                cluster.stop("immediate")
        shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def schema_on(cluster: PrivateCluster) -> Iterator[str]:
    """The URL of a store of its own (a schema) on `cluster`; the cluster
    running again at the end, whatever the test left."""
    with postgres.schema(cluster.url) as url:
        try:
            yield url
        finally:
            if not cluster.running():
                cluster.start()
