"""What `effectd_client.contrib.langgraph` does with one tool call of a step, written
once for `invoke` and `ainvoke`: a generator that yields what it needs done
(`Op`s: run the call once, pause, read or prepare a call, record a
decision, ask under the step's lock) and gets the answers; the wrapper
drives it with a `Client` or an `AsyncClient`.

The calls of one model message (a step) run side by side in the tools node,
and LangGraph surfaces one interrupt of the node per run. So a call that
needs a human asks for every call of its step that does: the interrupt's
value is this call's request plus `calls`, the request of each call of the
step waiting for an approval, a reconciliation or a retry (the ledger's
judgement: each sibling is prepared, never started, and its answer read).
The resume value answers any of them (one answer, or a list); whichever
call receives it records every decision, under the step's lock, so that
the others find themselves decided when they look again. An answer that
does not fit a call waiting in the step (another call, other arguments than
the call has) is refused: the node asks again, its value's `refused` says
why, and nothing is recorded or run.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Generator, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command, interrupt

from effectd_client import (
    ApprovalPending,
    CallInProgress,
    CallRejected,
    EffectdError,
    InputMismatch,
    InvalidTransition,
    Prepared,
    ReconciliationNeeded,
    RetryRequired,
    RevisionConflict,
    State,
    ToolCall,
    ToolCallStopped,
)
from effectd_client.contrib.langgraph._parts import (
    ApprovalMismatch,
    GraphToolCall,
    recorded_arguments,
    rejected_message,
    request,
)
from effectd_client.extend import admit, asks_for_retry
from effectd_client.policy import ToolPolicy

Output = ToolMessage | Command[Any]
# The pause between looks at a call another attempt holds.
IN_PROGRESS_POLL = 0.2
# Steps whose lock and granted retries are kept (least recently used dropped).
MAX_STEPS = 256
_STOPS: tuple[tuple[type[ToolCallStopped], str], ...] = (
    (ApprovalPending, "approval"),
    (ReconciliationNeeded, "reconcile"),
    (RetryRequired, "retry"),
    (CallInProgress, "in_progress"),
)


def _kind(stop: ToolCallStopped) -> str:
    """The interrupt's kind of a stop."""
    return next(kind for cls, kind in _STOPS if isinstance(stop, cls))


@dataclass(frozen=True, slots=True)
class Once:
    """Run the call through the safe call once; its output (or a stop)."""

    retry_unknown: bool


@dataclass(frozen=True, slots=True)
class Pause:
    seconds: float


@dataclass(frozen=True, slots=True)
class Look:
    """The ledger's record of the call."""

    call: GraphToolCall


@dataclass(frozen=True, slots=True)
class Prepare:
    """Prepare the call without starting it: the ledger's judgement of it."""

    call: GraphToolCall


@dataclass(frozen=True, slots=True)
class Decide:
    """Record an approver's answer (a decision already made is no error)."""

    call: GraphToolCall
    answer: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Ask:
    """Drive `body` under the step's lock; its answer."""

    step: StepState
    body: Asking


Op = Once | Pause | Look | Prepare | Decide | Ask
# A call's conduct (its output), and an ask under the step's lock (what it
# refused of the answer).
Conduct = Generator[Op, Any, Output]
Asking = Generator[Op, Any, str]


@dataclass(frozen=True, slots=True)
class Done:
    value: Any


def advance(
    work: Generator[Op, Any, Any], answer: Any, error: Exception | None
) -> Op | Done:
    """The next op of `work`, given the last op's answer or error; `Done`
    with its value once it returns."""
    try:
        return work.send(answer) if error is None else work.throw(error)
    except StopIteration as done:
        return Done(done.value)


@dataclass(slots=True)
class StepState:
    """What the calls of one step share in this process: the lock their
    asks take turns under, and the retries an answer granted."""

    lock: threading.Lock | asyncio.Lock
    retries: set[str] = field(default_factory=set)


class Steps:
    """The `StepState` of each step, by run and call ids (bounded)."""

    def __init__(self, *, threads: bool) -> None:
        self._threads = threads
        self._guard = threading.Lock()
        self._steps: OrderedDict[tuple[str, ...], StepState] = OrderedDict()

    def of(self, calls: list[GraphToolCall]) -> StepState:
        key = (calls[0].run_id, *sorted(c.call_id for c in calls))
        with self._guard:
            step = self._steps.get(key)
            if step is None:
                lock = threading.Lock() if self._threads else asyncio.Lock()
                step = self._steps[key] = StepState(lock)
                while len(self._steps) > MAX_STEPS:
                    self._steps.popitem(last=False)
            self._steps.move_to_end(key)
            return step


def siblings(
    req: ToolCallRequest, call: GraphToolCall, policy: ToolPolicy
) -> list[GraphToolCall]:
    """The calls of the model message that made `call`, in its order (just
    `call` when the node's state does not show the message)."""
    for message in reversed(_messages(req.state)):
        tool_calls = getattr(message, "tool_calls", None) or []
        ids = [str(tc.get("id")) for tc in tool_calls]
        if call.call_id in ids:
            return [
                call
                if str(tc.get("id")) == call.call_id
                else GraphToolCall(
                    call.run_id,
                    str(tc.get("id")),
                    tc["name"],
                    dict(tc["args"]),
                    policy.decide(tc["name"]),
                )
                for tc in tool_calls
                if tc.get("id")
            ]
    return [call]


