"""A small typed client of effectd, and the safe tool call on top of it.

The safe tool call (see `effectd_client._safe` for every outcome):

    run = Run(Client("unix:.effectd/effectd.sock"), "run-1")
    send_email = run.tool("send_email", effect=Effect.SIDE_EFFECT)(send_email)
    receipt = send_email.at("mail-1")(to="a@b.c")  # runs at most once

`Client` (and `AsyncClient`) have one typed method per RPC of ToolLedger,
Checkpoints and Recovery; every refusal raises a subclass of `EffectdError`
named after its `ErrorReason`. They send the ledger's hot requests as
messages of one session stream (`session=False`: unary calls; see
`effectd_client._session_wire`).

`client.admin` and `client.operator` (`Admin`, `Operator`, and their async
twins) are the operator's surface: one method per RPC of the Admin service,
and a person's reads and decisions answering whole records; `effectd ctl`
and the web console are their users (`effectd_client._operator`).

`EffectdTransport` (and its async and httpx2 siblings) send an SDK's HTTP
requests through the daemon's Provider service: see `effectd_client._transport`.

Every entry point takes the same connection options, as one `Connection`
value in place of the target or as keywords: `token=` (sent as
`authorization: Bearer` metadata; default `EFFECTD_TOKEN`), TLS with
`root_certificates=`, `certificate_chain=` and `private_key=` (or `tls=True`
for the system roots), and `max_message_bytes=` (default 8 MiB, the
daemon's). `Run` and `AsyncRun` use their client's.

    daemon = Connection("127.0.0.1:50051", token=token, root_certificates=ca_pem)
    Client(daemon)  # or Client("127.0.0.1:50051", token=token, ...)
    EffectdTransport(daemon, route="openai")
"""

