"""The first import path of `effectd_client.contrib.mcp`
(docs/mcp.md), kept so that code written against it keeps working: the
same objects, re-exported.
"""

from effectd_client.contrib.mcp import (
    EFFECT_NAMES,
    KEY_META,
    MCP_TOOL_ERROR,
    LedgeredSession,
    McpConnectionLost,
    McpDecision,
    McpPolicy,
    McpServerPolicy,
    PolicyError,
    SessionInvalidated,
    ToolRule,
    ledger_tool_name,
    unwrapped,
)

__all__ = [
    "EFFECT_NAMES",
    "KEY_META",
    "MCP_TOOL_ERROR",
    "LedgeredSession",
    "McpConnectionLost",
    "McpDecision",
    "McpPolicy",
    "McpServerPolicy",
    "PolicyError",
    "SessionInvalidated",
    "ToolRule",
    "ledger_tool_name",
    "unwrapped",
]
