"""The daemon as `effectd ctl` sees it: the typed client for ledger and
recovery commands, and the generated stubs on a second channel to the same
target for the full record of `show` and the Admin RPCs; and who the audit
log records as the operator.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable
from typing import TypeVar

import grpc
from effectd.v1 import admin_pb2_grpc, ledger_pb2_grpc

from effectd_client import Client, Connection, EffectdError

T = TypeVar("T")

OK = 0


class Console:
    """The daemon as the console sees it: the typed client plus raw stubs."""

    def __init__(self, connection: Connection, namespace: str, timeout: float) -> None:
        self.target = connection.target
        self.namespace = namespace
        self.timeout = timeout
        self._connection = connection
        self.client = Client(
            connection.target,
            namespace=namespace,
            timeout=timeout,
            # "" rather than None: the console already read EFFECTD_TOKEN.
            token=connection.token or "",
            root_certificates=connection.root_certificates,
            certificate_chain=connection.certificate_chain,
            private_key=connection.private_key,
            max_message_bytes=connection.max_message_bytes,
            # An operator's command says at once that the daemon is away (or
            # why its TLS handshake failed) rather than wait for it.
            reconnect_wait=0,
        )
        self._channel: grpc.Channel | None = None

    @property
    def authenticated(self) -> bool:
        return self._connection.token is not None

    def close(self) -> None:
        self.client.close()
        if self._channel is not None:
            self._channel.close()

    def _stub_channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = self._connection.channel()
        return self._channel

    @property
    def admin(self) -> admin_pb2_grpc.AdminStub:
        return admin_pb2_grpc.AdminStub(self._stub_channel())

    @property
    def ledger(self) -> ledger_pb2_grpc.ToolLedgerStub:
        return ledger_pb2_grpc.ToolLedgerStub(self._stub_channel())

    def call(self, method: Callable[..., T], request: object) -> T:
        try:
            return method(
                request, timeout=self.timeout, metadata=self._connection.metadata
            )
        except grpc.RpcError as exc:
            raise EffectdError.from_rpc_error(exc) from None


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
