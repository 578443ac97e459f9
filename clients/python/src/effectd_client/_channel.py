"""How every client of this package reaches the daemon: one channel recipe.

`Connection` is the one value of the options every entry point accepts
(`Client`, `AsyncClient`, the provider transports, and through them `Run`):
the target, a bearer token, TLS material and the message-size limit. It
builds sync and aio channels and the metadata sent with every call. Each
entry point takes either a `Connection` or a target string with the same
options as keywords; `connection` turns both into the value a client uses.

The token travels as `authorization: Bearer <token>` call metadata rather
than as gRPC call credentials: grpc refuses call credentials on an insecure
channel, and the default transport, a Unix socket, is one. It is excluded
from `repr()` so that logging a client, or a traceback showing one, never
prints the secret.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

#: The daemon's default message limit (`--max-message-size`), both directions.
DEFAULT_MAX_MESSAGE_BYTES = 8 << 20

Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Connection:
    """How to reach the daemon: where, as whom, over what, how much.

    Give it to any entry point in place of the target string; the entry
    point then takes none of these options as keywords::

        daemon = Connection("127.0.0.1:50051", token=token, root_certificates=ca)
        client = Client(daemon, namespace="team-a")
        transport = EffectdTransport(daemon, route="openai")

    TLS is on when `tls` is true or any of the PEM byte strings is given;
    without `root_certificates` the system's roots verify the server.
    `certificate_chain` and `private_key` (mutual TLS) come together.
    Raises ValueError for a token that cannot be a header value, half a
    client certificate, or a limit below 1.
    """

    target: str
    """`unix:PATH` or `HOST:PORT`."""
    token: str | None = field(default=None, repr=False)
    """The bearer token, sent as `authorization: Bearer` metadata on every
    call. None: an entry point made with this value reads `EFFECTD_TOKEN`;
    "": none, even then. Never shown by `repr()`."""
    tls: bool = False
    """TLS with the system's root certificates; implied by any PEM option."""
    root_certificates: bytes | None = field(default=None, repr=False)
    """PEM roots that verify the daemon's certificate."""
    certificate_chain: bytes | None = field(default=None, repr=False)
    """PEM client certificate (mutual TLS), with `private_key`."""
    private_key: bytes | None = field(default=None, repr=False)
    """PEM key of `certificate_chain`."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """The largest message sent or received, by default the daemon's own
    default (8 MiB); a larger request fails before it is sent, as
    RESOURCE_EXHAUSTED."""

    def __post_init__(self) -> None:
        if (self.certificate_chain is None) != (self.private_key is None):
            raise ValueError(
                "certificate_chain and private_key: give both (mutual TLS) or neither"
            )
        if self.token and not _is_header_value(self.token):
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
        if not self.token:
            return ()
        return (("authorization", f"Bearer {self.token}"),)

    def describe(self, kind: str, namespace: str) -> str:
        """A client's `repr()`: whether a token is set, never the token."""
        token = ", token=<hidden>" if self.token else ""
        return (
            f"{kind}({self.target!r}, namespace={namespace!r}, "
            f"tls={self.secure}{token})"
        )

    def _options(self) -> Sequence[tuple[str, int]]:
        return (
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            *_RECONNECT,
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


# A channel that lost its daemon tries to connect again after 0.1 s, then
# backs off to at most every second (gRPC's default grows to 2 minutes): a
# daemon back from a restart is found within a second, however long it was
# away, by the requests that wait for it (`effectd_client._reconnect`).
_RECONNECT = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


def _is_header_value(token: str) -> bool:
    # RFC 6750 b64token characters are a subset: visible ASCII, no spaces.
    return bool(token) and all("!" <= ch <= "~" for ch in token)


#: Read when no `token=` is given, so a deployment can hand agents a token
#: without a code change.
TOKEN_ENV = "EFFECTD_TOKEN"  # noqa: S105 - the variable's name, not a token


def connection(
    target: str | Connection,
    *,
    token: str | None = None,
    tls: bool = False,
    root_certificates: bytes | None = None,
    certificate_chain: bytes | None = None,
    private_key: bytes | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> Connection:
    """The `Connection` an entry point uses: `target` itself when it is one
    (then with no keyword option: TypeError), else one of the keywords.

    A token of None is `EFFECTD_TOKEN` from the environment when it is set;
    "" sends no token even then.
    """
    if isinstance(target, Connection):
        keywords = (
            token,
            tls,
            root_certificates,
            certificate_chain,
            private_key,
            max_message_bytes,
        )
        if keywords != (None, False, None, None, None, DEFAULT_MAX_MESSAGE_BYTES):
            raise TypeError(
                "connection options: give them in the Connection or as "
                "keywords, not both"
            )
        chosen = target
    else:
        chosen = Connection(
            target=target,
            token=token,
            tls=tls,
            root_certificates=root_certificates,
            certificate_chain=certificate_chain,
            private_key=private_key,
            max_message_bytes=max_message_bytes,
        )
    if chosen.token is not None:
        return chosen
    return dataclasses.replace(chosen, token=os.environ.get(TOKEN_ENV, ""))


__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "TOKEN_ENV", "Connection", "connection"]
