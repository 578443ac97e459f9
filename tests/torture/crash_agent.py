"""An agent of the crash loop: one run of tool calls through the safe tool
call (`effectd_client.Run`), in a process of its own that the loop may kill
with SIGKILL at any moment and start again on the same run.

Each step of a run is a tool call whose effect (SIDE_EFFECT, IDEMPOTENT_WRITE,
READ) and outcome (a result, or a definite failure) follow from the run's id,
so a restarted agent asks for the same calls with the same inputs, and gets
the same idempotency keys. The tool's whole effect is one line appended to
the side-effect counter, a file outside the daemon opened with O_APPEND and
fsynced: (run, call, attempt, idempotency key, effect). What the daemon
acknowledged (a commit answered, or a committed result replayed) is appended
to the acknowledgement log only after the answer came: (run, call, attempt,
result bytes or error code). The loop checks both against the store.

A side effect of unknown outcome is never executed again: the safe call
raises `ReconciliationNeeded`, and the agent notes the call as handed to
reconciliation and goes on with the run. `reexecute_unknown` is the negative
control: an agent that executes such a call anyway, as an agent that ignored
the ledger would.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from dataclasses import dataclass
from typing import Any

from effectd_client import (
    CallInProgress,
    Client,
    Effect,
    EffectdError,
    OutcomeUnknown,
    ReconciliationNeeded,
    RecordingRetry,
    RecoveryAction,
    RetryRequired,
    Run,
    State,
    ToolFailed,
)

# The effects of a run's steps, drawn by each step's digest: side effects
# most often, since they are the ones the ledger must never run twice.
EFFECTS = (Effect.SIDE_EFFECT, Effect.SIDE_EFFECT, Effect.IDEMPOTENT_WRITE, Effect.READ)
# One step in FAILING ends in a definite failure, committed as an error.
FAILING = 7
ERROR_CODE = "ToolBroke"
# A killed agent's attempt blocks its successor until this lease runs out.
LEASE_MS = 1500
# The most a tool waits before, and after, its effect.
TOOL_SECONDS = 0.01
# How long the negative control's tool waits after its effect (uniform):
# long beside a call's round trips, so most kills of its agent or daemon
# land between the effect and its commit, leaving an executed side effect
# of unknown outcome for the broken agent to run again. With the fast
# setting's wait, a control of 60 cycles once met no such kill.
CONTROL_AFTER_SECONDS = (0.05, 0.25)
# While the daemon restarts: how long a step keeps trying.
PATIENCE_SECONDS = 120.0


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """One agent process: its daemon, its run and the files it writes."""

    target: str
    run_id: str
    calls: int
    counter: str
    acks: str
    log: str
    # Started again on a run that an earlier, killed incarnation began.
    resumed: bool = False
    # BROKEN on purpose (negative control): executes a side effect the
    # ledger hands to reconciliation.
    reexecute_unknown: bool = False


@dataclass(frozen=True, slots=True)
class Step:
    call_id: str
    effect: Effect
    fails: bool


def steps(run_id: str, calls: int) -> list[Step]:
    """The run's steps: the same for every incarnation of its agent."""
    found = []
    for i in range(calls):
        digest = hashlib.sha256(f"{run_id}/{i}".encode()).digest()
        found.append(
            Step(f"c{i}", EFFECTS[digest[0] % len(EFFECTS)], digest[1] % FAILING == 0)
        )
    return found


def result_bytes(run_id: str, call_id: str, attempt: int) -> bytes:
    """What an attempt returns: bytes that name it, not valid UTF-8, so that
    a stored result is compared as exact bytes."""
    return f"{run_id}/{call_id}/{attempt}".encode() + b"\x00\xff"


class ToolBrokeError(Exception):
    """The tool's definite failure: committed as an error result."""

    error_code = ERROR_CODE


