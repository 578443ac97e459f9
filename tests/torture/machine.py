"""The torture state machine: Hypothesis draws operations on a few calls and
checkpoint keys (prepare with every flag, start, commit, unknown reports,
heartbeats, approvals, reconciliations, recovery, acknowledgements, retry
decisions, checkpoint writes, clock advances past leases and retention
windows, compaction passes and lease sweeps, daemon restarts), applies each to
the real daemon and to the reference model, and requires the same answer
(decision, state, error reason) and the same record every time.

Hypothesis prints the falsifying sequence of steps, and its seed with
`--hypothesis-seed` / `--hypothesis-show-statistics`.

The module is long on purpose (over 400 lines): one rule per operation of
the API, each beside its comparison, reads as one table.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import hypothesis
from effectd.v1 import checkpoints_pb2 as cpb
from effectd.v1 import errors_pb2
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import recovery_pb2 as rpb
from effectd.v1 import retry_pb2 as tpb
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.torture import model as m
from tests.torture.harness import (
    Backend,
    Daemon,
    Fingerprints,
    LmdbBackend,
    call,
    call_view,
    enum_name,
    payload,
    result_message,
    ts_ns,
)

NAMESPACES = ("default", "ns2")
RUNS = ("r1", "r2")
CALLS = ("c1", "c2", "c3")
# Few identities, so that operations meet: two calls of one run, a call of
# another run, and one of the same name in another namespace.
KNOWN = (
    ("default", "r1", "c1"),
    ("default", "r1", "c2"),
    ("default", "r2", "c1"),
    ("ns2", "r1", "c1"),
)
REFS = st.sampled_from(KNOWN)
RARELY = st.sampled_from((False, False, False, True))
MOSTLY = st.sampled_from((True, True, True, False))
TOOLS = st.sampled_from(("t1", "t2"))
EFFECTS = st.sampled_from((m.READ, m.IDEMPOTENT_WRITE, m.SIDE_EFFECT))
CHANNELS = st.sampled_from(("TOOL", "MCP", "DURABLE_BACKGROUND"))
# Two spellings of one JSON input, another JSON input, and the first one's
# bytes as raw input (never the same input as the JSON, issue 15).
ALL_INPUTS = (
    m.Input("json", '{"a":1}', "A"),
    m.Input("json", '{ "a": 1.0 }', "A"),
    m.Input("json", '{"a":2}', "B"),
    m.Input("raw", '{"a":1}', "RAW"),
)
INPUTS = st.sampled_from(ALL_INPUTS)
SPELLINGS = {
    same: [i for i in ALL_INPUTS if i.same_as == same] for same in ("A", "B", "RAW")
}
RESULTS = st.sampled_from(
    (
        m.Result("OK", m.Input("json", '{"r":1}', "R1")),
        m.Result("OK", m.Input("json", '{"r": 1.0}', "R1")),
        m.Result("OK", m.Input("json", '{"r":2}', "R2")),
        m.Result("ERROR", None, "E_BOOM", "boom"),
        # The shape an MCP call's result takes (`ledger.channel_results`).
        m.Result(
            "OK", m.Input("json", '{"content":[{"type":"text","text":"r"}]}', "R3")
        ),
    )
)
LEASES = st.sampled_from((0, 1_000, 5_000))
# Seconds: inside a lease, past the short ones, past the default one, past
# the quarantine of the default lease, past the retention windows.
ADVANCES = st.sampled_from((0.5, 2.0, 10.0, 31.0, 200.0, 8 * 86_400.0, 31 * 86_400.0))
# Relative to the record: the right value, one behind, one ahead.
SKEWS = st.sampled_from((0, -1, 1))
KEYS = st.sampled_from(("k1", "k2", "p/k3"))
VALUES = st.sampled_from((b"", b"v1", b"v2"))
CONTEXTS = ("TOOL", "MCP", "CHILD_FOREGROUND", "DURABLE_BACKGROUND", "RUN")
KINDS = ("TRANSPORT", "TIMEOUT", "APPLICATION")
STATES = (m.PREPARED, m.AWAITING, m.STARTED, m.UNKNOWN, m.COMMITTED)
WRONG_FINGERPRINT = "sha256:" + "0" * 64


def examples(default: int, variable: str = "TORTURE_EXAMPLES") -> int:
    """The number of examples: `variable` for a deep run."""
    return int(os.environ.get(variable, str(default)))


def model_view(c: m.Call) -> dict[str, Any]:
    """A model record in the shape of `harness.call_view`."""
    result = None
    if c.result is not None:
        p = c.result.payload
        result = (
            c.result.outcome,
            (p.kind, p.text) if p else None,
            c.result.error_code,
            c.result.error_message,
        )
    return {
        "ref": (c.ns, c.run, c.call),
        "tool": c.tool,
        "effect": c.effect,
        "channel": c.channel,
        "state": c.state,
        "revision": c.revision,
        "attempt": c.attempt,
        "key": c.key,
        "key_scheme": 1,
        "fingerprint": c.fingerprint,
        "approval_required": c.approval_required,
        "lease_expires_at": c.lease_end_wall if c.state == m.STARTED else 0,
        "unknown_since": c.unknown_since_wall if c.state == m.UNKNOWN else 0,
        "result": result,
        "acknowledged": c.acknowledged,
        "created_at": c.created_wall,
        "updated_at": c.updated_wall,
        "history": list(c.history),
        "approval": c.approval,
        "reconciliations": list(c.reconciliations),
        "kept_input": (c.kept.kind, c.kept.text) if c.kept else None,
    }


def call_ref(ref: m.Ref) -> pb.CallRef:
    return pb.CallRef(namespace=ref[0], run_id=ref[1], call_id=ref[2])


class TortureMachine(RuleBasedStateMachine):
    """The daemon and the model, step by step; every answer compared."""

    backend: ClassVar[Backend] = LmdbBackend()
    bugs: m.Bugs = m.Bugs()
    # The answers seen, by operation and kind, over every example of a run
    # (`run`): what the random operations reached.
    tally: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.workdir = Path(tempfile.mkdtemp(prefix="effectd-t-", dir="/tmp"))
        self.model = m.Model(self.bugs)
        self.daemon = Daemon(self.backend, self.workdir)
        self.fingerprints = Fingerprints()
        self.before: dict[m.Ref, m.Call] = {}

    def teardown(self) -> None:
        self.tally["examples"] += 1
        try:
            self.daemon.down()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- comparison ------------------------------------------------------

    def same(self, what: str, daemon: object, model: object) -> None:
        if daemon != model:
            before = {
                ref: (c.state, c.revision, c.attempt, c.effect, c.channel)
                for ref, c in self.before.items()
            }
            raise AssertionError(
                f"{what}: daemon {daemon!r} != model {model!r}; "
                f"the model's calls before the step: {before}"
            )

    def same_record(
        self, ref: m.Ref, got: pb.ToolCall | None = None, *, agent: bool = False
    ) -> None:
        """The daemon's record of `ref` (as answered, or read now) is the
        model's, field by field. An answer to the agent's own step (`agent`)
        carries the kept input only while the call awaits approval."""
        found = self.model.get(ref)
        if got is None:
            answer = call(
                self.daemon.ledger.GetToolCall, pb.GetToolCallRequest(ref=call_ref(ref))
            )
            if isinstance(answer, m.Err):
                self.same(
                    f"get {ref}",
                    answer,
                    found if isinstance(found, m.Err) else "a record",
                )
                return
            got = answer.call
        assert isinstance(found, m.Call), (
            f"{ref}: the daemon has a record, the model none"
        )
        daemon = call_view(got, self.fingerprints, found.fingerprint)
        model = model_view(found)
        if agent and found.state != m.AWAITING:
            model["kept_input"] = None
        differ = {k: (daemon[k], model[k]) for k in model if daemon[k] != model[k]}
        assert not differ, f"record {ref}: (daemon, model) differ in {differ}"

    def same_answer(self, what: str, got: Any, expected: m.Ok | m.Err) -> bool:
        """Compares the kind of answer; True when both are Ok."""
        self.tally[f"{what.split(maxsplit=1)[0]}: {_label(expected)}"] += 1
        if isinstance(got, m.Err) or isinstance(expected, m.Err):
            self.same(what, got, expected)
            return False
        return True

    def decision_view(self, answer: Any) -> dict[str, Any]:
        return {
            "decision": enum_name(pb.Decision, answer.decision, "DECISION_"),
            "key": answer.idempotency_key,
            "held": getattr(answer, "attempt_held", False),
            "retry_required": getattr(answer, "retry_required", False),
            "ref": (
                answer.call.ref.namespace,
                answer.call.ref.run_id,
                answer.call.ref.call_id,
            ),
        }

    # -- ToolLedger ------------------------------------------------------

    def prepare_message(self, p: m.Prepare) -> pb.PrepareToolRequest:
        return pb.PrepareToolRequest(
            ref=call_ref((p.ns, p.run, p.call)),
            tool_name=p.tool,
            effect=pb.Effect.Value("EFFECT_" + p.effect),
            input=payload(p.input),
            require_approval=p.require_approval,
            start=p.start,
            lease_ms=p.lease_ms,
            retry=p.retry,
            channel=pb.CallChannel.Value("CALL_CHANNEL_" + p.channel),
        )

    @rule(
        ref=REFS,
        tool=TOOLS,
        effect=EFFECTS,
        given=INPUTS,
        channel=CHANNELS,
        approval=RARELY,
        start=st.booleans(),
        lease=LEASES,
        retry=st.booleans(),
    )
    def prepare(
        self,
        *,
        ref: m.Ref,
        tool: str,
        effect: str,
        given: m.Input,
        channel: str,
        approval: bool,
        start: bool,
        lease: int,
        retry: bool,
    ) -> None:
        self.prepare_one(
            m.Prepare(*ref, tool, effect, given, channel, approval, start, lease, retry)
        )

    @rule(
        ref=REFS,
        spelling=st.integers(0, 1),
        approval=RARELY,
        start=st.booleans(),
        lease=LEASES,
        retry=st.booleans(),
    )
    def prepare_again(
        self,
        *,
        ref: m.Ref,
        spelling: int,
        approval: bool,
        start: bool,
        lease: int,
        retry: bool,
    ) -> None:
        """A repeat of a recorded call (as an agent that resumes sends it),
        its input maybe spelled another way; a new READ call if none."""
        c = self.current(ref)
        given = c.input if c else SPELLINGS["A"][0]
        given = SPELLINGS.get(given.same_as, [given])[spelling % 2 and -1]
        tool, effect, channel = (
            (c.tool, c.effect, c.channel) if c else ("t1", m.READ, "TOOL")
        )
        self.prepare_one(
            m.Prepare(*ref, tool, effect, given, channel, approval, start, lease, retry)
        )

    @initialize(
        plan=st.lists(
            st.tuples(EFFECTS, CHANNELS, RARELY, st.booleans()),
            min_size=len(KNOWN),
            max_size=len(KNOWN),
        )
    )
    def prepare_all(self, plan: list[tuple[str, str, bool, bool]]) -> None:
        """Every identity starts recorded (most steps then meet a record),
        each with its effect, channel, approval and start drawn."""
        for ref, (effect, channel, approval, start) in zip(KNOWN, plan, strict=True):
            given = ALL_INPUTS[0]
            self.prepare_one(
                m.Prepare(*ref, "t1", effect, given, channel, approval, start)
            )

    def prepare_one(self, p: m.Prepare) -> None:
        ref = (p.ns, p.run, p.call)
        got = call(self.daemon.ledger.PrepareTool, self.prepare_message(p))
        expected = self.model.prepare(p)
        if self.same_answer(f"PrepareTool {p}", got, expected):
            assert not isinstance(got, m.Err)
            assert isinstance(expected, m.Ok)
            self.same(f"PrepareTool {p}", self.decision_view(got), expected.value)
            self.same_record(ref, got.call, agent=True)
        else:
            self.same_record(ref)

    @rule(
        batch=st.lists(
            st.tuples(REFS, TOOLS, EFFECTS, INPUTS, st.booleans()),
            min_size=1,
            max_size=3,
            unique_by=lambda t: t[0],
        )
    )
    def prepare_batch(self, batch: list[tuple[m.Ref, str, str, m.Input, bool]]) -> None:
        specs = [
            m.Prepare(*ref, tool, effect, given, start=start)
            for ref, tool, effect, given, start in batch
        ]
        got = call(
            self.daemon.ledger.PrepareTools,
            pb.PrepareToolsRequest(calls=[self.prepare_message(p) for p in specs]),
        )
        expected = self.model.prepare_batch(specs)
        if self.same_answer(f"PrepareTools {specs}", got, expected):
            assert not isinstance(got, m.Err)
            assert isinstance(expected, m.Ok)
            self.same(
                "prepare batch",
                [self.decision_view(a) for a in got.results],
                expected.value,
            )
        for ref, *_ in batch:
            self.same_record(ref)

    def current(self, ref: m.Ref) -> m.Call | None:
        return self.model.calls.get(ref)

    @rule(
        ref=REFS, skew=st.sampled_from((None, 0, -1)), lease=LEASES, retry=st.booleans()
    )
    def start(self, ref: m.Ref, skew: int | None, lease: int, retry: bool) -> None:
        c = self.current(ref)
        expected_revision = (
            None if skew is None else max(1, (c.revision if c else 1) + skew)
        )
        got = call(
            self.daemon.ledger.StartTool,
            pb.StartToolRequest(
                ref=call_ref(ref),
                expected_revision=expected_revision,
                lease_ms=lease,
                retry=retry,
            ),
        )
        expected = self.model.start(ref, expected_revision, lease, retry)
        if self.same_answer(f"StartTool {ref}", got, expected):
            assert not isinstance(got, m.Err)
            assert isinstance(expected, m.Ok)
            self.same(f"StartTool {ref}", self.decision_view(got), expected.value)
            self.same_record(ref, got.call, agent=True)
        else:
            self.same_record(ref)

    def attempt(self, ref: m.Ref, skew: int) -> int:
        c = self.current(ref)
        return max(1, (c.attempt if c else 1) + skew)

    @rule(
        ref=REFS,
        skew=SKEWS,
        result=RESULTS,
        rev=st.sampled_from((None, 0, -1)),
        acknowledge=st.booleans(),
    )
    def commit(
        self,
        ref: m.Ref,
        skew: int,
        result: m.Result,
        rev: int | None,
        acknowledge: bool,
    ) -> None:
        c = self.current(ref)
        attempt = self.attempt(ref, skew)
        expected_revision = (
            None if rev is None else max(1, (c.revision if c else 1) + rev)
        )
        got = call(
            self.daemon.ledger.CommitTool,
            pb.CommitToolRequest(
                ref=call_ref(ref),
                attempt=attempt,
                result=result_message(result),
                expected_revision=expected_revision,
                acknowledge=acknowledge,
            ),
        )
        expected = self.model.commit(
            ref, attempt, result, expected_revision, acknowledge
        )
        if self.same_answer(
            f"CommitTool {ref} attempt {attempt} {result}", got, expected
        ):
            assert not isinstance(got, m.Err)
            assert isinstance(expected, m.Ok)
            self.same_record(ref, got.call, agent=True)
        else:
            self.same_record(ref)

    @rule(ref=REFS, result=RESULTS, acknowledge=st.booleans())
    def commit_held(self, ref: m.Ref, result: m.Result, acknowledge: bool) -> None:
        """The attempt that holds the call commits, as an agent does."""
        self.commit(ref=ref, skew=0, result=result, rev=None, acknowledge=acknowledge)

    @rule(ref=REFS, skew=SKEWS)
    def report_unknown(self, ref: m.Ref, skew: int) -> None:
        attempt = self.attempt(ref, skew)
        got = call(
            self.daemon.ledger.ReportUnknown,
            pb.ReportUnknownRequest(ref=call_ref(ref), attempt=attempt, reason="lost"),
        )
        expected = self.model.report_unknown(ref, attempt)
        if self.same_answer(f"ReportUnknown {ref} attempt {attempt}", got, expected):
            assert not isinstance(got, m.Err)
            assert isinstance(expected, m.Ok)
            self.same_record(ref, got.call, agent=True)
        else:
            self.same_record(ref)

    @rule(ref=REFS, skew=SKEWS, lease=LEASES)
    def heartbeat(self, ref: m.Ref, skew: int, lease: int) -> None:
        attempt = self.attempt(ref, skew)
        got = call(
            self.daemon.ledger.Heartbeat,
            pb.HeartbeatRequest(ref=call_ref(ref), attempt=attempt, lease_ms=lease),
        )
        expected = self.model.heartbeat(ref, attempt, lease)
        if self.same_answer(f"Heartbeat {ref} attempt {attempt}", got, expected):
            assert not isinstance(got, m.Err)
            assert isinstance(expected, m.Ok)
            self.same_record(ref, got.call, agent=True)
        else:
            self.same_record(ref)

    @rule(
        ref=REFS,
        approve=st.booleans(),
        rev=st.sampled_from((0, -1)),
        right=MOSTLY,
    )
    def decide_approval(self, ref: m.Ref, approve: bool, rev: int, right: bool) -> None:
        c = self.current(ref)
        expected_revision = max(1, (c.revision if c else 1) + rev)
        fingerprint = WRONG_FINGERPRINT
        if right and c is not None:
            fingerprint = self.fingerprints.of_class.get(
                c.fingerprint, WRONG_FINGERPRINT
            )
        got = call(
            self.daemon.ledger.DecideApproval,
            pb.DecideApprovalRequest(
                ref=call_ref(ref),
                approve=approve,
                approver="approver",
                reason="looked",
                expected_revision=expected_revision,
                input_fingerprint=fingerprint,
            ),
        )
        expected = self.model.decide_approval(
            ref, approve, expected_revision, fingerprint != WRONG_FINGERPRINT
        )
        if self.same_answer(f"DecideApproval {ref} {approve}", got, expected):
            assert not isinstance(got, m.Err)
            assert isinstance(expected, m.Ok)
            self.same_record(ref, got.call)
        else:
            self.same_record(ref)

    @rule(
        ref=REFS,
        rev=st.sampled_from((0, -1)),
        result=st.none() | RESULTS,
        dead=st.sampled_from((None, 0, -1)),
    )
    def reconcile(
        self, ref: m.Ref, rev: int, result: m.Result | None, dead: int | None
    ) -> None:
        c = self.current(ref)
        expected_revision = max(1, (c.revision if c else 1) + rev)
        confirmed = 0 if dead is None else max(0, (c.attempt if c else 1) + dead)
        request = pb.ReconcileRequest(
            ref=call_ref(ref),
            expected_revision=expected_revision,
            operator="op",
            reason="checked",
            evidence="the target's log",
            confirmed_dead_attempt=confirmed,
        )
        if result is None:
            request.not_executed = True
        else:
            request.result.CopyFrom(result_message(result))
        got = call(self.daemon.ledger.Reconcile, request)
        expected = self.model.reconcile(ref, expected_revision, result, confirmed)
        if self.same_answer(
            f"Reconcile {ref} {result} dead {confirmed}", got, expected
        ):
            assert not isinstance(got, m.Err)
            assert isinstance(expected, m.Ok)
            self.same_record(ref, got.call)
        else:
            self.same_record(ref)

    @rule(ref=REFS)
    def get(self, ref: m.Ref) -> None:
        self.same_record(ref)

    # -- Recovery ------------------------------------------------------

    @rule(ns=st.sampled_from(NAMESPACES), run=st.sampled_from(RUNS))
    def recover(self, ns: str, run: str) -> None:
        got = call(
            self.daemon.recovery.Recover, rpb.RecoverRequest(namespace=ns, run_id=run)
        )
        expected = self.model.recover(ns, run)
        assert not isinstance(got, m.Err), got
        items = [
            (
                item.call.ref.call_id,
                enum_name(rpb.RecoveryAction, item.action, "RECOVERY_ACTION_"),
            )
            for item in got.items
        ]
        self.same(
            f"recover {ns}/{run}",
            {"items": items, "interrupted": got.interrupted, "settled": got.settled},
            expected.value,
        )
        for item in got.items:
            ref = (ns, run, item.call.ref.call_id)
            c = self.model.calls[ref]
            self.same(
                f"recover {ref} effect",
                enum_name(pb.Effect, item.effect, "EFFECT_"),
                c.effect,
            )
            self.same(
                f"recover {ref} key",
                item.idempotency_key,
                c.key if c.effect == m.IDEMPOTENT_WRITE else "",
            )
            has_result = item.HasField("result")
            self.same(
                f"recover {ref} result",
                has_result,
                item.action
                in (
                    rpb.RECOVERY_ACTION_REPLAY_RESULT,
                    rpb.RECOVERY_ACTION_ERROR_RESULT,
                ),
            )
            self.same(f"recover {ref} revision", item.call.revision, c.revision)
            self.same(
                f"recover {ref} state",
                enum_name(pb.CallState, item.call.state, "CALL_STATE_"),
                c.state,
            )

    @rule(
        ns=st.sampled_from(NAMESPACES),
        run=st.sampled_from(RUNS),
        ids=st.lists(st.sampled_from(CALLS), min_size=1, max_size=3, unique=True),
    )
    def acknowledge(self, ns: str, run: str, ids: list[str]) -> None:
        got = call(
            self.daemon.recovery.AcknowledgeRecovery,
            rpb.AcknowledgeRecoveryRequest(namespace=ns, run_id=run, call_ids=ids),
        )
        expected = self.model.acknowledge(ns, run, ids)
        self.same_answer(f"AcknowledgeRecovery {ns}/{run} {ids}", got, expected)
        for call_id in ids:
            self.same_record((ns, run, call_id))

    # -- RetryPolicy ---------------------------------------------------

    @rule(
        ref=REFS,
        context=st.sampled_from(CONTEXTS),
        kind=st.sampled_from(KINDS),
        used=st.integers(0, 4),
        budget=st.integers(0, 4),
    )
    def decide_retry_call(
        self, ref: m.Ref, context: str, kind: str, used: int, budget: int
    ) -> None:
        got = call(
            self.daemon.retry.DecideRetry,
            tpb.DecideRetryRequest(
                call=call_ref(ref),
                context=tpb.RetryContext.Value("RETRY_CONTEXT_" + context),
                error=tpb.AttemptError(
                    kind=tpb.FailureKind.Value("FAILURE_KIND_" + kind), retryable=True
                ),
                attempts_used=used,
                max_attempts=budget,
            ),
        )
        expected = self.model.decide_retry_call(ref, context, kind, used, budget)
        if self.same_answer(f"DecideRetry {ref} {context} {kind}", got, expected):
            assert not isinstance(got, m.Err)
            assert isinstance(expected, m.Ok)
            reason = "" if got.reason == 0 else _reason_name(got.reason)
            self.same(
                f"decide retry {ref} {context} {kind} used {used} budget {budget}",
                (
                    got.allow,
                    reason,
                    enum_name(pb.Effect, got.effect, "EFFECT_"),
                    got.max_attempts,
                    got.attempts_used,
                    got.idempotency_key,
                ),
                expected.value,
            )
        self.same_record(ref)

    @rule(
        effect=EFFECTS,
        state=st.sampled_from(STATES),
        key=st.sampled_from(("", "r:c")),
        context=st.sampled_from(CONTEXTS),
        kind=st.sampled_from(KINDS),
        used=st.integers(0, 4),
        budget=st.integers(0, 4),
        past_deadline=st.booleans(),
    )
    def decide_retry_facts(
        self,
        *,
        effect: str,
        state: str,
        key: str,
        context: str,
        kind: str,
        used: int,
        budget: int,
        past_deadline: bool,
    ) -> None:
        deadline = None
        if past_deadline:
            deadline = Timestamp()
            deadline.FromNanoseconds(self.model.wall - m.NS)
        got = call(
            self.daemon.retry.DecideRetry,
            tpb.DecideRetryRequest(
                facts=tpb.RetryFacts(
                    effect=pb.Effect.Value("EFFECT_" + effect),
                    state=pb.CallState.Value("CALL_STATE_" + state),
                    idempotency_key=key,
                ),
                context=tpb.RetryContext.Value("RETRY_CONTEXT_" + context),
                error=tpb.AttemptError(
                    kind=tpb.FailureKind.Value("FAILURE_KIND_" + kind)
                ),
                attempts_used=used,
                max_attempts=budget,
                deadline=deadline,
            ),
        )
        why = self.model.retry_rules(
            effect=effect,
            state=state,
            key=key,
            context=context,
            kind=kind,
            attempts_used=used,
            max_attempts=budget,
            deadline_passed=past_deadline,
        )
        assert not isinstance(got, m.Err), got
        reason = "" if got.reason == 0 else _reason_name(got.reason)
        self.same(
            f"decide retry {effect} {state} {key!r} {context} {kind} {used}/{budget}",
            (got.allow, reason),
            (not why, why),
        )

    # -- Checkpoints -----------------------------------------------------

    def same_checkpoints(self, ns: str) -> None:
        got = call(
            self.daemon.checkpoints.List,
            cpb.ListCheckpointsRequest(namespace=ns, page_size=1000),
        )
        assert not isinstance(got, m.Err), got
        self.same(
            f"checkpoints of {ns}",
            [(c.key, c.value, c.revision) for c in got.checkpoints],
            self.model.cp_list(ns, ""),
        )

    @rule(
        ns=st.sampled_from(NAMESPACES),
        key=KEYS,
        value=VALUES,
        skew=st.sampled_from((None, 0, -1, 1)),
    )
    def cp_put(self, ns: str, key: str, value: bytes, skew: int | None) -> None:
        found = self.model.checkpoints.get((ns, key))
        request = cpb.PutCheckpointRequest(namespace=ns, key=key, value=value)
        expected_revision = None
        if skew is None:
            request.expect_absent = True
        else:
            expected_revision = max(1, (found.revision if found else 1) + skew)
            request.expected_revision = expected_revision
        got = call(self.daemon.checkpoints.Put, request)
        expected = self.model.cp_put(ns, key, value, expected_revision)
        if self.same_answer(f"Put {ns}/{key}", got, expected):
            assert not isinstance(got, m.Err)
            assert isinstance(expected, m.Ok)
            self.same(f"put {ns}/{key} revision", got.revision, expected.value)
        self.same_checkpoints(ns)

    @rule(ns=st.sampled_from(NAMESPACES), key=KEYS, skew=st.sampled_from((0, -1)))
    def cp_delete(self, ns: str, key: str, skew: int) -> None:
        found = self.model.checkpoints.get((ns, key))
        expected_revision = max(1, (found.revision if found else 1) + skew)
        got = call(
            self.daemon.checkpoints.Delete,
            cpb.DeleteCheckpointRequest(
                namespace=ns, key=key, expected_revision=expected_revision
            ),
        )
        expected = self.model.cp_delete(ns, key, expected_revision)
        self.same_answer(f"Delete {ns}/{key}", got, expected)
        self.same_checkpoints(ns)

    @rule(
        ns=st.sampled_from(NAMESPACES),
        ops=st.lists(
            st.tuples(KEYS, st.none() | VALUES, st.sampled_from((0, -1))),
            min_size=1,
            max_size=3,
            unique_by=lambda t: t[0],
        ),
    )
    def cp_txn(self, ns: str, ops: list[tuple[str, bytes | None, int]]) -> None:
        compares: list[tuple[str, int | None]] = []
        messages = []
        for key, value, skew in ops:
            found = self.model.checkpoints.get((ns, key))
            expected = (
                None
                if found is None and skew == 0
                else max(1, (found.revision if found else 1) + skew)
            )
            compares.append((key, expected))
            messages.append(
                cpb.TxnOp(delete=cpb.TxnDelete(key=key))
                if value is None
                else cpb.TxnOp(put=cpb.TxnPut(key=key, value=value))
            )
        request = cpb.CheckpointTxnRequest(
            namespace=ns,
            compares=[
                cpb.Compare(key=k, absent=True)
                if r is None
                else cpb.Compare(key=k, revision=r)
                for k, r in compares
            ],
            ops=messages,
        )
        got = call(self.daemon.checkpoints.Txn, request)
        answer = self.model.cp_txn(ns, compares, [(k, v) for k, v, _ in ops])
        if self.same_answer(f"Txn {ns} {compares} {ops}", got, answer):
            assert not isinstance(got, m.Err)
            assert isinstance(answer, m.Ok)
            self.same(f"txn {ns} revision", got.revision, answer.value)
        self.same_checkpoints(ns)

    @rule(ns=st.sampled_from(NAMESPACES), key=KEYS)
    def cp_get(self, ns: str, key: str) -> None:
        got = call(
            self.daemon.checkpoints.Get, cpb.GetCheckpointRequest(namespace=ns, key=key)
        )
        expected = self.model.cp_get(ns, key)
        if self.same_answer(f"Get {ns}/{key}", got, expected):
            assert not isinstance(got, m.Err)
            assert isinstance(expected, m.Ok)
            c = got.checkpoint
            self.same(
                f"get {ns}/{key}",
                (c.value, c.revision, ts_ns(c.updated_at)),
                expected.value,
            )

    # -- time and the daemon's life ----------------------------------------

    @rule(seconds=ADVANCES)
    def advance(self, seconds: float) -> None:
        self.tally["advance"] += 1
        self.daemon.clock.advance(seconds)
        # Not left to the renewal the advance wakes, which may run after the
        # next request: a lease granted while the registration looks lapsed
        # is unknown from its grant (tests/ledger/test_ownership.py), not
        # from the restart the model counts from.
        self.daemon.renew()
        self.model.advance(seconds)

    @rule()
    def restart(self) -> None:
        self.tally["restart"] += 1
        self.daemon.restart()
        before = len(self.model.tombstones)
        self.model.restart()
        self.tally["tombstones made"] += max(0, len(self.model.tombstones) - before)
        self.same_everything()

    @rule()
    def compact(self) -> None:
        self.tally["compaction pass"] += 1
        self.daemon.compact()
        before = len(self.model.tombstones)
        self.model.compact()
        self.tally["tombstones made"] += max(0, len(self.model.tombstones) - before)
        self.same_everything()

    @rule()
    def sweep(self) -> None:
        self.daemon.sweep()
        self.model.sweep_leases()
        self.same_everything()

    def same_everything(self) -> None:
        for ns in NAMESPACES:
            for run in RUNS:
                for call_id in CALLS:
                    self.same_record((ns, run, call_id))
            self.same_checkpoints(ns)

    @invariant()
    def clocks_agree(self) -> None:
        self.same("wall clock", self.daemon.clock.wall_ns(), self.model.wall)
        self.before = {r: m._copy_call(c) for r, c in self.model.calls.items()}


def _label(answer: m.Ok | m.Err) -> str:
    """What an answer was, for Hypothesis's statistics."""
    if isinstance(answer, m.Err):
        return answer.reason.split(":")[0].split("@")[0]
    value = answer.value
    if isinstance(value, dict):
        return str(value["decision"]) + (" held" if value["held"] else "")
    return "ok"


def _reason_name(value: int) -> str:
    return str(errors_pb2.ErrorReason.Name(value))  # type: ignore[arg-type]


def settings(
    default_examples: int,
    *,
    deep: bool = True,
    shrink: bool = True,
    variable: str = "TORTURE_EXAMPLES",
) -> hypothesis.settings:
    """The run's settings: `default_examples` examples unless
    `TORTURE_EXAMPLES` says otherwise (`deep`), shrinking a failure to a
    short sequence unless `shrink` is off or `TORTURE_NO_SHRINK` is set."""
    shrink = shrink and not os.environ.get("TORTURE_NO_SHRINK")
    extra: dict[str, Any] = {} if shrink else {"database": None}
    return hypothesis.settings(
        **extra,
        max_examples=examples(default_examples, variable) if deep else default_examples,
        stateful_step_count=int(os.environ.get("TORTURE_STEPS", "40")),
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
        print_blob=True,
        phases=(
            list(hypothesis.Phase)
            if shrink
            else [hypothesis.Phase.explicit, hypothesis.Phase.generate]
        ),
    )
