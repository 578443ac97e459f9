"""What only the synchronous client does, beside its generated body.

`effectd_client._client` is written by `scripts/unasync.py` from the asyncio
client (`effectd_client._aio`); where a thread does what the event loop does
for the asyncio client, the difference is here: the client's resources freed
when it is dropped without `close()` (a finalizer), and the recovery plan read
with the next page asked for while the last one is converted (a gRPC future;
the asyncio client reads its pages in turn).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import grpc

from effectd_client._channel import Connection, Metadata
from effectd_client._exceptions import EffectdError
from effectd_client._frames import FramesSession
from effectd_client._frames_wire import local_socket
from effectd_client._session import Session, release
from effectd_client._types import RecoveryPlan


def session_of(
    connection: Connection, channel: grpc.Channel
) -> Session | FramesSession:
    """The client's ledger session: on the framed transport when the
    daemon serves it on this host (`_frames_wire.local_socket`), else the gRPC
    session stream of `channel`."""
    grpc_socket = local_socket(connection.target)
    if grpc_socket is not None:
        return FramesSession(
            grpc_socket, connection.metadata, connection.max_message_bytes
        )
    return Session(channel, connection.metadata)


def closer(
    client: object, session: Session | FramesSession | None, channel: grpc.Channel
) -> weakref.finalize[..., object]:
    """Closes `session` and `channel` once: when called, or when `client` is
    dropped without being closed (its stream and reader thread end too)."""
    return weakref.finalize(client, release, session, channel)


def recovered(
    call: Callable[[Any, Any], Any],
    recover: Any,
    request: Callable[[str], Any],
    timeout: float,
    metadata: Metadata,
) -> RecoveryPlan:
    """The whole plan: the first page by `call` (the client's, which waits
    for a daemon that is away), each next one as a future of the `recover`
    stub asked for before the page in hand is converted."""
    pages = []
    answer = call(recover, request(""))
    while True:
        token = answer.next_page_token
        if not token:
            pages.append(RecoveryPlan.from_pb(answer))
            return RecoveryPlan.joined(pages)
        upcoming = recover.future(request(token), timeout=timeout, metadata=metadata)
        try:
            pages.append(RecoveryPlan.from_pb(answer))
        except BaseException:
            upcoming.cancel()
            raise
        try:
            answer = upcoming.result()
        except grpc.RpcError as exc:
            raise EffectdError.from_rpc_error(exc) from None
