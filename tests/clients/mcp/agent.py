"""An agent process for the MCP crash test: one tool call through the
wrapper, then it stops between the commit and its answer to the model.

    python agent.py TARGET STATE_DIR TRANSPORT PORT RUN_ID CALL_ID

It writes the result the model would see to `STATE_DIR/committed` and waits
there (at most a minute) for the test to kill it with SIGKILL.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from effectd_client import AsyncClient, AsyncRun
from effectd_client.contrib.mcp import LedgeredSession
from tests.clients.mcp.servers import connect


async def main(target: str, state: Path, transport: str, port: int) -> None:
    run_id, call_id = sys.argv[5], sys.argv[6]
    async with (
        AsyncClient(target) as effectd,
        connect(transport, state, port) as session,
    ):
        tools = LedgeredSession(session, AsyncRun(effectd, run_id), server="counter")
        result = await tools.call_tool("send", {"to": "ann"}, call_id=call_id)
        (state / "committed").write_text(result.model_dump_json())
        # The crash comes here, before the answer; the loop must not run on.
        time.sleep(60)  # noqa: ASYNC251 - blocking on purpose until the kill


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
