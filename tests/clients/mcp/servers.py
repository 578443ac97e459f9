"""Real MCP servers for the wrapper's tests: `counter_server.py` over stdio
(spawned by the SDK's stdio client) or over Streamable HTTP on 127.0.0.1 (a
subprocess the test owns)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path

import httpx2
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

SERVER = Path(__file__).with_name("counter_server.py")
TRANSPORTS = ("stdio", "http")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def executions(state: Path, tool: str) -> int:
    """How often the server ran `tool` (its own count, in a file)."""
    path = state / tool
    return int(path.read_text()) if path.exists() else 0


def wait_for(predicate: object, what: str, seconds: float = 30.0) -> None:
    """Polls `predicate` until it holds; bounded."""
    assert callable(predicate)
    for _ in range(int(seconds / 0.05)):
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def kill_server(state: Path) -> None:
    """SIGKILL to the server process this test started (its pid file)."""
    os.kill(int((state / "pid").read_text()), signal.SIGKILL)


@contextmanager
def http_server(state: Path) -> Iterator[int]:
    """The counter server on Streamable HTTP; yields its port."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER), str(state), "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def accepting() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_for(accepting, "the MCP server to listen")
        yield port
    finally:
        process.kill()
        process.wait(timeout=30)


@asynccontextmanager
async def connect(
    transport: str, state: Path, port: int = 0
) -> AsyncIterator[ClientSession]:
    """An initialized session to the counter server (`port` for HTTP)."""
    async with AsyncExitStack() as stack:
        if transport == "stdio":
            params = StdioServerParameters(
                command=sys.executable, args=[str(SERVER), str(state), "stdio"]
            )
            # Opening the null device does not block the loop.
            errlog = stack.enter_context(open(os.devnull, "w"))  # noqa: SIM115, ASYNC230
            streams = stdio_client(params, errlog=errlog)
        else:
            # The transport does not close a client it is given.
            http = await stack.enter_async_context(
                httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=120))
            )
            streams = streamable_http_client(
                f"http://127.0.0.1:{port}/mcp", http_client=http
            )
        read, write = await stack.enter_async_context(streams)
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        yield session
