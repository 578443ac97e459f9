"""A loopback TCP proxy in front of PostgreSQL that can lose a commit's
answer: armed, it passes the next COMMIT (or the next message holding the
bytes it was armed with: a statement that commits on its own) to the
server, drops the server's reply and closes that connection, as a network
or a server crash would after the commit happened. It can also refuse
every new connection (the database unreachable)."""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class CommitCutter:
    """Forwards 127.0.0.1:`port` to `upstream` (host, port)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._armed: bytes | None = None
        self.refusing = False
        # Called when a COMMIT's answer is dropped, before the connection
        # closes (e.g. to make the database unreachable at that moment).
        self.on_cut: Callable[[], object] | None = None
        self.cuts = 0
        self._stopping = threading.Event()
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def arm(self, holding: bytes = b"COMMIT\x00") -> None:
        """Loses the answer of the next message that goes through holding
        `holding`: by default the COMMIT statement, ended by its NUL (not
        the BEGIN ISOLATION LEVEL READ COMMITTED of every transaction)."""
        with self._lock:
            self._armed = holding

    def _take_arm(self, data: bytes) -> bool:
        with self._lock:
            if self._armed is None or self._armed not in data:
                return False
            self._armed = None
            return True

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            try:
                server = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self._sockets += [client, server]
            cut = threading.Event()
            threading.Thread(
                target=self._pump, args=(client, server, cut, True), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(server, client, cut, False), daemon=True
            ).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, cut: threading.Event, up: bool
    ) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not up and cut.is_set():
                    # The COMMIT's answer: dropped, and the connection with it.
                    with self._lock:
                        self.cuts += 1
                    if self.on_cut is not None:
                        self.on_cut()
                    break
                if up and self._take_arm(data):
                    cut.set()
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._stopping.set()
        self._listener.close()
        self._thread.join(5)
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()


@contextmanager
def commit_cutter(url: str) -> Iterator[tuple[CommitCutter, str]]:
    """A proxy in front of the server of `url`; yields it and the URL that
    goes through it."""
    parts = urllib.parse.urlsplit(url)
    proxy = CommitCutter((parts.hostname or "127.0.0.1", parts.port or 5432))
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{proxy.port}"
    through = (netloc[0] + "@" + host) if len(netloc) == 2 else host
    # In clear, so the proxy sees the COMMIT.
    clear = "sslmode=disable&gssencmode=disable"
    query = "&".join(q for q in (parts.query, clear) if q)
    try:
        yield (
            proxy,
            urllib.parse.urlunsplit(parts._replace(netloc=through, query=query)),
        )
    finally:
        proxy.close()
