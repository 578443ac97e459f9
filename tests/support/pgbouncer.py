"""PgBouncer (Debian's `pgbouncer` package, installed by `make test`'s
set-up) in front of a test's PostgreSQL, as a fleet runs it: transaction
pooling, so a server connection serves one transaction of one client and
then any other client's.

`bouncer(host, port)` writes a configuration into a new temporary
directory (every database name passed on to the server at `host:port`,
trust authentication, the pool small enough that clients share server
connections), starts `pgbouncer` on a free loopback port (as the `postgres`
user when the tests run as root: PgBouncer refuses to run as root), waits
until it answers, and at exit stops it and removes the directory. Every
step is bounded. A PgBouncer that cannot be started fails the test: it is
never skipped. `through(url, bouncer)` is a store URL sent through it, with
`pooler=transaction` (`sidecar.storage.postgres.connecting`).

`EFFECTD_TEST_PGBOUNCER` names the program (default /usr/sbin/pgbouncer).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

BINARY = os.environ.get("EFFECTD_TEST_PGBOUNCER", "/usr/sbin/pgbouncer")
RUN_AS = "postgres"
START_SECONDS = 20.0
# Server connections per database and user: fewer than the clients of a
# race (three daemons, nine connections each), so they take turns.
POOL_SIZE = 8


@dataclass(frozen=True, slots=True)
class Bouncer:
    """A running PgBouncer on 127.0.0.1:`port`, its files in `directory`."""

    port: int
    directory: Path
    pool_mode: str

    @property
    def log(self) -> Path:
        return self.directory / "pgbouncer.log"

    def tail_of_log(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\npgbouncer log:\n" + "\n".join(text.splitlines()[-lines:])


def through(url: str, bouncer: Bouncer, *, pooler: str | None = None) -> str:
    """`url` (a store URL of the server behind `bouncer`) sent through
    `bouncer`, with `pooler=` its pool mode (or `pooler`; "" for none)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{bouncer.port}"
    netloc[-1] = host
    query = urllib.parse.parse_qsl(parts.query)
    said = bouncer.pool_mode if pooler is None else pooler
    if said:
        query.append(("pooler", said))
    return urllib.parse.urlunsplit(
        parts._replace(netloc="@".join(netloc), query=urllib.parse.urlencode(query))
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(directory: Path, host: str, port: int, listen: int, mode: str) -> None:
    users = {getpass.getuser(), RUN_AS, os.environ.get("PGUSER", RUN_AS)}
    (directory / "users.txt").write_text(
        "".join(f'"{user}" ""\n' for user in sorted(users))
    )
    (directory / "pgbouncer.ini").write_text(
        f"""[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = trust
auth_file = {directory / "users.txt"}
pool_mode = {mode}
default_pool_size = {POOL_SIZE}
max_client_conn = 1000
server_login_retry = 1
admin_users = {getpass.getuser()}
logfile = {directory / "pgbouncer.log"}
pidfile = {directory / "pgbouncer.pid"}
"""
    )


def _answers(port: int) -> bool:
    try:
        with psycopg.connect(
            f"postgresql://127.0.0.1:{port}/pgbouncer", connect_timeout=2
        ):
            return True
    except psycopg.Error:
        return False


def _start(
    directory: Path, host: str, port: int, mode: str
) -> tuple[int, subprocess.Popen[bytes]]:
    as_root = os.geteuid() == 0
    for _ in range(3):
        listen = _free_port()
        _config(directory, host, port, listen, mode)
        command = [
            BINARY,
            *(["-u", RUN_AS] if as_root else []),
            str(directory / "pgbouncer.ini"),
        ]
        # Its output goes to a file: a pipe nobody reads fills up under a
        # burst of errors (a database restart) and blocks PgBouncer whole.
        with (directory / "stderr.txt").open("wb") as output:
            process = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=output
            )
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline and process.poll() is None:
            if _answers(listen):
                return listen, process
            time.sleep(0.05)
        _stop(process)
        log = directory / "pgbouncer.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        if "Address already in use" not in text:
            stderr = (directory / "stderr.txt").read_text(errors="replace")
            pytest.fail(
                f"pgbouncer did not start ({' '.join(command)}): "
                f"{stderr[-2000:]}{text[-2000:]}"
            )
    pytest.fail("pgbouncer found no free port")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM ends PgBouncer at once, closing every connection."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextmanager
def bouncer(
    host: str = "127.0.0.1", port: int = 5432, *, mode: str = "transaction"
) -> Iterator[Bouncer]:
    """A PgBouncer in `mode` in front of the server at `host:port`."""
    if shutil.which(BINARY) is None:
        pytest.fail(
            f"{BINARY} is not installed: `make test` installs Debian's pgbouncer "
            "(set EFFECTD_TEST_PGBOUNCER to another)"
        )
    directory = Path(tempfile.mkdtemp(prefix="effectd-pgbouncer-", dir="/tmp"))
    try:
        if os.geteuid() == 0:
            user = pwd.getpwnam(RUN_AS)
            os.chown(directory, user.pw_uid, user.pw_gid)
        listen, process = _start(directory, host, port, mode)
        try:
            yield Bouncer(port=listen, directory=directory, pool_mode=mode)
        finally:
            _stop(process)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(directory)


def server_of(url: str) -> tuple[str, int]:
    """The host and port of a PostgreSQL URL."""
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 5432