from effectd_client._aio import AsyncClient as AsyncClient
from effectd_client._channel import Connection as Connection
from effectd_client._client import Client as Client
from effectd_client._exceptions import AlreadyCommitted as AlreadyCommitted
from effectd_client._exceptions import ApprovalPending as ApprovalPending
from effectd_client._exceptions import AttemptsExhausted as AttemptsExhausted
from effectd_client._exceptions import CallInProgress as CallInProgress
from effectd_client._exceptions import CallRejected as CallRejected
from effectd_client._exceptions import ConcurrencyLimited as ConcurrencyLimited
from effectd_client._exceptions import DeadlineExceeded as DeadlineExceeded
from effectd_client._exceptions import EffectdError as EffectdError
from effectd_client._exceptions import FieldViolation as FieldViolation
from effectd_client._exceptions import InputMismatch as InputMismatch
from effectd_client._exceptions import InvalidRequest as InvalidRequest
from effectd_client._exceptions import InvalidTransition as InvalidTransition
from effectd_client._exceptions import McpNoReplay as McpNoReplay
from effectd_client._exceptions import MissingIdempotencyKey as MissingIdempotencyKey
from effectd_client._exceptions import NoPolicyFile as NoPolicyFile
from effectd_client._exceptions import NotFound as NotFound
from effectd_client._exceptions import NotImplementedYet as NotImplementedYet
from effectd_client._exceptions import OutcomeUnknown as OutcomeUnknown
from effectd_client._exceptions import PermissionDenied as PermissionDenied
from effectd_client._exceptions import PolicyInvalid as PolicyInvalid
from effectd_client._exceptions import QuotaExceeded as QuotaExceeded
from effectd_client._exceptions import RateLimited as RateLimited
from effectd_client._exceptions import ReconcileQuarantine as ReconcileQuarantine
from effectd_client._exceptions import ReconciliationNeeded as ReconciliationNeeded
from effectd_client._exceptions import ReconciliationRequired as ReconciliationRequired
from effectd_client._exceptions import ResultCompacted as ResultCompacted
from effectd_client._exceptions import ResultMismatch as ResultMismatch
from effectd_client._exceptions import ResultNotRecorded as ResultNotRecorded
from effectd_client._exceptions import RetryBudgetExhausted as RetryBudgetExhausted
from effectd_client._exceptions import RetryDisabled as RetryDisabled
from effectd_client._exceptions import RetryRequired as RetryRequired
from effectd_client._exceptions import RevisionConflict as RevisionConflict
from effectd_client._exceptions import RouteNotAllowed as RouteNotAllowed
from effectd_client._exceptions import RunNotReadOnly as RunNotReadOnly
from effectd_client._exceptions import ShuttingDown as ShuttingDown
from effectd_client._exceptions import SideEffectNotRetrySafe as SideEffectNotRetrySafe
from effectd_client._exceptions import StaleAttempt as StaleAttempt
from effectd_client._exceptions import StorageFull as StorageFull
from effectd_client._exceptions import StorageUnavailable as StorageUnavailable
from effectd_client._exceptions import ToolCallStopped as ToolCallStopped
from effectd_client._exceptions import ToolFailed as ToolFailed
from effectd_client._exceptions import ToolTimedOut as ToolTimedOut
from effectd_client._exceptions import Unauthenticated as Unauthenticated
from effectd_client._exceptions import UnsupportedKeyScheme as UnsupportedKeyScheme
from effectd_client._exceptions import (
    UpstreamDeadlineExceeded as UpstreamDeadlineExceeded,
)
from effectd_client._exceptions import UpstreamUnavailable as UpstreamUnavailable
from effectd_client._operator import Admin as Admin
from effectd_client._operator import Operator as Operator
from effectd_client._operator_aio import AsyncAdmin as AsyncAdmin
from effectd_client._operator_aio import AsyncOperator as AsyncOperator
from effectd_client._provider import is_hop_by_hop as is_hop_by_hop
from effectd_client._recording import RecordingRetry as RecordingRetry
from effectd_client._safe import Run as Run
from effectd_client._safe import SafeTool as SafeTool
from effectd_client._safe_aio import AsyncRun as AsyncRun
from effectd_client._safe_aio import AsyncSafeTool as AsyncSafeTool
from effectd_client._safe_base import CallOptions as CallOptions
from effectd_client._safe_base import SafeCall as SafeCall
from effectd_client._safe_base import current_call as current_call
from effectd_client._transport import AsyncEffectdTransport as AsyncEffectdTransport
from effectd_client._transport import (
    AsyncHttpx2EffectdTransport as AsyncHttpx2EffectdTransport,
)
from effectd_client._transport import EffectdTransport as EffectdTransport
from effectd_client._transport import (
    Httpx2EffectdTransport as Httpx2EffectdTransport,
)
from effectd_client._types import Caller as Caller
from effectd_client._types import Channel as Channel
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
    "Admin",
    "AlreadyCommitted",
    "ApprovalPending",
    "AsyncAdmin",
    "AsyncClient",
    "AsyncEffectdTransport",
    "AsyncHttpx2EffectdTransport",
    "AsyncOperator",
    "AsyncRun",
    "AsyncSafeTool",
    "AttemptsExhausted",
    "CallInProgress",
    "CallOptions",
    "CallRejected",
    "Caller",
    "Channel",
    "Checkpoint",
    "Client",
    "ConcurrencyLimited",
    "Connection",
    "DeadlineExceeded",
    "Decision",
    "Effect",
    "EffectdError",
    "EffectdTransport",
    "FieldViolation",
    "Httpx2EffectdTransport",
    "InputMismatch",
    "InvalidRequest",
    "InvalidTransition",
    "McpNoReplay",
    "MissingIdempotencyKey",
    "NoPolicyFile",
    "NotFound",
    "NotImplementedYet",
    "Operator",
    "OutcomeUnknown",
    "PermissionDenied",
    "PlanItem",
    "PolicyInvalid",
    "Prepared",
    "QuotaExceeded",
    "RateLimited",
    "ReconcileQuarantine",
    "ReconciliationNeeded",
    "ReconciliationRequired",
    "RecordingRetry",
    "RecoveryAction",
    "RecoveryPlan",
    "ResultCompacted",
    "ResultMismatch",
    "ResultNotRecorded",
    "RetryBudgetExhausted",
    "RetryDisabled",
    "RetryRequired",
    "RevisionConflict",
    "RouteNotAllowed",
    "Run",
    "RunNotReadOnly",
    "SafeCall",
    "SafeTool",
    "ShuttingDown",
    "SideEffectNotRetrySafe",
    "StaleAttempt",
    "State",
    "StorageFull",
    "StorageUnavailable",
    "ToolCall",
    "ToolCallStopped",
    "ToolFailed",
    "ToolResult",
    "ToolTimedOut",
    "Unauthenticated",
    "UnsupportedKeyScheme",
    "UpstreamDeadlineExceeded",
    "UpstreamUnavailable",
    "current_call",
    "is_hop_by_hop",
]
