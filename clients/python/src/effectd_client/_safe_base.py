"""What `Run` and `AsyncRun` share: the decisions, the options, the call scope,
and what the safe call says when the ledger does not record an outcome.

Everything here is free of I/O; `effectd_client._safe` and `_safe_aio` add
the client calls, the heartbeat and the deadline.
"""

from __future__ import annotations

import enum
import inspect
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from effectd_client._exceptions import (
    ApprovalPending,
    CallInProgress,
    CallRejected,
    EffectdError,
    InvalidTransition,
    ReconciliationNeeded,
    ResultNotRecorded,
    RetryRequired,
    ToolFailed,
)
from effectd_client._safe_outcomes import MAX_CODE_BYTES, Matcher, bounded_text
from effectd_client._types import (
    Channel,
    Decision,
    Effect,
    Prepared,
    RecoveryAction,
    RecoveryPlan,
    ToolResult,
)

P = ParamSpec("P")
R = TypeVar("R")

KEY_PARAMETER = "idempotency_key"
# The daemon's default lease, when neither the answer nor the run says one.
DEFAULT_LEASE_MS = 30_000


class Next(enum.Enum):
    EXECUTE = enum.auto()
    REPLAY = enum.auto()
    START = enum.auto()
    RETRY = enum.auto()


def admit(p: Prepared, *, retry_unknown: bool) -> Next:
    """What the safe call does with an answer; raises when it must not run."""
    match p.decision:
        case Decision.EXECUTE if p.attempt_held:
            return Next.EXECUTE
        case Decision.EXECUTE if p.retry_required:
            # ADR-010 D3: an unknown outcome is retried only when asked for,
            # and the daemon refuses it for SIDE_EFFECT whatever we ask.
            if retry_unknown and p.call.effect is not Effect.SIDE_EFFECT:
                return Next.RETRY
            raise RetryRequired(RETRY_REQUIRED, p.call)
        case Decision.EXECUTE:
            return Next.START
        case Decision.RETURN_RESULT:
            assert p.call.result is not None
            if not p.call.result.ok:
                raise ToolFailed(p.call, p.call.result)
            return Next.REPLAY
        case Decision.REJECTED:
            assert p.call.result is not None
            raise CallRejected("an approver rejected the call", p.call, p.call.result)
        case Decision.AWAIT_APPROVAL:
            raise ApprovalPending("the call waits for an approver", p.call)
        case Decision.IN_PROGRESS:
            raise CallInProgress("another attempt holds the call", p.call)
        case Decision.RECONCILE:
            raise ReconciliationNeeded(
                "a side effect of unknown outcome; an operator must reconcile it",
                p.call,
            )
    raise AssertionError(p.decision)  # pragma: no cover


RETRY_REQUIRED = (
    "the last attempt's outcome is unknown; pass retry_unknown=True to retry "
    "this READ or IDEMPOTENT_WRITE"
)


def asks_for_retry(exc: InvalidTransition) -> bool:
    """The daemon refused a start because the last attempt's outcome is
    unknown and no explicit retry was asked for."""
    return exc.metadata.get("retryRequired") == "true"


def check_started(p: Prepared) -> None:
    """A start that did not give us the attempt is a refusal."""
    if admit(p, retry_unknown=False) is not Next.EXECUTE:
        raise CallInProgress("the call could not be started", p.call)


def decoded(result: ToolResult, raw: bool) -> Any:
    if raw:
        return (
            result.raw if result.raw is not None else (result.json_text or "").encode()
        )
    return result.raw if result.raw is not None else result.value


def renews_after(refusal: EffectdError) -> bool:
    """Whether the lease renewals go on after a failed heartbeat: a lost one
    (the daemon not reached) is not fatal, since the commit is fenced by the
    attempt; a refused one (the lease is gone) ends them."""
    return refusal.code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED")


def unknown_not_recorded(refusal: EffectdError) -> str:
    """The note added to the tool's exception when its unknown outcome was not
    recorded: the lease runs out all the same, and the call ends UNKNOWN."""
    return f"effectd did not record the unknown outcome: {refusal}"


