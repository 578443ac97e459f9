"""The first import path of `effectd_client.contrib.openai_agents`
(docs/openai-agents.md), kept so that code written against it keeps working: the
same objects, re-exported.
"""

from effectd_client.contrib.openai_agents import (
    DEFAULT_REJECTION_MESSAGE,
    AgentLedger,
    ApprovalMismatch,
    LedgerInterruption,
    NoLedgerRun,
    PolicyError,
    ToolDecision,
    ToolPolicy,
    ToolRule,
    mcp_tool_name,
)

__all__ = [
    "DEFAULT_REJECTION_MESSAGE",
    "AgentLedger",
    "ApprovalMismatch",
    "LedgerInterruption",
    "NoLedgerRun",
    "PolicyError",
    "ToolDecision",
    "ToolPolicy",
    "ToolRule",
    "mcp_tool_name",
]
