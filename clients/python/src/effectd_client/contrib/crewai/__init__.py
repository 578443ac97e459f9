"""CrewAI tool calls through the ledger: `CrewLedger`.

Install with `pip install effectd-client[crewai]`; `import effectd_client`
alone never imports CrewAI. `CrewLedger(client, run_id).wrap(tools)` wraps
CrewAI tools (`BaseTool`, `@tool` functions) so that each call runs through
the safe call (`Run.call`), keyed by the ledger's run and a call id of the
call's place in the run: `<tool>-<n>` for the n-th call since the ledger was
made (or what `call_id(tool, n)` names it). CrewAI's agent loop names no
call (its model writes one `Action:` per answer), and a crew started again
after a crash, or a task replayed (`crew.replay`), makes its calls again from
the start: the n-th call finds what the n-th call did. The ledger holds each call to the
arguments it was first made with: the same place with other arguments is
refused (`InputMismatch`, a pause), never run. With the effect the
operator's `ToolPolicy` gives the tool (SIDE_EFFECT when it says nothing):

  committed before (same call)        -> its stored result; the tool does
                                         not run
  the tool returns                    -> committed, then handed to the model
  the tool raises a definite error    -> committed ERROR; the model reads
                                         "error: ..." (CrewAI would retry a
                                         raising tool), now and on every repeat
  the outcome is unknown (a timeout,  -> `LedgerPause` (reconcile): never run
    a crash mid-tool, a lease run out)   again; an operator reconciles it, and
                                         the crew started again gets the result
                                         found (or runs it once, verifiably
                                         never run)
  the policy requires approval        -> `LedgerPause` (approve) until an
                                         approver decides in effectd
  the same call with other arguments  -> `LedgerPause` (approve or reconcile,
    (a hook edited them)                 `refused` says why); nothing runs
  rejected by an approver             -> "error: an approver rejected ..." for
                                         the model; nothing runs
  another attempt holds a live lease  -> waits (`in_progress_wait`), then a
                                         `LedgerPause` (wait)

`LedgerPause` stops the crew: it is a `BaseException`, so that CrewAI's tool
loop, which turns a tool's `Exception` into a retry or a message for the
model, lets it through `crew.kickoff()` to the caller, with the ledger's
facts (`facts`). A CrewAI `before_tool_call` hook that lets a call through
(CrewAI's own approval gate) authorizes nothing: only a decision recorded in
effectd does (`decide`, `effectd ctl approve`, the console).

    ledger = CrewLedger(Client(target), "trip-7", policy=POLICY)
    agent = Agent(role=..., goal=..., backstory=..., llm=llm,
                  tools=ledger.wrap([book, search]))
    try:
        crew.kickoff()
    except LedgerPause as pause:
        print(pause.facts["action"], pause.facts["show"])
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from crewai.tools import BaseTool

from effectd_client import (
    ApprovalPending,
    CallInProgress,
    CallRejected,
    Client,
    Effect,
    InputMismatch,
    ReconciliationNeeded,
    RetryRequired,
    Run,
    State,
    ToolCall,
    ToolFailed,
    ToolTimedOut,
)
from effectd_client.extend import is_unknown
from effectd_client.policy import PolicyError, ToolDecision, ToolPolicy, ToolRule

__all__ = [
    "ApprovalMismatch",
    "CrewLedger",
    "LedgerPause",
    "LedgeredTool",
    "PolicyError",
    "ToolDecision",
    "ToolPolicy",
    "ToolRule",
    "decide",
]

# The pause between looks at a call another attempt holds.
IN_PROGRESS_POLL = 0.2
_SLUG = re.compile(r"[^A-Za-z0-9_.-]+")


class ApprovalMismatch(ValueError):
    """A decision shows other arguments than the call waiting has."""


class LedgerPause(BaseException):
    """The crew stops: a call waits for a human in effectd (see the module).
    `facts`: the ledger's call (`run_id`, `call_id`, `tool`, `arguments`,
    `state`, `effect`, `revision`, `input_fingerprint`), what to do
    (`action`: `approve`, `reconcile`, `wait`), `show` (the `effectd ctl`
    command), and `refused` when other arguments were refused."""

    def __init__(self, facts: Mapping[str, Any]) -> None:
        self.facts = dict(facts)
        refused = f"; refused: {facts['refused']}" if facts.get("refused") else ""
        super().__init__(
            f"{facts['call_id']} waits for a human ({facts['action']}, "
            f"{facts['state']}){refused}: {facts['show']}"
        )


class CrewLedger:
    """The ledger of one crew run (see the module docs).

    Args:
        client: The effectd client (CrewAI's tools are synchronous).
        run_id: The ledger's run: the same for a crew started again after a
            crash, a new one for a new run.
        policy: The operator's `ToolPolicy`, or its rules by tool name (a
            `ToolRule` or an `Effect`); a tool not named is a SIDE_EFFECT
            without approval. `retry_unknown=True` runs a READ or
            IDEMPOTENT_WRITE of unknown outcome again.
        lease_ms: The lease of a started call (0: the daemon's default).
        timeout: Seconds a call may run; past it the outcome is unknown.
        in_progress_wait: Seconds to wait for another attempt's lease (a
            crashed process's) before pausing.
        call_id: The id of the n-th call (from 1) of the run, given the
            tool's name and n; default `<tool>-<n>`.
    """

    def __init__(
        self,
        client: Client,
        run_id: str,
        *,
        policy: ToolPolicy | Mapping[str, ToolRule | Effect] | None = None,
        lease_ms: int = 0,
        timeout: float | None = None,
        in_progress_wait: float = 30.0,
        call_id: Callable[[str, int], str] | None = None,
    ) -> None:
        self.client, self.run_id = client, run_id
        self.call_id = call_id or _default_call_id
        self.policy = ToolPolicy.of(policy)
        self.timeout, self.in_progress_wait = timeout, in_progress_wait
        self.run = Run(client, run_id, lease_ms=lease_ms)
        self._calls = 0
        self._guard = threading.Lock()

    def wrap(self, tools: Sequence[BaseTool]) -> list[BaseTool]:
        """The tools, each call of each through this ledger."""
        return [LedgeredTool(tool=t, ledger=self) for t in tools]

    def next_call_id(self, tool: str) -> str:
        """The id of the run's next call, a call of `tool` (see `call_id`)."""
        with self._guard:
            self._calls += 1
            n = self._calls
        return self.call_id(tool, n)

    def call(self, tool: BaseTool, args: dict[str, Any]) -> Any:
        """Runs `tool` at most once for its place in the run."""
        call_id = self.next_call_id(tool.name)
        decided = self.policy.decide(tool.name)
        waiting_until = time.monotonic() + self.in_progress_wait
        while True:
            try:
                return self._once(tool, call_id, args, decided)
            except CallInProgress as busy:
                if time.monotonic() < waiting_until:
                    time.sleep(IN_PROGRESS_POLL)
                    continue
                raise LedgerPause(facts_of(busy.call, "wait", args)) from None
            except InputMismatch as mismatch:
                record = self.client.get_tool_call(self.run_id, call_id)
                facts = facts_of(record, _action(record), args)
                facts["refused"] = str(mismatch)
                raise LedgerPause(facts) from None
            except ApprovalPending as pending:
                raise LedgerPause(facts_of(pending.call, "approve", args)) from None
            except (ReconciliationNeeded, RetryRequired) as stopped:
                raise LedgerPause(facts_of(stopped.call, "reconcile", args)) from None
            except CallRejected as rejected:
                message = rejected.result.error_message
                return f"error: an approver rejected the call: {message}"
            except ToolFailed as failed:
                result = failed.result
                return f"error: {result.error_message or result.error_code}"

    def _once(
        self, tool: BaseTool, call_id: str, args: dict[str, Any], decided: ToolDecision
    ) -> Any:
        ran = False
        try:
            with self.run.call(
                tool.name,
                args,
                call_id=call_id,
                effect=decided.effect,
                retry_unknown=bool(decided.retry_unknown),
                require_approval=decided.require_approval,
                timeout=self.timeout,
                serialize=_serialize,
            ) as step:
                if not step.execute:
                    return step.result
                ran = True
                value = tool.run(**args)
                step.set_result(value)
                return value
        except Exception as exc:
            if not ran:
                raise
            if isinstance(exc, ToolTimedOut) or is_unknown(exc):
                call = self.client.get_tool_call(self.run_id, call_id)
                raise LedgerPause(facts_of(call, "reconcile", args)) from exc
            # Committed as an error: the model reads it (CrewAI would retry).
            return f"error: {exc}"


class LedgeredTool(BaseTool):  # type: ignore[misc]  # CrewAI's types live in .venv-crewai
    """A CrewAI tool whose calls go through a `CrewLedger`."""

    tool: BaseTool
    ledger: Any

    def __init__(self, *, tool: BaseTool, ledger: CrewLedger) -> None:
        super().__init__(
            name=tool.name,
            description=tool.description,
            args_schema=tool.args_schema,
            result_as_answer=tool.result_as_answer,
            tool=tool,
            ledger=ledger,
        )

    def _generate_description(self) -> None:
        """The wrapped tool's description, as CrewAI made it."""
        self.description = self.tool.description

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError(f"{self.name}: call it with keyword arguments")
        return self.ledger.call(self.tool, kwargs)


def _default_call_id(tool: str, n: int) -> str:
    return f"{_SLUG.sub('_', tool)}-{n}"


def _action(call: ToolCall) -> str:
    return "approve" if call.state is State.AWAITING_APPROVAL else "reconcile"


def facts_of(
    call: ToolCall, action: str, arguments: Mapping[str, Any]
) -> dict[str, Any]:
    """What a pause tells a human about a call (see `LedgerPause`)."""
    return {
        "run_id": call.run_id,
        "call_id": call.call_id,
        "tool": call.tool_name,
        "arguments": dict(arguments),
        "state": call.state.name,
        "effect": call.effect.name,
        "revision": call.revision,
        "input_fingerprint": call.input_fingerprint,
        "action": action,
        "show": f"effectd ctl show {call.run_id} {call.call_id}",
    }


def decide(
    client: Client,
    facts: Mapping[str, Any],
    *,
    approve: bool,
    approver: str,
    reason: str,
    arguments: Mapping[str, Any] | None = None,
) -> ToolCall:
    """Records an approver's decision in effectd on a paused call (a
    `LedgerPause`'s `facts`), for the arguments and revision it showed.

    Raises:
        ApprovalMismatch: `arguments` are given and are not the call's.
        KeyError: The pause is not an approval.
        InputMismatch, RevisionConflict: The call changed since.
    """
    if facts.get("action") != "approve" or facts.get("refused"):
        raise KeyError(f"{facts.get('call_id')}: not an approval pause")
    if arguments is not None and _json(arguments) != _json(facts.get("arguments")):
        raise ApprovalMismatch(
            f"the decision shows other arguments ({arguments!r}) than the call "
            f"{facts['call_id']!r} has"
        )
    return client.decide_approval(
        facts["run_id"],
        facts["call_id"],
        approve=approve,
        approver=approver,
        reason=reason,
        expected_revision=facts["revision"],
        input_fingerprint=facts["input_fingerprint"],
    )


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _serialize(value: Any) -> Any:
    """A tool's return value as the JSON the ledger stores and replays."""
    result: Any = json.loads(json.dumps(value, default=str))
    return result