def append(path: str, entry: dict[str, Any], *, sync: bool) -> None:
    """One line, in one write to a file opened with O_APPEND (atomic against
    other appenders and against a kill); fsynced when `sync`."""
    line = (json.dumps(entry, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


class Agent:
    def __init__(self, spec: AgentSpec) -> None:
        self.spec = spec
        # When the tool acts: a kill lands before or after its effect.
        self.rng = random.Random(f"{spec.run_id}/{os.getpid()}")  # noqa: S311
        self._after_effect = (
            CONTROL_AFTER_SECONDS if spec.reexecute_unknown else (0.0, TOOL_SECONDS)
        )
        self.client = self._connect()

    def _connect(self) -> Client:
        # Short deadlines: the daemon may be dead; a new client per outage,
        # so that a restarted daemon is reached at once (no reconnect backoff).
        retry = RecordingRetry(
            attempts=200, deadline=20.0, initial_backoff=0.02, max_backoff=0.2
        )
        # Half the runs send their calls on the ledger session stream, half
        # as unary calls: the answers leave the daemon by both paths.
        session = hashlib.sha256(self.spec.run_id.encode()).digest()[0] % 2 == 0
        return Client(
            self.spec.target, timeout=5.0, recording_retry=retry, session=session
        )

    def _reconnect(self) -> None:
        self.client.close()
        time.sleep(0.02)
        self.client = self._connect()

    def note(self, **entry: Any) -> None:
        append(self.spec.acks, {"run": self.spec.run_id, **entry}, sync=False)

    def effect(
        self, step: Step, attempt: int, key: str, *, unsafe: bool = False
    ) -> None:
        entry = {
            "run": self.spec.run_id,
            "call": step.call_id,
            "attempt": attempt,
            "key": key,
            "effect": step.effect.name,
            "pid": os.getpid(),
        }
        if unsafe:
            entry["unsafe"] = True
        append(self.spec.counter, entry, sync=True)

    def run(self) -> None:
        if self.spec.resumed:
            self.read_plan()
        for step in steps(self.spec.run_id, self.spec.calls):
            self.step(step)

    def read_plan(self) -> None:
        """A restarted agent reads its run's recovery plan first; an item that
        would execute a call whose last attempt may have run is noted for
        the loop's check (the plan starts nothing: the steps then go through
        the safe call)."""
        give_up = time.monotonic() + PATIENCE_SECONDS
        while True:
            try:
                plan = self.client.recover(self.spec.run_id)
                break
            except EffectdError as exc:
                if exc.code.name not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                    raise
                if time.monotonic() > give_up:
                    raise
                self._reconnect()
        unsafe = [
            i.call.call_id
            for i in plan.items
            if i.action is RecoveryAction.EXECUTE
            and i.call.state in (State.STARTED, State.UNKNOWN)
        ]
        actions = sorted(i.action.name for i in plan.items)
        self.note(plan=actions, unsafe_plan=unsafe)

    def step(self, step: Step) -> None:
        """One tool call, tried until the ledger gives its outcome."""
        give_up = time.monotonic() + PATIENCE_SECONDS
        while True:
            try:
                self.once(step)
                return
            except (ReconciliationNeeded, RetryRequired) as stopped:
                if self.spec.reexecute_unknown:
                    self.effect(step, stopped.call.attempt, "", unsafe=True)
                self.note(call=step.call_id, reconcile=stopped.call.attempt)
                return
            except CallInProgress:
                pass  # a killed incarnation's lease, until it runs out
            except OutcomeUnknown:
                # The tool ran (or may have); the next prepare says what the
                # ledger holds: the result, a retry, or reconciliation.
                self._reconnect()
            except EffectdError as exc:
                if exc.reason == "RECONCILIATION_REQUIRED":
                    self.note(call=step.call_id, reconcile=-1)
                    return
                if exc.reason == "ATTEMPTS_EXHAUSTED":
                    # A READ or IDEMPOTENT_WRITE whose every attempt ended
                    # unknown: the run goes on without it.
                    self.note(call=step.call_id, exhausted=True)
                    return
                if exc.code.name not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                    raise
                self._reconnect()
            if time.monotonic() > give_up:
                raise TimeoutError(f"{step.call_id}: no outcome in time")
            time.sleep(0.05)

    def once(self, step: Step) -> None:
        run = Run(self.client, self.spec.run_id, lease_ms=LEASE_MS)
        retry = step.effect is not Effect.SIDE_EFFECT
        try:
            with run.call(
                "tool",
                {"run": self.spec.run_id, "call": step.call_id},
                call_id=step.call_id,
                effect=step.effect,
                retry_unknown=retry,
                raw=True,
            ) as call:
                if call.execute:
                    # The tool takes a moment before and after its effect, so
                    # that kills land on both sides of it.
                    time.sleep(self.rng.uniform(0, TOOL_SECONDS))
                    self.effect(step, call.attempt, call.idempotency_key)
                    time.sleep(self.rng.uniform(*self._after_effect))
                    if step.fails:
                        raise ToolBrokeError(f"{step.call_id} broke")
                    call.set_result(
                        result_bytes(self.spec.run_id, step.call_id, call.attempt)
                    )
            result = call.result
        except ToolBrokeError:
            # Re-raised by the safe call once the error result was committed.
            self.note(call=step.call_id, attempt=call.attempt, error=ERROR_CODE)
            return
        except ToolFailed as failed:
            self.note(
                call=step.call_id,
                attempt=failed.call.attempt,
                error=failed.result.error_code,
            )
            return
        self.note(call=step.call_id, attempt=call.attempt, result=result.hex())


def main(spec: AgentSpec) -> None:
    """The agent process: its output goes to `spec.log`."""
    fd = os.open(spec.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    agent = Agent(spec)
    try:
        agent.run()
    finally:
        agent.client.close()
