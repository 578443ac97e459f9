"""How `effectd ctl` proves who it is: the bearer token and the TLS files.

The token comes from `--token-file` (a file its owner alone may read: a
token readable by others is a leaked token, so the console refuses it
instead of sending it) or from `EFFECTD_TOKEN`. The TLS options name PEM
files read once at start. Every problem is a `UsageError`, exit 2, raised
before anything is sent.
"""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

# The console is the shipped client's sibling: it builds its channels the
# same way (and with the same defaults) as `effectd_client.Client`.
from effectd_client import Connection

# The variable the client library reads a bearer token from, too.
TOKEN_ENV = "EFFECTD_TOKEN"  # noqa: S105 - the variable's name, not a token


class UsageError(Exception):
    """A bad connection option; the message names it and the fix."""


def connection(target: str, args: argparse.Namespace) -> Connection:
    """The channel options of the parsed `ctl` arguments."""
    token = (
        read_token_file(args.token_file)
        if args.token_file is not None
        else os.environ.get(TOKEN_ENV) or None
    )
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key: give both or neither")
    try:
        return Connection(
            target=target,
            token=token,
            root_certificates=_pem(args.tls_ca, "--tls-ca"),
            certificate_chain=_pem(args.tls_cert, "--tls-cert"),
            private_key=_pem(args.tls_key, "--tls-key"),
        )
    except ValueError as exc:
        # The message never quotes the token (see effectd_client.Connection).
        raise UsageError(str(exc)) from None


def read_token_file(path: Path) -> str:
    """The token in `path`, which only its owner may read or write."""
    try:
        with path.open("rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise UsageError(f"--token-file {path}: not a regular file")
            if mode & 0o077:
                raise UsageError(
                    f"--token-file {path}: mode {stat.S_IMODE(mode):04o} lets "
                    f"group or others read it; run `chmod 600 {path}`"
                )
            data = f.read()
    except OSError as exc:
        raise UsageError(f"--token-file {path}: {exc.strerror}") from None
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise UsageError(f"--token-file {path}: not an ASCII token") from None
    if not token:
        raise UsageError(f"--token-file {path}: the file is empty")
    return token


def _pem(path: Path | None, flag: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{flag} {path}: {exc.strerror}") from None
