"""The console's listener: one thread per connection, at most
`max_connections` of them, each connection given `idle_timeout` seconds for
every read and write (the TLS handshake included, which happens in the
connection's own thread, never in the thread that accepts).

So a client that opens connections and sends half a request, or nothing,
holds a connection for `idle_timeout` at most, and a flood of them cannot
take more than `max_connections` threads: a connection over the limit is
answered 503 at once (closed, behind TLS) and the console keeps serving
the others.
"""

from __future__ import annotations

import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# What a connection over the limit is told, before its request is read.
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: 34\r\n\r\n"
    b"The console is busy; retry soon.\r\n"
)


class Listener(ThreadingHTTPServer):
    """A ThreadingHTTPServer with a bounded number of connections, each
    with a deadline on its every read and write."""

    daemon_threads = True
    # Connections the kernel holds until accepted: a burst of them is
    # accepted (and answered, or refused) at once, not retried by the
    # clients after their SYN was dropped.
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        *,
        max_connections: int,
        idle_timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)
        self.idle_timeout = idle_timeout
        self._tls = tls

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            # No thread took the connection, nor its slot.
            self._slots.release()
            raise

    def _refuse(self, request: socket.socket) -> None:
        try:
            if self._tls is None:
                request.settimeout(0)
                request.send(_BUSY)
        except OSError:
            pass
        finally:
            self.shutdown_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            request.settimeout(self.idle_timeout)
            if self._tls is not None:
                request = self._tls.wrap_socket(request, server_side=True)
            self.finish_request(request, client_address)
        except (OSError, ssl.SSLError):
            pass  # a client gone, too slow, or not speaking TLS
        except Exception:
            self.handle_error(request, client_address)
        finally:
            # The slot is free before the client sees its connection end:
            # a client that connects again at once finds it free.
            self._slots.release()
            self.shutdown_request(request)
