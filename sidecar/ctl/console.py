"""The daemon as `effectd ctl` sees it: the public client
(`effectd_client.Client`), whose `admin` and `operator` surfaces send every
command's RPC; and who the audit log records as the operator.
"""

from __future__ import annotations

import dataclasses
import getpass
import os

from effectd_client import Admin, Client, Connection, Operator

OK = 0


class Console:
    """The daemon as the console sees it: one client, its operator surface."""

    def __init__(self, connection: Connection, namespace: str, timeout: float) -> None:
        self.target = connection.target
        self.namespace = namespace
        self.timeout = timeout
        self.authenticated = connection.token is not None
        self.client = Client(
            # "" rather than None: the console already read EFFECTD_TOKEN.
            dataclasses.replace(connection, token=connection.token or ""),
            namespace=namespace,
            timeout=timeout,
            # Operator commands are unary calls; no session stream.
            session=False,
            # An operator's command says at once that the daemon is away (or
            # why its TLS handshake failed) rather than wait for it.
            reconnect_wait=0,
        )
        self.admin: Admin = self.client.admin
        self.operator: Operator = self.client.operator

    def close(self) -> None:
        self.client.close()


def actor(con: Console, name: str | None) -> str:
    """Who the audit log records. With a token the daemon records the
    token's name (and refuses any other), so none is sent unless given."""
    if name:
        return name
    if con.authenticated:
        return ""
    return user()


def user() -> str:
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (OSError, KeyError):  # no passwd entry for the uid
        return "operator"
