"""A reference model of effectd's public API, as a plain in-memory state
machine: the ledger (prepare with its approval, start and retry flags, start,
commit, unknown reports, heartbeats, reads), approvals, reconciliation,
recovery plans, retry decisions, checkpoints and retention, on a clock the
test moves.

It is written from the contract (contract §3-§8, ADR-010, the comments of the
protos and docs/ledger.md), never from the daemon's rules: it imports nothing
of `sidecar`, so an error shared by both cannot hide in a shared rule. The
torture test drives it and the real daemon with the same operations and
compares every answer and every record.

Answers are plain values: `Ok(...)` with the fields a client reads, or
`Err(code, reason)` with the gRPC code's name and ErrorInfo's reason.
`Bugs` plants deliberate mistakes for the negative controls.

The module is long on purpose (over 400 lines): it is one state machine of
one contract, and splitting it would scatter the rules a reader checks
against docs/contract.md side by side.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

NS = 1_000_000_000
MS = 1_000_000
DAY = 86_400 * NS
START_WALL_NS = 1_700_000_000 * NS

# The default policy (docs/ledger.md, `[retry]`, `[leases]`, `[retention]`,
# `[reconcile]` of the policy file).
MAX_ATTEMPTS = 3
DEFAULT_LEASE_MS = 30_000
RETENTION_NS = 7 * DAY
UNACKNOWLEDGED_RETENTION_NS = 30 * DAY
TOMBSTONE_NS = 30 * DAY
QUARANTINE_LEASES = 3

READ, IDEMPOTENT_WRITE, SIDE_EFFECT = "READ", "IDEMPOTENT_WRITE", "SIDE_EFFECT"
PREPARED, AWAITING, STARTED = "PREPARED", "AWAITING_APPROVAL", "STARTED"
UNKNOWN, COMMITTED = "UNKNOWN", "COMMITTED"
OPEN_ATTEMPT = (STARTED, UNKNOWN)

FAILED_PRECONDITION = "FAILED_PRECONDITION"
ABORTED = "ABORTED"
NOT_FOUND = "NOT_FOUND"
INVALID_ARGUMENT = "INVALID_ARGUMENT"


@dataclass(frozen=True, slots=True)
class Bugs:
    """Deliberate mistakes, for the negative controls: each must be caught."""

    # A repeat prepare asking for approval of a call that never started is
    # answered as if the flag were absent (an audit finding of issue 15).
    approval_flag_ignored_on_repeat: bool = False
    # Prepare with `start` of an UNKNOWN READ answers EXECUTE without a new
    # attempt (an audit finding of issue 15).
    execute_without_attempt: bool = False
    # A deleted checkpoint's revision is given again to its next put (ABA).
    checkpoint_revision_reused: bool = False
    # An MCP call reconciled with a result its adapters could never return
    # is committed (issue 25 item 5).
    mcp_result_unchecked: bool = False


@dataclass(frozen=True, slots=True)
class Err:
    code: str
    reason: str


@dataclass(frozen=True, slots=True)
class Ok:
    value: Any


@dataclass(frozen=True, slots=True)
class Input:
    """A tool input: `kind` is "json" or "raw"; `same_as` names its
    fingerprint class (JSON that canonicalizes alike shares one; a raw input
    never shares one with JSON)."""

    kind: str
    text: str
    same_as: str


@dataclass(frozen=True, slots=True)
class Result:
    outcome: str  # "OK" or "ERROR"
    payload: Input | None
    error_code: str = ""
    error_message: str = ""

    def digest_class(self) -> tuple[str, str, str, str]:
        same = self.payload.same_as if self.payload else ""
        return (self.outcome, same, self.error_code, self.error_message)


def returned_by_mcp(result: Result) -> bool:
    """A result an MCP call can return: an error other than the tool's own,
    or an object with a `content` list of text blocks (the CallToolResults
    the machine sends; `ledger.channel_results` has the whole rule)."""
    if result.outcome == "ERROR" and result.error_code != "MCP_TOOL_ERROR":
        return True
    if result.payload is None or result.payload.kind != "json":
        return result.outcome == "ERROR"
    value = json.loads(result.payload.text)
    return (
        isinstance(value, dict)
        and isinstance(value.get("content"), list)
        and all(
            isinstance(b, dict)
            and b.get("type") == "text"
            and isinstance(b.get("text"), str)
            for b in value["content"]
        )
    )


def rejection(reason: str) -> Result:
    return Result("ERROR", None, "APPROVAL_REJECTED", f"rejected by approver: {reason}")


@dataclass(slots=True)
class Call:
    ns: str
    run: str
    call: str
    tool: str
    effect: str
    channel: str
    fingerprint: str
    input: Input
    state: str = "UNSPECIFIED"
    revision: int = 0
    attempt: int = 0
    approval_required: bool = False
    lease_ms: int = 0
    lease_end_mono: int = 0
    lease_end_wall: int = 0
    incarnation: int = 0
    result: Result | None = None
    rejected: bool = False
    acknowledged: bool = False
    approval: tuple[bool, str, int, str] | None = None
    reconciliations: list[tuple[str, str, int, int]] = field(default_factory=list)
    history: list[tuple[str, str, str, int, int, int]] = field(default_factory=list)
    created_wall: int = 0
    updated_wall: int = 0
    unknown_since_wall: int = 0
    kept: Input | None = None

    @property
    def key(self) -> str:
        return f"{self.run}:{self.call}"


@dataclass(frozen=True, slots=True)
class Tombstone:
    # The call's identity check: tool, effect, channel and input.
    identity: tuple[str, str, str, str]
    outcome: str
    acknowledged: bool
    made_wall: int


@dataclass(slots=True)
class Checkpoint:
    value: bytes
    revision: int
    updated_wall: int


@dataclass(frozen=True, slots=True)
class Prepare:
    ns: str
    run: str
    call: str
    tool: str
    effect: str
    input: Input
    channel: str = "TOOL"
    require_approval: bool = False
    start: bool = False
    lease_ms: int = 0
    retry: bool = False


Ref = tuple[str, str, str]


def transaction(op: Any) -> Any:
    """All or nothing: a refusal leaves no change (PrepareTool, PrepareTools,
    AcknowledgeRecovery, and Reconcile, which leaves even a lapsed lease as
    the operator saw it, `ledger.operator_rules.reconcile`; but a prepare's
    refused start keeps the settlement it made, `Settled`). Other requests
    keep the settlement of a lapsed lease they found even when they refuse
    ("any request that touches an expired call settles it first",
    docs/ledger.md)."""

    def run(self: Model, *args: Any, **kwargs: Any) -> Any:
        saved = self._snapshot()
        answer = op(self, *args, **kwargs)
        if isinstance(answer, Settled):
            return answer.refusal
        if isinstance(answer, Err):
            self._restore(saved)
        return answer

    run.__name__ = op.__name__
    run.__doc__ = op.__doc__
    return run


@dataclass(frozen=True, slots=True)
class Settled:
    """A refusal of a prepare that settled the call's expired lease first: the
    settlement is kept, as every request keeps the one it found (the call is
    UNKNOWN whatever the prepare asked; `ledger.attempts.retry_unknown`
    answers the refusal with the settled record)."""

    refusal: Err


class Model:
    """The whole API's state, changed only through its operations."""

    def __init__(self, bugs: Bugs | None = None) -> None:
        self.bugs = bugs or Bugs()
        self.wall = START_WALL_NS
        self.mono = 0
        self.incarnation = 1
        self.calls: dict[Ref, Call] = {}
        self.tombstones: dict[Ref, Tombstone] = {}
        self.checkpoints: dict[tuple[str, str], Checkpoint] = {}
        self.checkpoint_counter = 0
        self.last_deleted_revision = 0

    # -- time and the daemon's life ------------------------------------

    def advance(self, seconds: float) -> None:
        step = int(seconds * NS)
        self.wall += step
        self.mono += step

    def restart(self) -> None:
        """A new incarnation: every STARTED call of an earlier one becomes
        UNKNOWN (contract §4.4), then a compaction pass runs (docs/ledger.md)."""
        self.incarnation += 1
        for c in self.calls.values():
            if c.state == STARTED:
                self._to_unknown(c, "restart", min(c.lease_end_wall, self.wall))
        self.compact()

    def compact(self) -> None:
        """One compaction pass: COMMITTED records past their window become
        tombstones; tombstones past their lifetime are forgotten."""
        for ref, c in list(self.calls.items()):
            if c.state != COMMITTED:
                continue  # ADR-010 R3
            window = RETENTION_NS if c.acknowledged else UNACKNOWLEDGED_RETENTION_NS
            if self.wall - c.updated_wall >= window:
                assert c.result is not None
                self.tombstones[ref] = Tombstone(
                    (c.tool, c.effect, c.channel, c.fingerprint),
                    c.result.outcome,
                    c.acknowledged,
                    self.wall,
                )
                del self.calls[ref]
        for ref, t in list(self.tombstones.items()):
            if self.wall - t.made_wall >= TOMBSTONE_NS:
                del self.tombstones[ref]

    def sweep_leases(self) -> None:
        """The lease sweep: every STARTED call whose lease ran out
        becomes UNKNOWN, untouched by any request (docs/ledger.md)."""
        for c in self.calls.values():
            if self._expired(c):
                self._settle(c)

    # -- record changes ------------------------------------------------

    def _move(self, c: Call, to: str, event: str) -> None:
        c.revision += 1
        c.history.append((c.state, to, event, c.revision, c.attempt, self.wall))
        c.state = to
        c.updated_wall = self.wall

    def _expired(self, c: Call) -> bool:
        return c.state == STARTED and self.mono >= c.lease_end_mono

    def _settle(self, c: Call) -> bool:
        if c.state == STARTED and c.incarnation != self.incarnation:
            self._to_unknown(c, "restart", min(c.lease_end_wall, self.wall))
            return True
        if self._expired(c):
            self._to_unknown(c, "expire", c.lease_end_wall)
            return True
        return False

    def _to_unknown(self, c: Call, event: str, since: int) -> None:
        self._move(c, UNKNOWN, event)
        c.unknown_since_wall = since
        c.lease_end_mono = c.lease_end_wall = 0

    def _start(self, c: Call, lease_ms: int, event: str) -> None:
        c.attempt += 1
        c.lease_ms = lease_ms
        lease = (lease_ms or DEFAULT_LEASE_MS) * MS
        c.lease_end_mono = self.mono + lease
        c.lease_end_wall = self.wall + lease
        c.incarnation = self.incarnation
        c.unknown_since_wall = 0
        self._move(c, STARTED, event)

    def _commit(self, c: Call, result: Result, event: str) -> None:
        c.result = result
        c.kept = None
        c.lease_end_mono = c.lease_end_wall = 0
        c.unknown_since_wall = 0
        self._move(c, COMMITTED, event)

    # -- the retry rules (contract §7.2, retry.proto) -------------------------

    def retry_rules(  # noqa: PLR0911 - one return per rule, in the contract's order
        self,
        *,
        effect: str,
        state: str,
        key: str,
        context: str,
        kind: str,
        attempts_used: int,
        max_attempts: int,
        lease_live: bool = False,
        deadline_passed: bool = False,
    ) -> str:
        """The reason a retry is denied, "" when it is allowed; the first
        denial wins."""
        if state == COMMITTED:
            return "ALREADY_COMMITTED"
        if state == AWAITING or (state == STARTED and lease_live):
            return "INVALID_TRANSITION"
        if context == "RUN" and effect != READ:
            return "RUN_NOT_READ_ONLY"
        if context == "MCP" and kind != "APPLICATION":
            return "MCP_NO_REPLAY"
        if effect == SIDE_EFFECT:
            if context == "DURABLE_BACKGROUND" and state in OPEN_ATTEMPT:
                return "RECONCILIATION_REQUIRED"
            return "SIDE_EFFECT_NOT_RETRY_SAFE"
        if effect == IDEMPOTENT_WRITE and not key:
            return "MISSING_IDEMPOTENCY_KEY"
        budget = min(max_attempts or MAX_ATTEMPTS, MAX_ATTEMPTS)
        if attempts_used >= budget:
            return "ATTEMPTS_EXHAUSTED"
        if deadline_passed:
            return "DEADLINE_EXCEEDED"
        return ""

    def _retry_start(self, c: Call, lease_ms: int) -> Err | None:
        """An explicit retry of an UNKNOWN READ / IDEMPOTENT_WRITE through the
        ledger, in the call's channel; the attempt's outcome is unknown."""
        why = self.retry_rules(
            effect=c.effect,
            state=c.state,
            key=c.key,
            context=c.channel,
            kind="TRANSPORT",
            attempts_used=c.attempt,
            max_attempts=0,
        )
        if why:
            return Err(FAILED_PRECONDITION, why)
        self._start(c, lease_ms, "retry")
        return None

    # -- ToolLedger --------------------------------------------------------

    def _answer(
        self,
        decision: str,
        c: Call,
        *,
        held: bool = False,
        retry_required: bool = False,
    ) -> Ok:
        key = c.key if c.effect == IDEMPOTENT_WRITE else ""
        return Ok(
            {
                "decision": decision,
                "key": key,
                "held": held,
                "retry_required": retry_required,
                "ref": (c.ns, c.run, c.call),
            }
        )

    def _decide(self, c: Call) -> tuple[str, bool]:
        """The decision for a record as it stands: (decision, retry_required)."""
        if c.state == PREPARED:
            return "EXECUTE", False
        if c.state == AWAITING:
            return "AWAIT_APPROVAL", False
        if c.state == STARTED:
            return "IN_PROGRESS", False
        if c.state == UNKNOWN:
            if c.effect == SIDE_EFFECT:
                return "RECONCILE", False
            return "EXECUTE", True
        return ("REJECTED" if c.rejected else "RETURN_RESULT"), False

    @transaction
    def prepare(self, p: Prepare) -> Ok | Err | Settled:  # noqa: PLR0911, PLR0912 - contract §4-§5 row by row
        ref = (p.ns, p.run, p.call)
        if ref in self.tombstones:
            t = self.tombstones[ref]
            # A tombstone keeps tool, effect and fingerprint, not the channel
            # (docs/contract.md §4.7): another channel alone is the same call.
            if t.identity[:2] + t.identity[3:] != (p.tool, p.effect, p.input.same_as):
                return Err(FAILED_PRECONDITION, "INPUT_MISMATCH")
            return Err(FAILED_PRECONDITION, "RESULT_COMPACTED")
        c = self.calls.get(ref)
        if c is None:
            c = Call(
                p.ns,
                p.run,
                p.call,
                p.tool,
                p.effect,
                p.channel,
                p.input.same_as,
                p.input,
                created_wall=self.wall,
                approval_required=p.require_approval,
            )
            self.calls[ref] = c
            # Every call keeps its input until it is settled (contract §4.5,
            # `ledger.kept_inputs`); the default policy drops it then.
            c.kept = p.input
            if p.require_approval:
                self._move(c, AWAITING, "prepare")
                return self._answer("AWAIT_APPROVAL", c)
            self._move(c, PREPARED, "prepare")
            if p.start:
                self._start(c, p.lease_ms, "start")
                return self._answer("EXECUTE", c, held=True)
            return self._answer("EXECUTE", c)
        settled = self._settle(c)
        if (c.tool, c.effect, c.channel, c.fingerprint) != (
            p.tool,
            p.effect,
            p.channel,
            p.input.same_as,
        ):
            return Err(FAILED_PRECONDITION, "INPUT_MISMATCH")
        if p.require_approval and not c.approval_required:
            # A call that started ran without approval; PREPARED after a
            # reconciliation ("never executed") never ran.
            if c.state != PREPARED:
                return Err(FAILED_PRECONDITION, "INPUT_MISMATCH")
            if not self.bugs.approval_flag_ignored_on_repeat:
                c.approval_required = True
                c.kept = c.kept or p.input
                self._move(c, AWAITING, "require_approval")
                return self._answer("AWAIT_APPROVAL", c)
        decision, retry_required = self._decide(c)
        if p.start and c.state == PREPARED:
            self._start(c, p.lease_ms, "start")
            return self._answer("EXECUTE", c, held=True)
        if p.start and retry_required:
            if self.bugs.execute_without_attempt:
                return self._answer("EXECUTE", c, held=True)
            if not p.retry:
                invalid = Err(FAILED_PRECONDITION, "INVALID_TRANSITION")
                return Settled(invalid) if settled else invalid
            refused = self._retry_start(c, p.lease_ms)
            if refused:
                return Settled(refused) if settled else refused
            return self._answer("EXECUTE", c, held=True)
        return self._answer(decision, c, retry_required=retry_required)

    @transaction
    def prepare_batch(self, batch: list[Prepare]) -> Ok | Err:
        """All or nothing: the first refusal names its index."""
        answers = []
        for index, p in enumerate(batch):
            got = self.prepare(p)
            if isinstance(got, Err):
                return Err(got.code, f"{got.reason}@{index}")
            answers.append(got.value)
        return Ok(answers)

    def _snapshot(self) -> Any:
        return (
            {r: _copy_call(c) for r, c in self.calls.items()},
            dict(self.tombstones),
        )

    def _restore(self, saved: Any) -> None:
        self.calls, self.tombstones = saved

    def _find(self, ref: Ref) -> Call | Err:
        c = self.calls.get(ref)
        if c is None:
            return Err(NOT_FOUND, "NOT_FOUND")
        return c

    def start(  # noqa: PLR0911 - one return per row of contract §4.2
        self, ref: Ref, expected_revision: int | None, lease_ms: int, retry: bool
    ) -> Ok | Err:
        c = self._find(ref)
        if isinstance(c, Err):
            return c
        # The revision a client saw is the stored one: a lease that ran out
        # since is settled after the compare, never held against it.
        if expected_revision is not None and expected_revision != c.revision:
            return Err(ABORTED, f"REVISION_CONFLICT:{c.revision}")
        self._settle(c)
        if c.state == PREPARED:
            self._start(c, lease_ms, "start")
            return self._answer("EXECUTE", c)
        if c.state == UNKNOWN:
            if c.effect == SIDE_EFFECT:
                return Err(FAILED_PRECONDITION, "RECONCILIATION_REQUIRED")
            if not retry:
                return Err(FAILED_PRECONDITION, "INVALID_TRANSITION")
            refused = self._retry_start(c, lease_ms)
            return refused or self._answer("EXECUTE", c)
        return self._answer(self._decide(c)[0], c)

    def commit(
        self,
        ref: Ref,
        attempt: int,
        result: Result,
        expected_revision: int | None,
        acknowledge: bool,
    ) -> Ok | Err:
        c = self._find(ref)
        if isinstance(c, Err):
            return c
        # A repeat of the stored result answers as the first commit did,
        # whatever revision it expects: its answer may have been lost.
        if c.state == COMMITTED:
            assert c.result is not None
            if c.result.digest_class() != result.digest_class():
                return Err(FAILED_PRECONDITION, "RESULT_MISMATCH")
            if acknowledge and not c.acknowledged:
                self._acknowledge(c)
            return Ok(None)
        if expected_revision is not None and expected_revision != c.revision:
            return Err(ABORTED, f"REVISION_CONFLICT:{c.revision}")
        # The attempt that holds the call knows its outcome: a late commit
        # is taken as it is, without settling the lapsed lease first.
        refused = self._not_held(c, attempt, OPEN_ATTEMPT)
        if refused:
            return refused
        self._commit(c, result, "commit")
        if acknowledge:
            self._acknowledge(c)
        return Ok(None)

    def _not_held(self, c: Call, attempt: int, states: tuple[str, ...]) -> Err | None:
        """Why `attempt` may not record its work on `c` in `states`."""
        if c.state not in states:
            # docs/ledger.md: an attempt that a reconciliation moved on is
            # STALE_ATTEMPT.
            if c.state == PREPARED and c.attempt and attempt <= c.attempt:
                return Err(FAILED_PRECONDITION, "STALE_ATTEMPT")
            return Err(FAILED_PRECONDITION, "INVALID_TRANSITION")
        if attempt != c.attempt:
            return Err(FAILED_PRECONDITION, "STALE_ATTEMPT")
        return None

    def report_unknown(self, ref: Ref, attempt: int) -> Ok | Err:
        c = self._find(ref)
        if isinstance(c, Err):
            return c
        if c.state == UNKNOWN and attempt == c.attempt:
            return Ok(None)  # a repeat of the report
        refused = self._not_held(c, attempt, (STARTED,))
        if refused:
            return refused
        self._to_unknown(c, "report_unknown", self.wall)
        return Ok(None)

    def heartbeat(self, ref: Ref, attempt: int, lease_ms: int) -> Ok | Err:
        c = self._find(ref)
        if isinstance(c, Err):
            return c
        self._settle(c)
        refused = self._not_held(c, attempt, (STARTED,))
        if refused:
            return refused
        lease = (lease_ms or DEFAULT_LEASE_MS) * MS
        c.lease_ms = lease_ms
        c.lease_end_mono = self.mono + lease
        c.lease_end_wall = self.wall + lease
        c.revision += 1
        c.updated_wall = self.wall
        return Ok(None)

    def get(self, ref: Ref) -> Call | Err:
        return self._find(ref)

    def decide_approval(
        self, ref: Ref, approve: bool, expected_revision: int, right_fingerprint: bool
    ) -> Ok | Err:
        c = self._find(ref)
        if isinstance(c, Err):
            return c
        # Only a call awaiting approval changes; nothing else is settled.
        if expected_revision != c.revision:
            return Err(ABORTED, f"REVISION_CONFLICT:{c.revision}")
        if not right_fingerprint:
            return Err(FAILED_PRECONDITION, "INPUT_MISMATCH")
        if c.state != AWAITING:
            return Err(FAILED_PRECONDITION, "INVALID_TRANSITION")
        c.approval = (approve, "approver", c.revision, c.fingerprint)
        if approve:
            self._move(c, PREPARED, "approve")
        else:
            c.rejected = True
            self._commit(c, rejection("looked"), "reject")
        return Ok(None)

    @transaction
    def reconcile(  # noqa: PLR0911 - one return per rule of ReconcileRequest
        self,
        ref: Ref,
        expected_revision: int,
        result: Result | None,
        confirmed_dead: int,
    ) -> Ok | Err:
        c = self._find(ref)
        if isinstance(c, Err):
            return c
        if expected_revision != c.revision:
            return Err(ABORTED, f"REVISION_CONFLICT:{c.revision}")
        # The state and revision the operator saw (ReconcileRequest).
        seen = (c.state, c.revision, c.attempt)
        self._settle(c)
        if c.state not in OPEN_ATTEMPT:
            return Err(FAILED_PRECONDITION, "INVALID_TRANSITION")
        if result is not None:
            mcp = c.channel == "MCP" and not self.bugs.mcp_result_unchecked
            if mcp and not returned_by_mcp(result):
                return Err(INVALID_ARGUMENT, "INVALID_REQUEST")
            c.reconciliations.append(("COMMITTED", *seen))
            self._commit(c, result, "reconcile_committed")
            return Ok(None)
        if confirmed_dead and confirmed_dead != c.attempt:
            return Err(FAILED_PRECONDITION, "STALE_ATTEMPT")
        # A live lease: the attempt may yet execute, confirmed dead or not.
        if c.state == STARTED:
            return Err(FAILED_PRECONDITION, "INVALID_TRANSITION")
        if not confirmed_dead:
            quarantine = QUARANTINE_LEASES * (c.lease_ms or DEFAULT_LEASE_MS) * MS
            if self.wall - c.unknown_since_wall < quarantine:
                return Err(FAILED_PRECONDITION, "RECONCILE_QUARANTINE")
        c.reconciliations.append(("NOT_EXECUTED", *seen))
        c.lease_end_mono = c.lease_end_wall = 0
        c.unknown_since_wall = 0
        self._move(c, PREPARED, "reconcile_not_executed")
        return Ok(None)

    # -- Recovery ------------------------------------------------------------

    def recover(self, ns: str, run: str) -> Ok:
        items = []
        settled = 0
        for ref in sorted(
            (r for r in self.calls if r[0] == ns and r[1] == run),
            key=lambda r: r[2].encode(),
        ):
            c = self.calls[ref]
            settled += self._settle(c)
            items.append((ref[2], self._action(c)))
        interrupted = any(a in ("RECONCILE", "WAIT_FOR_APPROVAL") for _, a in items)
        return Ok({"items": items, "interrupted": interrupted, "settled": settled})

    def _action(self, c: Call) -> str:
        if c.state == COMMITTED:
            if c.acknowledged:
                return "ALREADY_DELIVERED"
            return "ERROR_RESULT" if c.rejected else "REPLAY_RESULT"
        if c.state in OPEN_ATTEMPT:
            return "RECONCILE" if c.effect == SIDE_EFFECT else "RETRY_NEEDS_POLICY"
        if c.state == AWAITING:
            return "WAIT_FOR_APPROVAL"
        return "EXECUTE"

    @transaction
    def acknowledge(self, ns: str, run: str, call_ids: list[str]) -> Ok | Err:
        found = []
        for index, call_id in enumerate(call_ids):
            c = self.calls.get((ns, run, call_id))
            if c is None:
                return Err(NOT_FOUND, f"NOT_FOUND@{index}")
            if c.state != COMMITTED:
                return Err(FAILED_PRECONDITION, f"INVALID_TRANSITION@{index}")
            found.append(c)
        for c in found:
            if not c.acknowledged:
                self._acknowledge(c)
        return Ok(None)

    def _acknowledge(self, c: Call) -> None:
        c.acknowledged = True
        self._move(c, COMMITTED, "acknowledge")

    # -- RetryPolicy ---------------------------------------------------------

    def decide_retry_call(
        self, ref: Ref, context: str, kind: str, attempts_used: int, max_attempts: int
    ) -> Ok | Err:
        found = self._find(ref)
        if isinstance(found, Err):
            return found
        # A decision changes no record: the rules see the call as settled.
        c = _copy_call(found)
        self._settle(c)
        used = max(attempts_used, c.attempt)
        # The rules of the context asked, then those of the channel the call
        # was recorded with (docs/ledger.md): the first denial wins.
        contexts = [context] if c.channel == "TOOL" else [context, c.channel]
        why = ""
        for where in contexts:
            why = why or self.retry_rules(
                effect=c.effect,
                state=c.state,
                key=c.key,
                context=where,
                kind=kind,
                attempts_used=used,
                max_attempts=max_attempts,
                lease_live=c.state == STARTED,
            )
        budget = min(max_attempts or MAX_ATTEMPTS, MAX_ATTEMPTS)
        key = c.key if not why and c.effect == IDEMPOTENT_WRITE else ""
        return Ok((not why, why, c.effect, budget, used, key))

    # -- Checkpoints ---------------------------------------------------------

    def _next_revision(self) -> int:
        if self.bugs.checkpoint_revision_reused and self.last_deleted_revision:
            reused, self.last_deleted_revision = self.last_deleted_revision, 0
            return reused
        self.checkpoint_counter += 1
        return self.checkpoint_counter

    def cp_get(self, ns: str, key: str) -> Ok | Err:
        found = self.checkpoints.get((ns, key))
        if found is None:
            return Err(NOT_FOUND, "NOT_FOUND")
        return Ok((found.value, found.revision, found.updated_wall))

    def cp_put(self, ns: str, key: str, value: bytes, expected: int | None) -> Ok | Err:
        """`expected` None means `expect_absent`."""
        found = self.checkpoints.get((ns, key))
        current = found.revision if found else 0
        if (expected is None and found) or (
            expected is not None and expected != current
        ):
            return Err(ABORTED, f"REVISION_CONFLICT:{current}")
        revision = self._next_revision()
        self.checkpoints[(ns, key)] = Checkpoint(value, revision, self.wall)
        return Ok(revision)

    def cp_delete(self, ns: str, key: str, expected: int) -> Ok | Err:
        found = self.checkpoints.get((ns, key))
        current = found.revision if found else 0
        if found is None or expected != current:
            return Err(ABORTED, f"REVISION_CONFLICT:{current}")
        self.last_deleted_revision = current
        # Every write takes the counter's next value, a delete too.
        self._next_revision()
        del self.checkpoints[(ns, key)]
        return Ok(None)

    def cp_txn(
        self,
        ns: str,
        compares: list[tuple[str, int | None]],
        ops: list[tuple[str, bytes | None]],
    ) -> Ok | Err:
        """`compares`: (key, revision or None for absent); `ops`: (key, value
        or None for a delete)."""
        for key, expected in compares:
            found = self.checkpoints.get((ns, key))
            current = found.revision if found else 0
            if (expected is None and found) or (
                expected is not None and expected != current
            ):
                return Err(ABORTED, f"REVISION_CONFLICT:{current}")
        revision = self._next_revision()
        for key, value in ops:
            if value is None:
                self.checkpoints.pop((ns, key), None)
            else:
                self.checkpoints[(ns, key)] = Checkpoint(value, revision, self.wall)
        return Ok(revision)

    def cp_list(self, ns: str, prefix: str) -> list[tuple[str, bytes, int]]:
        return sorted(
            (k, cp.value, cp.revision)
            for (n, k), cp in self.checkpoints.items()
            if n == ns and k.startswith(prefix)
        )


def _copy_call(c: Call) -> Call:
    return dataclasses.replace(
        c, reconciliations=list(c.reconciliations), history=list(c.history)
    )
