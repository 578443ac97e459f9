"""The safe tool call: the whole ADR-010 protocol around one tool function.

`Run(client, run_id)` names an agent run; `run.call(...)` is a context manager
and `run.tool(...)` a decorator that prepare and start the call, replay a
committed result without calling the tool, refuse (raise) when the ledger says
not to execute, pass the stable idempotency key to IDEMPOTENT_WRITE tools, and
commit the result, an error result, or report the outcome unknown.
`AsyncRun` (`effectd_client._safe_aio`) does the same with an `AsyncClient`
and async tools.

Call ids are never random: either explicit (`tool.at("step-3")`) or
`"{tool_name}-{n}"`, the n-th call of that tool in this `Run` object, so a
restarted agent that replays the same steps asks for the same calls.

Outcomes of the tool, as the ledger records them:
  returns                                   -> committed OK (JSON, or bytes)
  raises OutcomeUnknown, TimeoutError       -> ReportUnknown, re-raised
    (asyncio.TimeoutError), ConnectionError,
    or its task is cancelled
  raises any other Exception                -> committed ERROR (code = class
                                               name, or `error_code` attribute)
  KeyboardInterrupt, SystemExit             -> left STARTED: a crash; its
                                               lease runs out (Recover)
"""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar

from effectd_client._client import Client
from effectd_client._exceptions import (
    ApprovalPending,
    CallInProgress,
    CallRejected,
    OutcomeUnknown,
    ReconciliationNeeded,
    RetryRequired,
    ToolFailed,
)
from effectd_client._requests import payload
from effectd_client._types import (
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
UNKNOWN_OUTCOMES = (
    OutcomeUnknown,
    TimeoutError,
    ConnectionError,
    asyncio.CancelledError,
)


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
            raise RetryRequired(
                "the last attempt's outcome is unknown; pass retry_unknown=True "
                "to retry this READ or IDEMPOTENT_WRITE",
                p.call,
            )
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


def error_of(exc: Exception) -> tuple[str, str]:
    code = getattr(exc, "error_code", None)
    return (code if isinstance(code, str) and code else type(exc).__name__), str(exc)


def check_tool(fn: Callable[..., Any], options: CallOptions) -> None:
    """An IDEMPOTENT_WRITE tool must take the key: refused at decoration time.

    Found later, the TypeError would be committed as the call's error result.
    """
    if options.effect is not Effect.IDEMPOTENT_WRITE:
        return
    params = inspect.signature(fn).parameters.values()
    if not any(
        p.name == KEY_PARAMETER or p.kind is inspect.Parameter.VAR_KEYWORD
        for p in params
    ):
        raise TypeError(
            f"{fn.__name__}: an IDEMPOTENT_WRITE tool takes `{KEY_PARAMETER}`"
        )


def input_of(fn: Callable[..., Any], args: Any, kwargs: Any) -> dict[str, Any]:
    """The call's input: its bound arguments, without the idempotency key."""
    bound = inspect.signature(fn).bind(*args, **kwargs)
    return {k: v for k, v in bound.arguments.items() if k != KEY_PARAMETER}


@dataclass(frozen=True, slots=True)
class CallOptions:
    """How a decorated tool is called; see `Run.call`."""

    effect: Effect = Effect.SIDE_EFFECT
    # Retry a READ or IDEMPOTENT_WRITE whose last attempt ended unknown
    # (StartTool with retry); never applies to SIDE_EFFECT.
    retry_unknown: bool = False
    # Results are bytes, committed and replayed as sent.
    raw: bool = False
    require_approval: bool = False


@dataclass(slots=True)
class SafeCall:
    """One tool call in a `Run.call` block.

    `execute` is True when this caller holds the attempt: run the tool and
    `set_result`. Otherwise `result` is the stored result: do not run it.
    """

    run_id: str
    call_id: str
    attempt: int
    idempotency_key: str
    execute: bool
    result: Any = None
    _raw: bool = field(default=False, repr=False)

    def set_result(self, value: Any) -> None:
        """The tool's result, committed when the block ends without error."""
        if self._raw and not isinstance(value, bytes | bytearray):
            raise TypeError("a raw call commits bytes")
        # Encoded now, inside the block: a result that is not JSON is then a
        # definite error of the call, committed, instead of a lost attempt.
        payload(value)
        self.result = value


class RunBase:
    def __init__(self, run_id: str, lease_ms: int) -> None:
        self.run_id = run_id
        self.lease_ms = lease_ms
        self._counts: dict[str, int] = {}
        self._replays: set[str] = set()

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
        self._replays = {
            i.call.call_id
            for i in plan.items
            if i.action is RecoveryAction.REPLAY_RESULT
        }
        return plan

    def _scope(self, p: Prepared, call_id: str, raw: bool) -> SafeCall:
        key = p.idempotency_key or p.call.idempotency_key
        if p.call.effect is not Effect.IDEMPOTENT_WRITE:
            key = ""
        return SafeCall(self.run_id, call_id, p.call.attempt, key, True, _raw=raw)


class Run(RunBase):
    """An agent run whose tool calls go through the ledger (sync client)."""

    def __init__(self, client: Client, run_id: str, *, lease_ms: int = 0) -> None:
        super().__init__(run_id, lease_ms)
        self.client = client

    def resume(self) -> RecoveryPlan:
        """Reads the run's recovery plan; raises if the run is interrupted.

        Committed calls are then replayed by the next call with their id (and
        acknowledged); EXECUTE and RETRY_NEEDS_POLICY items run as usual.
        """
        return self._take_plan(self.client.recover(self.run_id))

    @contextmanager
    def call(
        self,
        tool_name: str,
        input: Any,
        *,
        call_id: str | None = None,
        effect: Effect = Effect.SIDE_EFFECT,
        retry_unknown: bool = False,
        raw: bool = False,
        require_approval: bool = False,
    ) -> Iterator[SafeCall]:
        """Prepares and starts the call; commits or reports it at the end.

        Args:
            tool_name: The tool, part of the call's identity check.
            input: The tool's input (JSON value, or bytes), fingerprinted.
            call_id: The step's id; `{tool_name}-{n}` when None.
            effect: What the tool does to the world (ADR-010 D2).
            retry_unknown: Start a READ or IDEMPOTENT_WRITE whose last
                attempt ended unknown again (StartTool with retry).
            raw: The result is bytes, committed and replayed as sent.
            require_approval: The call waits for an approver first.

        Yields:
            The call: run the tool only when `execute` is True, and hand its
            result to `set_result`; otherwise `result` is the stored one.

        Raises:
            ToolCallStopped: The ledger says not to run it (a subclass per
                decision), or the stored result is an error (`ToolFailed`).
            EffectdError: The daemon refused a request.
        """
        call_id = call_id or self.next_call_id(tool_name)
        c = self.client
        p = c.prepare_tool(
            self.run_id,
            call_id,
            tool_name,
            input,
            effect=effect,
            require_approval=require_approval,
            start=True,
            lease_ms=self.lease_ms,
        )
        step = admit(p, retry_unknown=retry_unknown)
        if step is Next.REPLAY:
            assert p.call.result is not None
            if call_id in self._replays:
                c.acknowledge_recovery(self.run_id, [call_id])
                self._replays.discard(call_id)
            yield SafeCall(
                self.run_id,
                call_id,
                p.call.attempt,
                p.idempotency_key,
                False,
                decoded(p.call.result, raw),
            )
            return
        if step is not Next.EXECUTE:
            p = c.start_tool(
                self.run_id,
                call_id,
                retry=step is Next.RETRY,
                lease_ms=self.lease_ms,
            )
            check_started(p)
        scope = self._scope(p, call_id, raw)
        try:
            yield scope
        except UNKNOWN_OUTCOMES as exc:
            c.report_unknown(self.run_id, call_id, scope.attempt, repr(exc))
            raise
        except Exception as exc:
            code, message = error_of(exc)
            c.commit_tool(
                self.run_id,
                call_id,
                scope.attempt,
                error_code=code,
                error_message=message,
            )
            raise
        c.commit_tool(self.run_id, call_id, scope.attempt, scope.result)

    def tool(
        self,
        name: str | None = None,
        *,
        effect: Effect = Effect.SIDE_EFFECT,
        retry_unknown: bool = False,
        raw: bool = False,
        require_approval: bool = False,
    ) -> Callable[[Callable[P, R]], SafeTool[P, R]]:
        """Decorates a tool function; IDEMPOTENT_WRITE tools get `idempotency_key`.

        The input recorded is the function's bound arguments (JSON); a
        replayed result is the JSON-decoded stored value (bytes with `raw`).
        """

        def wrap(fn: Callable[P, R]) -> SafeTool[P, R]:
            options = CallOptions(effect, retry_unknown, raw, require_approval)
            check_tool(fn, options)
            return SafeTool(self, fn, name or fn.__name__, options)

        return wrap


class SafeTool(Generic[P, R]):
    """A tool function run through `Run.call`; see `Run.tool`."""

    def __init__(
        self,
        run: Run,
        fn: Callable[P, R],
        name: str,
        options: CallOptions,
    ) -> None:
        self.run, self.fn, self.name, self.options = run, fn, name, options
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Runs the next step of this tool (call id `{name}-{n}`)."""
        return self.at(self.run.next_call_id(self.name))(*args, **kwargs)

    def at(self, call_id: str) -> Callable[P, R]:
        """The tool bound to an explicit call id."""

        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            o = self.options
            with self.run.call(
                self.name,
                input_of(self.fn, args, kwargs),
                call_id=call_id,
                effect=o.effect,
                retry_unknown=o.retry_unknown,
                raw=o.raw,
                require_approval=o.require_approval,
            ) as step:
                if not step.execute:
                    return step.result  # type: ignore[no-any-return]
                if o.effect is Effect.IDEMPOTENT_WRITE:
                    kwargs[KEY_PARAMETER] = step.idempotency_key
                value = self.fn(*args, **kwargs)
                step.set_result(value)
                return value

        return call
