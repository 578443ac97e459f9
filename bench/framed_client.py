"""A sync client of the framed local transport, for the benchmarks.

    calls = FramedCalls.connect("unix:/path/effectd.sock")
    client._tool = calls   # the Python client's ledger requests, framed

A blocking Unix socket in the calling thread, no helper threads: each call
writes its frame (`sidecar.rpc.framed`: a 4-byte big-endian length, then a
`SessionRequest`) and reads frames until its own answer comes. The methods
look like a gRPC stub's (`(request, timeout=, metadata=)`), so a `Client`
whose ledger calls are replaced by these runs its safe calls over the framed
transport with nothing else changed; errors are the session's
`SessionRpcError`s, read by the client as a unary call's. One lock serializes
the calls of several threads (the Run's watcher sends heartbeats).
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

from effectd.v1 import ledger_pb2 as pb

from effectd_client import _session_wire as wire

HELLO = b"effectd-framed/1\n"
HEADER = struct.Struct(">I")
SUFFIX = ".framed"


class FramedCalls:
    """The ledger requests of one client over one framed connection."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._buffer = bytearray()
        self._next = 1
        for name in wire.FIELDS:
            setattr(self, name, self._method(name))

    @classmethod
    def connect(cls, target: str, token: str = "") -> FramedCalls:
        """A connection to the daemon whose gRPC socket is `target`
        (`unix:PATH`), welcomed, or raises its refusal."""
        path = target.removeprefix("unix:") + SUFFIX
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        calls = cls(sock)
        calls._send(HELLO + token.encode())
        welcome = calls._receive()
        if welcome.WhichOneof("response") == "error":
            sock.close()
            raise wire.SessionRpcError(welcome.error)
        return calls

    def _method(self, name: str) -> Callable[..., Any]:
        def call(
            request: Any, timeout: float | None = None, metadata: Any = None
        ) -> Any:
            with self._lock:
                message_id = self._next
                self._next += 1
                message = wire.request(name, message_id, request, timeout)
                self._sock.settimeout(timeout)
                try:
                    self._send(message.SerializeToString())
                    while True:
                        answer = self._receive()
                        if answer.id == message_id:
                            return wire.outcome(name, answer)
                        if answer.id == 0:  # the end of the connection
                            raise wire.SessionRpcError(answer.error)
                except TimeoutError:
                    raise wire.deadline_exceeded() from None
                except OSError as exc:
                    raise wire.broken(True, repr(exc)) from None

        return call

    def _send(self, payload: bytes) -> None:
        self._sock.sendall(HEADER.pack(len(payload)) + payload)

    def _receive(self) -> pb.SessionResponse:
        buffer = self._buffer
        while True:
            if len(buffer) >= HEADER.size:
                (size,) = HEADER.unpack_from(buffer)
                end = HEADER.size + size
                if len(buffer) >= end:
                    answer = pb.SessionResponse.FromString(
                        bytes(buffer[HEADER.size : end])
                    )
                    del buffer[:end]
                    return answer
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                raise ConnectionResetError("the daemon closed the connection")
            buffer += chunk

    def close(self) -> None:
        self._sock.close()