def _messages(state: Any) -> list[Any]:
    if isinstance(state, list):
        return state
    if isinstance(state, Mapping):
        found = state.get("messages")
        return found if isinstance(found, list) else []
    found = getattr(state, "messages", None)
    return found if isinstance(found, list) else []


def conduct(
    call: GraphToolCall,
    step_calls: list[GraphToolCall],
    step: StepState,
    rounds: Iterable[int],
    in_progress_wait: float,
) -> Conduct:
    """One tool call of a step, from its first look to its output."""
    waiting_until, refused = 0.0, ""
    for _ in rounds:
        stop: ToolCallStopped
        try:
            output: Output = yield Once(call.call_id in step.retries)
            return output
        except CallRejected as rejected:
            return rejected_message(call, rejected)
        except CallInProgress as busy:
            waiting_until = waiting_until or time.monotonic() + in_progress_wait
            if time.monotonic() < waiting_until:
                yield Pause(IN_PROGRESS_POLL)
                continue
            # Never an error result: the model would call it anew.
            waiting_until, stop = 0.0, busy
        except (ApprovalPending, ReconciliationNeeded, RetryRequired) as stopped:
            stop = stopped
        kind, record = _kind(stop), stop.call
        body = ask(
            kind, call, record, step_calls=step_calls, step=step, refused=refused
        )
        refused = yield Ask(step, body)
    raise RuntimeError(f"{call.call_id}: stopped after its looks")


def ask(
    kind: str,
    call: GraphToolCall,
    record: ToolCall,
    *,
    step_calls: list[GraphToolCall],
    step: StepState,
    refused: str,
) -> Asking:
    """Under the step's lock: unless another call's answer settled this one
    meanwhile, interrupt for every call of the step waiting for a human, and
    take the answer; what was refused of it ("" for nothing)."""
    if kind != "in_progress":
        if kind == "retry" and call.call_id in step.retries:
            return ""
        record = yield Look(call)
        if not _waits(kind, record):
            return ""
    waiting: dict[str, tuple[GraphToolCall, ToolCall]] = {}
    shown = []
    for other in step_calls:
        if other.call_id == call.call_id:
            found: tuple[str, ToolCall] | None = (kind, record)
        else:
            found = yield from _judged(other)
        if found is not None:
            waiting[other.call_id] = (other, found[1])
            shown.append(request(found[0], other, found[1]))
    value = {**request(kind, call, record), "calls": shown}
    if refused:
        value["refused"] = refused
    answer = interrupt(value)
    return (yield from take(answer, call.run_id, waiting, step))


def _waits(kind: str, record: ToolCall) -> bool:
    """The call still waits for what it stopped for."""
    if kind == "approval":
        return record.state is State.AWAITING_APPROVAL
    return record.state in (State.UNKNOWN, State.STARTED)


def _judged(call: GraphToolCall) -> Generator[Op, Any, tuple[str, ToolCall] | None]:
    """What a human must do about a sibling, in the ledger's judgement."""
    try:
        p: Prepared = yield Prepare(call)
        admit(p, retry_unknown=call.decision.retry_unknown is True)
    except InvalidTransition as refused:
        if not asks_for_retry(refused):
            return None
        return "retry", (yield Look(call))
    except (ApprovalPending, ReconciliationNeeded, RetryRequired) as stop:
        return _kind(stop), stop.call
    except (ToolCallStopped, EffectdError):
        return None  # in progress, decided, settled: its own look says
    return None


def take(
    answer: Any,
    run_id: str,
    waiting: Mapping[str, tuple[GraphToolCall, ToolCall]],
    step: StepState,
) -> Asking:
    """Records the decisions and grants the retries of a resume value (one
    answer, or a list) for the calls waiting; what it refused."""
    answers = answer if isinstance(answer, list) else [answer]
    refusals = []
    for given in answers:
        if not isinstance(given, Mapping) or not (
            "approve" in given or given.get("retry") is True
        ):
            continue  # "look again" (decided in effectd, reconciled)
        try:
            target = _target(given, run_id, waiting)
            if "approve" in given:
                # Decided already (before a crash, in effectd): the look says.
                with suppress(InvalidTransition, RevisionConflict):
                    yield Decide(target, given)
            else:
                step.retries.add(target.call_id)
        except (ApprovalMismatch, InputMismatch) as mismatch:
            refusals.append(str(mismatch))
    return "; ".join(refusals)


def _target(
    given: Mapping[str, Any],
    run_id: str,
    waiting: Mapping[str, tuple[GraphToolCall, ToolCall]],
) -> GraphToolCall:
    """The waiting call an answer is about, once it shows that call's
    arguments as effectd recorded them."""
    named = (given.get("run_id"), given.get("call_id"))
    found = waiting.get(str(named[1])) if named[0] == run_id else None
    if found is None:
        raise ApprovalMismatch(
            f"the answer is about call {named[1]!r} of run {named[0]!r}, which "
            f"does not wait for a human in this step of run {run_id!r}"
        )
    call, record = found
    if given.get("input_fingerprint") != record.input_fingerprint:
        raise ApprovalMismatch(
            f"the answer for call {call.call_id!r} is about other arguments than "
            "the call waiting has"
        )
    if _json(given.get("arguments")) != _json(recorded_arguments(call, record)):
        raise ApprovalMismatch(
            f"the answer for call {call.call_id!r} shows other arguments "
            f"({given.get('arguments')!r}) than effectd recorded: the approver "
            "would decide what they did not see"
        )
    return call


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
