"""What both framed sessions (`effectd_client._frames`, sync, and
`effectd_client._frames_aio`, asyncio) share of the daemon's framed transport
(docs/contract.md §2.8): where its socket is and whether a client uses it,
the hello, a frame, and the failures of a message no connection took or
that was in flight at close."""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path
from typing import Any

import grpc
from effectd.v1 import ledger_pb2 as pb

from effectd_client import _session_wire as wire
from effectd_client._channel import Metadata

TRANSPORT_ENV = "EFFECTD_TRANSPORT"
#: Seconds of unary calls once the daemon is found serving gRPC without the
#: framed socket; then the framed socket is tried again.
NO_FRAMES_PAUSE = 5.0
#: A frame's header: the length of the message that follows.
HEADER = struct.Struct(">I")


def frames_of(grpc_socket: str) -> str:
    """The framed socket beside a daemon's gRPC socket (effectd.sock:
    effectd.frames.sock)."""
    path = Path(grpc_socket)
    return str(path.with_name(f"{path.stem}.frames{path.suffix}"))


def local_socket(target: str) -> str | None:
    """The gRPC socket of `target` when a client should use the framed one
    beside it: a `unix:` target whose daemon serves one, and
    `EFFECTD_TRANSPORT` not `grpc`."""
    if os.environ.get(TRANSPORT_ENV, "").strip().lower() == "grpc":
        return None
    if not target.startswith("unix:"):
        return None
    grpc_socket = target.removeprefix("unix:").removeprefix("//")
    return grpc_socket if Path(frames_of(grpc_socket)).exists() else None


def hello(metadata: Metadata) -> Any:
    """A connection's first frame: the version of the frames, and the
    `authorization` and `traceparent` of the client's metadata, as the
    stream's metadata carries them on gRPC."""
    values = dict(metadata)
    return pb.SessionHello(
        version=1,
        authorization=str(values.get("authorization", "")),
        traceparent=str(values.get("traceparent", "")),
    )


def frame(message: Any, max_bytes: int | None = None) -> bytes:
    """`message` as a frame: its length, then its bytes. One over
    `max_bytes` (the client's limit) is refused before any of it is sent,
    RESOURCE_EXHAUSTED as gRPC refuses it: the daemon would end the whole
    session at a frame over its own limit, leaving every message in flight
    on it unknown."""
    data: bytes = message.SerializeToString()
    if max_bytes is not None and len(data) > max_bytes:
        raise wire.failure(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"CLIENT: Sent message larger than max ({len(data)} vs. {max_bytes})",
        )
    return HEADER.pack(len(data)) + data


def grpc_alone(grpc_socket: str) -> bool:
    """Whether the daemon's gRPC socket takes a connection, its framed one
    having refused one: a daemon serving gRPC without the framed transport
    (started with --no-local-frames, or older than it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(grpc_socket)
        except OSError:
            return False
    return True


def at_close(sent: bool) -> Exception:
    """The failure of a message in flight when its client closes: a broken
    connection's (its outcome unknown) when it was sent, else CANCELLED."""
    return wire.broken(True, "the client was closed") if sent else wire.closed()


def not_connected(error: OSError) -> Exception:
    """A message no connection took: not sent (the client then waits for
    the daemon, as for a gRPC call that found no connection)."""
    return wire.broken(False, f"no connection to the framed socket: {error}")
