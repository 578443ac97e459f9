"""The first import path of `effectd_client.contrib.langgraph`
(docs/langgraph.md), kept so that code written against it keeps working: the
same objects, re-exported.
"""

from effectd_client.contrib.langgraph import (
    KIND,
    TOOL_ERROR,
    ApprovalMismatch,
    DurabilityError,
    LedgeredToolCalls,
    PolicyError,
    ToolDecision,
    ToolPolicy,
    ToolRule,
    approve,
    reject,
    retry,
    thread_run_id,
)

__all__ = [
    "KIND",
    "TOOL_ERROR",
    "ApprovalMismatch",
    "DurabilityError",
    "LedgeredToolCalls",
    "PolicyError",
    "ToolDecision",
    "ToolPolicy",
    "ToolRule",
    "approve",
    "reject",
    "retry",
    "thread_run_id",
]
