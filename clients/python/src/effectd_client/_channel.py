"""How every client of this package reaches the daemon: one channel recipe.

`Connection` holds the options every entry point accepts (`Client`,
`AsyncClient`, the provider transports, and through them `Run`): a bearer
token, TLS material and the message-size limit. It builds sync and aio
channels and the metadata sent with every call.

The token travels as `authorization: Bearer <token>` call metadata rather
than as gRPC call credentials: grpc refuses call credentials on an insecure
channel, and the default transport, a Unix socket, is one. It is excluded
from `repr()` so that logging a client, or a traceback showing one, never
prints the secret.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

#: The daemon's default message limit (`--max-message-size`), both directions.
DEFAULT_MAX_MESSAGE_BYTES = 8 << 20

Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Connection:
    """The target and the options that decide how a channel to it is made.

    TLS is on when `tls` is true or any of the PEM byte strings is given;
    without `root_certificates` the system's roots verify the server.
    `certificate_chain` and `private_key` (mutual TLS) come together.
    """

    target: str
    token: str | None = field(default=None, repr=False)
    tls: bool = False
    root_certificates: bytes | None = field(default=None, repr=False)
    certificate_chain: bytes | None = field(default=None, repr=False)
    private_key: bytes | None = field(default=None, repr=False)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES

    def __post_init__(self) -> None:
        if (self.certificate_chain is None) != (self.private_key is None):
            raise ValueError(
                "certificate_chain and private_key: give both (mutual TLS) or neither"
            )
        if self.token is not None and not _is_header_value(self.token):
            # The message must not quote the token: it is a secret.
            raise ValueError(
                "token: must be visible ASCII characters without spaces "
                "(it is sent as an authorization metadata value)"
            )
        if self.max_message_bytes < 1:
            raise ValueError("max_message_bytes: must be positive")

    @property
    def secure(self) -> bool:
        return self.tls or any(
            part is not None
            for part in (
                self.root_certificates,
                self.certificate_chain,
                self.private_key,
            )
        )

    @property
    def metadata(self) -> Metadata:
        """What every call sends: the bearer token, when there is one."""
        if self.token is None:
            return ()
        return (("authorization", f"Bearer {self.token}"),)

    def describe(self, kind: str, namespace: str) -> str:
        """A client's `repr()`: whether a token is set, never the token."""
        token = ", token=<hidden>" if self.token is not None else ""
        return (
            f"{kind}({self.target!r}, namespace={namespace!r}, "
            f"tls={self.secure}{token})"
        )

    def _options(self) -> Sequence[tuple[str, int]]:
        return (
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
        )

    def _credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )

    def channel(self) -> grpc.Channel:
        """A new synchronous channel; the caller closes it."""
        if self.secure:
            return grpc.secure_channel(
                self.target, self._credentials(), options=self._options()
            )
        return grpc.insecure_channel(self.target, options=self._options())

    def aio_channel(self) -> grpc.aio.Channel:
        """A new asyncio channel, bound to the running loop; the caller closes it."""
        if self.secure:
            return grpc.aio.secure_channel(
                self.target, self._credentials(), options=self._options()
            )
        return grpc.aio.insecure_channel(self.target, options=self._options())


def _is_header_value(token: str) -> bool:
    # RFC 6750 b64token characters are a subset: visible ASCII, no spaces.
    return bool(token) and all("!" <= ch <= "~" for ch in token)


#: Read when no `token=` is given, so a deployment can hand agents a token
#: without a code change.
TOKEN_ENV = "EFFECTD_TOKEN"  # noqa: S105 - the variable's name, not a token


def connection(
    target: str,
    *,
    token: str | None,
    tls: bool,
    root_certificates: bytes | None,
    certificate_chain: bytes | None,
    private_key: bytes | None,
    max_message_bytes: int,
) -> Connection:
    """The `Connection` of a client's keyword options.

    `token=None` takes `EFFECTD_TOKEN` from the environment when it is set;
    `token=""` sends no token even then.
    """
    if token is None:
        token = os.environ.get(TOKEN_ENV) or None
    return Connection(
        target=target,
        token=token or None,
        tls=tls,
        root_certificates=root_certificates,
        certificate_chain=certificate_chain,
        private_key=private_key,
        max_message_bytes=max_message_bytes,
    )
