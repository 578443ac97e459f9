"""The Node MCP driver: `tests/adapters/node/mcp.mjs`, a host whose scripted
model decides the calls, and an MCP `Client` of `@modelcontextprotocol/sdk`
over the SDK's in-memory transport to an `McpServer` with the tool `book` in
the agent's process (a kill point in the tool kills the agent); the adapter
is `@effectd/client/mcp`'s LedgeredMcpClient around that client, the control
the bare `Client.callTool`. The calls of one model response are sent
together, and one pause names every call still waiting.

MCP has no agent loop of its own: the host's transcript is saved in the work
directory after every step and a run resumes from it, sending the calls
still without a result again under their call ids. A pause is what
`callTool` throws (`ApprovalPending`, `ReconciliationNeeded`; a
`CallInProgress` is sent again once the killed attempt's lease is out). A
finished step runs again from the transcript cut after the model response
that made its calls. An edited approval is the call sent again with other
arguments under its id."""

from __future__ import annotations

from typing import Any

from tests.adapters.drivers.mcp import NOT_APPLICABLE, call_tool_result
from tests.adapters.drivers.node import NodeDriver


class NodeMcpDriver(NodeDriver):
    def __init__(self) -> None:
        super().__init__("node_mcp", "mcp", ("transcript.json",))
        self.not_applicable = dict(NOT_APPLICABLE)

    def recorded_result(self, text: str) -> Any:
        return call_tool_result(text)


DRIVER = NodeMcpDriver()
