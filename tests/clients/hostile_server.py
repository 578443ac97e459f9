"""A TCP server on 127.0.0.1 that misbehaves the way real networks do.

Each mode is what a tool's client library meets when the outcome of its
request is unknown: the request was sent (and maybe acted on), but no answer
came back whole.

  HANG     reads the request and never answers (read timeouts)
  RESET    reads the request, then resets the connection (RST)
  CLOSE    reads the request, then closes without a byte of answer
  PARTIAL  reads the request, answers half a body, then closes
  STALL    accepts and never reads (a big upload gets a write timeout)
"""

from __future__ import annotations

import enum
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress


class Mode(enum.Enum):
    HANG = "hang"
    RESET = "reset"
    CLOSE = "close"
    PARTIAL = "partial"
    STALL = "stall"


PARTIAL_ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n" + b'{"ok": tr'
)


def _read_request(conn: socket.socket) -> None:
    """Reads the whole request (headers and a Content-Length body): a close
    with unread data would be a reset, whatever the mode."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
        if data.startswith(b"PRI * HTTP/2.0"):
            return  # gRPC: the preface is all it waits for
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


class HostileServer:
    """Serves one `Mode` on 127.0.0.1 until closed; `url` is its address."""

    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._closed = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            if self.mode is Mode.STALL:
                self._closed.wait()
                return
            _read_request(conn)
            if self.mode is Mode.HANG:
                self._closed.wait()
            elif self.mode is Mode.RESET:
                # SO_LINGER 0: close() sends RST instead of FIN.
                conn.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
            elif self.mode is Mode.PARTIAL:
                conn.sendall(PARTIAL_ANSWER)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._closed.set()
        # shutdown() wakes the accept() blocked in the serving thread.
        with suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for conn in self._conns:
                conn.close()
        self._thread.join(timeout=10)


@contextmanager
def hostile(mode: Mode) -> Iterator[HostileServer]:
    server = HostileServer(mode)
    try:
        yield server
    finally:
        server.close()
