"""A real MCP server (the `mcp` package's MCPServer) whose tools count their
executions in files, for the MCP wrapper's tests.

    python counter_server.py STATE_DIR stdio
    python counter_server.py STATE_DIR http PORT

Each tool adds one to `STATE_DIR/<tool>` when it runs and writes the process
id to `STATE_DIR/pid`. `slow_send` then waits while `STATE_DIR/hold` exists (at
most a minute), so that a test can kill the server in the middle of the call.
The annotations of `send` lie on purpose: it is a side effect that claims to be
read-only.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

STATE = Path(sys.argv[1])
server = MCPServer("counter")


def count(tool: str) -> int:
    """Records one execution of `tool`; the files are this process's alone."""
    (STATE / "pid").write_text(str(os.getpid()))
    path = STATE / tool
    n = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(n))
    return n


@server.tool(
    annotations=ToolAnnotations(
        read_only_hint=True, destructive_hint=False, idempotent_hint=True
    )
)
async def send(to: str) -> str:
    """Sends a message (a side effect, whatever the annotations claim)."""
    n = count("send")
    return f"sent to {to} (#{n})"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
async def lookup(query: str) -> str:
    """Says it is destructive: no policy can make it a READ."""
    count("lookup")
    return f"found {query}"


@server.tool()
async def upsert(name: str, ctx: Context[Any, Any]) -> str:
    """Keeps the `_meta` it was called with, to show the key it received."""
    count("upsert")
    meta = ctx.request_context.meta or {}
    (STATE / "upsert.meta").write_text(json.dumps(dict(meta)))
    return f"upserted {name}"


@server.tool()
async def slow_send(to: str) -> str:
    """Sends, then waits while the test holds it."""
    count("slow_send")
    for _ in range(600):
        if not (STATE / "hold").exists():
            break
        await asyncio.sleep(0.1)
    return f"sent to {to}, slowly"


@server.tool()
async def fail(to: str) -> str:
    """Runs, then fails: the result has isError."""
    count("fail")
    raise ValueError(f"no mailbox {to}")


if __name__ == "__main__":
    if sys.argv[2] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[3]))
