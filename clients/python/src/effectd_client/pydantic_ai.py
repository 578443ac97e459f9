"""The first import path of `effectd_client.contrib.pydantic_ai`
(docs/pydantic-ai.md), kept so that code written against it keeps working: the
same objects, re-exported.
"""

from effectd_client.contrib.pydantic_ai import (
    METADATA_KEY,
    DeferredCallsNotResumed,
    EffectdToolset,
    PolicyError,
    ToolDecision,
    ToolPolicy,
    ToolRule,
    decide_deferred,
    effectd_metadata,
)

__all__ = [
    "METADATA_KEY",
    "DeferredCallsNotResumed",
    "EffectdToolset",
    "PolicyError",
    "ToolDecision",
    "ToolPolicy",
    "ToolRule",
    "decide_deferred",
    "effectd_metadata",
]
