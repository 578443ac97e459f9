"""A scripted HTTP/1.1 upstream on 127.0.0.1, served from its own thread.

Each request takes the next `Reply` of the script (the last one repeats):
a status with headers and body, a delay, an answer that never comes, a
reset after the request was read, or a server-sent-events body that ends,
or breaks off after its chunks. Every request and every client disconnect
is recorded, so tests can count what reached the upstream, and wait (on a
condition, never by polling) until it has.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Reply:
    status: int = 200
    headers: Sequence[tuple[str, str]] = ()
    body: bytes = b"{}"
    # Real seconds before the status line.
    delay: float = 0.0
    # Never answer: wait until the client goes away.
    hang: bool = False
    # Read the request, then reset the connection without an answer.
    reset: bool = False
    # A chunked text/event-stream body, one chunk per item.
    events: Sequence[bytes] | None = None
    # After the events: close without finishing the body (the stream dies).
    break_off: bool = False
    # After the events: send nothing more until the client goes away.
    stall: bool = False
    # After the events: wait until the test sets `hold` (10 s at most), then
    # send `then`, one chunk per item.
    hold: threading.Event | None = None
    then: Sequence[bytes] = ()


@dataclass(frozen=True, slots=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Upstream:
    script: list[Reply]
    seen: list[Seen] = field(default_factory=list)
    disconnects: int = 0
    base_url: str = ""
    _next: int = 0
    # Notified after each request and each disconnect is recorded.
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def wait_until(self, check: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Waits until `check()` holds after a request or a disconnect was
        recorded; False if `timeout` seconds pass first."""
        with self._changed:
            return self._changed.wait_for(check, timeout)

    def _recorded(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def reply(self) -> Reply:
        reply = self.script[min(self._next, len(self.script) - 1)]
        self._next += 1
        return reply

    async def handle(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            for _ in range(1000):
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                size = int(headers.get("content-length", "0"))
                body = await reader.readexactly(size) if size else b""
                self.seen.append(Seen(method, path, headers, body))
                self._recorded()
                if not await self._answer(self.reply(), reader, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.disconnects += 1
            self._recorded()
        finally:
            writer.close()

    async def _answer(
        self, reply: Reply, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.hang:
            await reader.read(1)  # returns when the client disconnects
            self.disconnects += 1
            self._recorded()
            return False
        if reply.reset:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
            writer.transport.abort()
            return False
        reason = "OK" if reply.status < 400 else "Error"
        out = [f"HTTP/1.1 {reply.status} {reason}"]
        out += [f"{n}: {v}" for n, v in reply.headers]
        if reply.events is None:
            out.append(f"content-length: {len(reply.body)}")
            writer.write(("\r\n".join(out) + "\r\n\r\n").encode() + reply.body)
            await writer.drain()
            return True
        out += ["content-type: text/event-stream", "transfer-encoding: chunked"]
        writer.write(("\r\n".join(out) + "\r\n\r\n").encode())
        for chunk in reply.events:
            writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            await writer.drain()
        if reply.hold is not None:
            await asyncio.to_thread(reply.hold.wait, 10.0)
            for chunk in reply.then:
                writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                await writer.drain()
        if reply.stall:
            await reader.read(1)
            self.disconnects += 1
            self._recorded()
            return False
        if reply.break_off:
            return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


@contextmanager
def serving(*script: Reply) -> Iterator[Upstream]:
    """Runs an upstream with `script` on 127.0.0.1 until the block ends."""
    upstream = Upstream(list(script) or [Reply()])
    loop = asyncio.new_event_loop()
    started = threading.Event()
    server: list[asyncio.Server] = []

    async def start() -> None:
        srv = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        upstream.base_url = f"http://127.0.0.1:{port}"
        server.append(srv)
        started.set()

    thread = threading.Thread(target=loop.run_forever, name="upstream", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    try:
        yield upstream
    finally:

        async def stop() -> None:
            server[0].close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