def unrecorded_reason(cause: Exception) -> str:
    """The reason of the last report, as UNKNOWN, of an outcome not recorded."""
    return bounded_text(f"the outcome could not be recorded: {cause!r}")


def failure_not_recorded(
    p: Prepared, code: str, error: BaseException
) -> ResultNotRecorded:
    """The tool failed, and the ledger did not record its error result."""
    return ResultNotRecorded(
        f"the tool failed ({code}) and the ledger did not record it",
        p.call,
        error=error,
    )


def result_not_recorded(p: Prepared, result: Any) -> ResultNotRecorded:
    """The tool returned, and the ledger did not record its result."""
    return ResultNotRecorded(
        "the tool returned and the ledger did not record its result",
        p.call,
        result=result,
    )


def error_of(exc: BaseException) -> tuple[str, str]:
    """The error result of a definite failure, within the daemon's limits."""
    code = getattr(exc, "error_code", None)
    name = code if isinstance(code, str) and code.strip() else type(exc).__name__
    return bounded_text(name, MAX_CODE_BYTES), bounded_text(str(exc))


def error_result_of(exc: BaseException) -> Any:
    """The payload an error result keeps: the exception's `error_result`
    attribute (a JSON value or bytes), e.g. an MCP tool result with `isError`,
    replayed to whoever repeats the call; None: code and message only."""
    return getattr(exc, "error_result", None)


@dataclass(frozen=True, slots=True)
class CallOptions:
    """How a tool is called; see `Run.call`."""

    effect: Effect = Effect.SIDE_EFFECT
    # Retry a READ or IDEMPOTENT_WRITE whose last attempt ended unknown
    # (StartTool with retry); never applies to SIDE_EFFECT.
    retry_unknown: bool = False
    # Results are bytes, committed and replayed as sent.
    raw: bool = False
    require_approval: bool = False
    # Seconds the tool may run (ADR-010 D2: the deadline is inside the call
    # boundary); past it the outcome is unknown. None: no deadline.
    timeout: float | None = None
    # The tool's own classification of its exceptions (see `is_unknown`).
    unknown_on: tuple[Matcher, ...] = ()
    definite_on: tuple[Matcher, ...] = ()
    # Turns the return value into what is committed (JSON value or bytes).
    serialize: Callable[[Any], Any] | None = None
    # How the agent reaches the tool (part of the call's identity); the
    # daemon applies that channel's retry rules (ADR-010 D5 for MCP).
    channel: Channel = Channel.TOOL


def check_tool(fn: Callable[..., Any], options: CallOptions) -> None:
    """An IDEMPOTENT_WRITE tool must take the key by name: refused at
    decoration time, never found out by a call."""
    if options.effect is not Effect.IDEMPOTENT_WRITE:
        return
    params = inspect.signature(fn).parameters
    key = params.get(KEY_PARAMETER)
    if key is None and not any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    ):
        raise TypeError(
            f"{fn.__name__}: an IDEMPOTENT_WRITE tool takes `{KEY_PARAMETER}`"
        )
    if key is not None and key.kind is inspect.Parameter.POSITIONAL_ONLY:
        raise TypeError(
            f"{fn.__name__}: `{KEY_PARAMETER}` must be a keyword parameter; the "
            "safe call passes it by name"
        )


def input_of(
    fn: Callable[..., Any],
    args: Any,
    kwargs: Any,
    options: CallOptions,
    sig: inspect.Signature | None = None,
) -> dict[str, Any]:
    """The call's input: its bound arguments, without the idempotency key
    (`sig`: `fn`'s signature, when the caller has read it already: reading
    it costs more than the rest of building the input).

    For an IDEMPOTENT_WRITE the key is the safe call's to give: a caller that
    passes one is refused, and a key parameter without a default is bound to
    the key when the tool runs.
    """
    sig = sig or inspect.signature(fn)
    params = list(sig.parameters)
    key = sig.parameters.get(KEY_PARAMETER)
    extra: dict[str, Any] = {}
    if options.effect is Effect.IDEMPOTENT_WRITE:
        positional = key is not None and key.kind is key.POSITIONAL_OR_KEYWORD
        given = KEY_PARAMETER in kwargs or (
            positional and len(args) > params.index(KEY_PARAMETER)
        )
        if given:
            raise TypeError(
                f"{fn.__name__}: `{KEY_PARAMETER}` is given by the safe call "
                "(run_id:call_id); do not pass it"
            )
        if key is not None:
            extra[KEY_PARAMETER] = ""
    bound = sig.bind(*args, **kwargs, **extra)
    return {k: v for k, v in bound.arguments.items() if k != KEY_PARAMETER}


