"""A small typed client of effectd.

from effectd_client import Client

with Client("unix:.effectd/effectd.sock") as effectd:
    prepared = effectd.prepare_tool(
        "run-1", "call-1", "send_email", {"to": "a@b.c"}, start=True
    )
    if prepared.decision is Decision.EXECUTE:
        effectd.commit_tool("run-1", "call-1", prepared.call.attempt, {"sent": True})
"""

from effectd_client._client import Client as Client
from effectd_client._errors import EffectdError as EffectdError
from effectd_client._errors import FieldViolation as FieldViolation
from effectd_client._types import Checkpoint as Checkpoint
from effectd_client._types import Decision as Decision
from effectd_client._types import Effect as Effect
from effectd_client._types import PlanItem as PlanItem
from effectd_client._types import Prepared as Prepared
from effectd_client._types import RecoveryAction as RecoveryAction
from effectd_client._types import RecoveryPlan as RecoveryPlan
from effectd_client._types import State as State
from effectd_client._types import ToolCall as ToolCall
from effectd_client._types import ToolResult as ToolResult

__all__ = [
    "Checkpoint",
    "Client",
    "Decision",
    "Effect",
    "EffectdError",
    "FieldViolation",
    "PlanItem",
    "Prepared",
    "RecoveryAction",
    "RecoveryPlan",
    "State",
    "ToolCall",
    "ToolResult",
]