@dataclass(slots=True)
class SafeCall:
    """One tool call in a `Run.call` block.

    `execute` is True when this caller holds the attempt: run the tool and
    `set_result`. Otherwise `result` is the stored result: do not run it;
    `delivered` then says it was acknowledged as delivered to the transcript
    before (the plan's ALREADY_DELIVERED): a transcript that survived the
    crash has it already, so do not append it again.
    While the tool runs, `deadline` (a `time.monotonic()` value, None without
    a timeout) says when its outcome turns unknown, and `cancelled` is set
    once it has passed: a long tool should stop when it sees it.
    """

    run_id: str
    call_id: str
    attempt: int
    idempotency_key: str
    execute: bool
    result: Any = None
    deadline: float | None = None
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    delivered: bool = False

    def set_result(self, value: Any) -> None:
        """The tool's result, committed when the block ends without error.

        Any value: what JSON cannot say is encoded by the call's `serialize`
        hook, else by the fallback of `effectd_client._safe_outcomes.jsonable`.
        """
        self.result = value

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None without one)."""
        return None if self.deadline is None else self.deadline - time.monotonic()


# The call whose tool is running in this context (thread, task).
_CURRENT: ContextVar[SafeCall | None] = ContextVar("effectd_call", default=None)


def current_call() -> SafeCall | None:
    """The safe call whose tool runs here: its attempt, key, deadline and
    `cancelled` event; None outside a tool."""
    return _CURRENT.get()


class RunBase:
    def __init__(
        self,
        run_id: str,
        lease_ms: int,
        heartbeat_interval: float | None,
        acknowledge: bool,
    ) -> None:
        self.run_id = run_id
        self.lease_ms = lease_ms
        self.heartbeat_interval = heartbeat_interval
        self.acknowledge = acknowledge
        self._counts: dict[str, int] = {}

    def next_call_id(self, tool_name: str) -> str:
        """`{tool_name}-{n}`: deterministic in the order of this run's steps."""
        n = self._counts.get(tool_name, 0) + 1
        self._counts[tool_name] = n
        return f"{tool_name}-{n}"

    def _take_plan(self, plan: RecoveryPlan) -> RecoveryPlan:
        for item in plan.items:
            if item.action is RecoveryAction.RECONCILE:
                raise ReconciliationNeeded(
                    "the run is interrupted: reconcile this call", item.call
                )
            if item.action is RecoveryAction.WAIT_FOR_APPROVAL:
                raise ApprovalPending("the run waits for an approval", item.call)
        return plan

    def _replay(self, p: Prepared, call_id: str, options: CallOptions) -> SafeCall:
        """The block of a committed call: its stored result, not to run."""
        assert p.call.result is not None
        return SafeCall(
            self.run_id,
            call_id,
            p.call.attempt,
            p.idempotency_key,
            False,
            decoded(p.call.result, options.raw),
            delivered=p.call.acknowledged,
        )

    def _scope(self, p: Prepared, call_id: str, options: CallOptions) -> SafeCall:
        key = p.idempotency_key or p.call.idempotency_key
        if p.call.effect is not Effect.IDEMPOTENT_WRITE:
            key = ""
        deadline = None
        if options.timeout is not None:
            deadline = time.monotonic() + options.timeout
        return SafeCall(
            self.run_id, call_id, p.call.attempt, key, True, deadline=deadline
        )

    def _interval(self, p: Prepared) -> float:
        """Seconds between heartbeats: a third of the lease granted; 0: none."""
        if self.heartbeat_interval is not None:
            return self.heartbeat_interval
        lease_ms = p.call.lease_ms or self.lease_ms or DEFAULT_LEASE_MS
        return lease_ms / 3000
