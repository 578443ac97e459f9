"""Histories for the linearizability check: client threads send ledger and
checkpoint operations on a few shared call ids and keys to a daemon process,
while a nemesis thread stops it with SIGSTOP for longer than the clients'
deadline (then SIGCONT), or kills it with SIGKILL and starts it again on the
same store. Every operation is recorded with its call and return times
(`time.monotonic_ns` of this process) and its outcome:

- ok: the daemon answered, an answer or a refusal the model predicts
  (ABORTED, FAILED_PRECONDITION, NOT_FOUND with their ErrorInfo reason);
- unknown: no answer (deadline passed, connection lost) on a write, which
  may or may not have taken effect: recorded without a return time;
- failed: no answer on a read, which changes nothing: left out.

A status the daemon must never send (INTERNAL, UNKNOWN, INVALID_ARGUMENT to
a well-formed request) is recorded apart and fails the test. Each call id
and key takes a bounded number of operations, then the clients move on to a
fresh one, so every key's history stays short enough to check.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from effectd.v1 import checkpoints_pb2 as cpb
from effectd.v1 import checkpoints_pb2_grpc, ledger_pb2_grpc
from effectd.v1 import ledger_pb2 as pb

from tests.torture import model as m
from tests.torture.harness import enum_name, payload, refusal, result_message
from tests.torture.lin_specs import CheckpointOp, LedgerOp, RecordView
from tests.torture.lin_world import History, Keys, Knobs, Run, Target
from tests.torture.linearizability import Operation

# Long enough never to lapse during a run: only restarts end an attempt.
LEASE_MS = 600_000
PREDICTED = ("ABORTED", "FAILED_PRECONDITION", "NOT_FOUND")
NO_ANSWER = ("DEADLINE_EXCEEDED", "UNAVAILABLE", "CANCELLED", "RESOURCE_EXHAUSTED")
INPUT = m.Input("json", '{"a":1}', "A")
RESULTS = (
    m.Result("OK", m.Input("json", '{"r":1}', "R1")),
    m.Result("OK", m.Input("json", '{"r":2}', "R2")),
    m.Result("ERROR", None, "E_BOOM", "boom"),
)
PAYLOAD_CLASS = {
    ("json", r.payload.text): r.payload.same_as for r in RESULTS if r.payload
}
EFFECTS = (m.READ, m.IDEMPOTENT_WRITE, m.SIDE_EFFECT)
WRONG_FINGERPRINT = "sha256:" + "0" * 64
KINDS = ("prepare", "start", "commit", "get", "report_unknown", "decide_approval")
WEIGHTS = (3, 2, 3, 2, 1, 1)
RESTARTER = -1


class Outcome:
    OK, REFUSED, UNKNOWN, UNEXPECTED = "ok", "refused", "unknown", "unexpected"


@dataclass(frozen=True, slots=True)
class Reply:
    outcome: str
    answer: Any
    called: int
    returned: int


def invoke(fn: Callable[..., Any], request: Any, deadline: float) -> Reply:
    called = time.monotonic_ns()
    try:
        answer = fn(request, timeout=deadline)
        return Reply(Outcome.OK, answer, called, time.monotonic_ns())
    except grpc.RpcError as error:
        returned = time.monotonic_ns()
        err = refusal(error)
        if err.code in PREDICTED and err.reason != "?":
            return Reply(Outcome.REFUSED, err, called, returned)
        if err.code in NO_ANSWER:
            return Reply(Outcome.UNKNOWN, err, called, returned)
        return Reply(Outcome.UNEXPECTED, (err, str(error)), called, returned)


def record_view(call: pb.ToolCall) -> RecordView:
    result = None
    if call.HasField("result"):
        r = call.result
        same = ""
        if r.payload.WhichOneof("kind") == "json":
            same = PAYLOAD_CLASS.get(("json", r.payload.json), "?" + r.payload.json)
        outcome = enum_name(pb.Outcome, r.outcome, "OUTCOME_")
        result = (outcome, same, r.error_code, r.error_message)
    state = enum_name(pb.CallState, call.state, "CALL_STATE_")
    return (state, call.revision, call.attempt, result, call.acknowledged)


def decision_view(answer: Any) -> m.Ok:
    ref = answer.call.ref
    return m.Ok(
        {
            "decision": enum_name(pb.Decision, answer.decision, "DECISION_"),
            "key": answer.idempotency_key,
            "held": getattr(answer, "attempt_held", False),
            "retry_required": getattr(answer, "retry_required", False),
            "ref": (ref.namespace, ref.run_id, ref.call_id),
        }
    )


class Client(threading.Thread):
    """One client: its own channel to the current daemon, operations until
    `stop`, each recorded."""

    def __init__(self, index: int, run: Run, keys: Keys) -> None:
        super().__init__(name=f"client-{index}", daemon=True)
        self.index, self.keys = index, keys
        self.target, self.history = run.target, run.history
        self.knobs, self.stop = run.knobs, run.stop
        self.rng = random.Random(run.knobs.seed * 1000 + index)  # noqa: S311 - test load
        self.channel: grpc.Channel | None = None
        self.generation = -1
        self.sent = 0

    def connect(self) -> grpc.Channel:
        if self.channel is None or self.generation != self.target.generation:
            if self.channel is not None:
                self.channel.close()
            self.generation = self.target.generation
            self.channel = grpc.insecure_channel(self.target.proc.target)
        return self.channel

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                if not self.target.up.wait(timeout=0.2):
                    continue
                self.one(self.connect())
                self.sent += 1
        except Exception as exc:  # a client's own error must fail the test
            with self.history.lock:
                self.history.unexpected.append(f"{self.name} stopped: {exc!r}")
        finally:
            if self.channel is not None:
                self.channel.close()

    def one(self, channel: grpc.Channel) -> None:
        raise NotImplementedError

    def record(
        self,
        into: list[Operation],
        given: Any,
        reply: Reply,
        output: Any,
        *,
        read: bool,
    ) -> None:
        """Unknown outcomes are recorded without a return time, but on a
        read, which changes nothing: it is left out (failed)."""
        outcome = reply.outcome
        if outcome == Outcome.UNEXPECTED:
            with self.history.lock:
                self.history.unexpected.append(f"{given!r}: {reply.answer}")
            outcome = Outcome.UNKNOWN
        if outcome == Outcome.UNKNOWN:
            if read:
                outcome = "failed"
                op = None
            else:
                op = Operation(self.index, reply.called, None, given)
        else:
            op = Operation(self.index, reply.called, reply.returned, given, output)
        self.history.add(into, op, outcome)


class LedgerClient(Client):
    """Prepares (with or without start), starts, commits, unknown reports
    and reads on the live call ids, from what the clients last saw."""

    def one(self, channel: grpc.Channel) -> None:
        rng = self.rng
        call_id = self.keys.pick(rng)
        ref = ("default", "lin", call_id)
        revision, attempt = self.keys.hints.get(call_id, (1, 1))
        behind = max(1, revision - 1)
        kind = rng.choices(KINDS, WEIGHTS)[0]
        fingerprint = WRONG_FINGERPRINT
        if kind == "prepare":
            # Every call of a number has one effect, and every fourth asks
            # for approval.
            number = int(call_id.removeprefix(self.keys.prefix))
            spec = m.Prepare(
                *ref, "t1", EFFECTS[number % len(EFFECTS)], INPUT,
                require_approval=number % 4 == 0, start=rng.random() < 0.6,
                lease_ms=LEASE_MS, retry=rng.random() < 0.5,
            )  # fmt: skip
            given = LedgerOp("prepare", ref, prepare=spec)
        elif kind == "decide_approval":
            if self.keys.fingerprint and rng.random() < 0.9:
                fingerprint = self.keys.fingerprint
            given = LedgerOp(
                kind, ref, expected_revision=rng.choice((revision, behind)),
                approve=rng.random() < 0.7,
                right_fingerprint=fingerprint != WRONG_FINGERPRINT,
            )  # fmt: skip
        elif kind == "start":
            given = LedgerOp(
                "start", ref, lease_ms=LEASE_MS, retry=rng.random() < 0.5,
                expected_revision=rng.choice((None, revision, behind)),
            )  # fmt: skip
        elif kind == "commit":
            given = LedgerOp(
                "commit", ref, attempt=attempt, result=rng.choice(RESULTS),
                expected_revision=rng.choice((None, None, revision)),
                acknowledge=rng.random() < 0.3,
            )  # fmt: skip
        else:
            given = LedgerOp(kind, ref, attempt=attempt)
        stub = ledger_pb2_grpc.ToolLedgerStub(channel)
        fn, request = ledger_request(stub, given, fingerprint)
        reply = invoke(fn, request, self.knobs.deadline_s)
        output: Any = reply.answer
        if reply.outcome == Outcome.REFUSED:
            output = (reply.answer, None)
        elif reply.outcome == Outcome.OK:
            got = reply.answer.call
            if kind in ("prepare", "start"):
                output = (decision_view(reply.answer), record_view(got))
            else:
                output = (m.Ok(None), record_view(got))
            self.keys.hints[call_id] = (got.revision, max(got.attempt, 1))
            self.keys.fingerprint = got.input_fingerprint
        self.record(self.history.ledger, given, reply, output, read=kind == "get")


def ledger_request(
    stub: ledger_pb2_grpc.ToolLedgerStub, op: LedgerOp, fingerprint: str
) -> tuple[Callable[..., Any], Any]:
    """The RPC and request message of `op`."""
    assert op.ref is not None
    ref = pb.CallRef(namespace=op.ref[0], run_id=op.ref[1], call_id=op.ref[2])
    if op.kind == "prepare":
        assert op.prepare is not None
        p = op.prepare
        return stub.PrepareTool, pb.PrepareToolRequest(
            ref=ref, tool_name=p.tool, effect=pb.Effect.Value("EFFECT_" + p.effect),
            input=payload(p.input), require_approval=p.require_approval,
            start=p.start, lease_ms=p.lease_ms, retry=p.retry,
        )  # fmt: skip
    if op.kind == "start":
        return stub.StartTool, pb.StartToolRequest(
            ref=ref, expected_revision=op.expected_revision, lease_ms=op.lease_ms,
            retry=op.retry,
        )  # fmt: skip
    if op.kind == "commit":
        assert op.result is not None
        return stub.CommitTool, pb.CommitToolRequest(
            ref=ref, attempt=op.attempt, result=result_message(op.result),
            expected_revision=op.expected_revision, acknowledge=op.acknowledge,
        )  # fmt: skip
    if op.kind == "report_unknown":
        return stub.ReportUnknown, pb.ReportUnknownRequest(
            ref=ref, attempt=op.attempt, reason="lost"
        )
    if op.kind == "decide_approval":
        return stub.DecideApproval, pb.DecideApprovalRequest(
            ref=ref, approve=op.approve, approver="approver", reason="looked",
            expected_revision=op.expected_revision or 0,
            input_fingerprint=fingerprint,
        )  # fmt: skip
    return stub.GetToolCall, pb.GetToolCallRequest(ref=ref)


class CheckpointClient(Client):
    """Reads, and puts and deletes that expect the revision last seen (now
    and then a stale one), on the live keys; every put's value is new."""

    def one(self, channel: grpc.Channel) -> None:
        stub = checkpoints_pb2_grpc.CheckpointsStub(channel)
        rng = self.rng
        key = self.keys.pick(rng)
        known: int | None = self.keys.hints.get(key)
        kind = rng.choices(("get", "put", "delete"), (3, 5, 1))[0]
        if rng.random() < 0.15 and known is not None:
            known = max(1, known - 1)  # a stale revision
        fn: Callable[..., Any]
        request: Any
        if kind == "get":
            given = CheckpointOp("get", key)
            fn, request = stub.Get, cpb.GetCheckpointRequest(key=key)
        elif kind == "put":
            value = f"{self.index}-{self.sent}".encode()
            given = CheckpointOp("put", key, known, value)
            fn, request = stub.Put, cpb.PutCheckpointRequest(key=key, value=value)
            if known is None:
                request.expect_absent = True
            else:
                request.expected_revision = known
        else:
            given = CheckpointOp("delete", key, known or 1)
            fn = stub.Delete
            request = cpb.DeleteCheckpointRequest(key=key, expected_revision=known or 1)
        reply = invoke(fn, request, self.knobs.deadline_s)
        output = checkpoint_output(kind, reply)
        if output is not None:
            self.keys.hints[key] = _revision_seen(output)
        self.record(self.history.checkpoints, given, reply, output, read=kind == "get")


def checkpoint_output(kind: str, reply: Reply) -> tuple[Any, ...] | None:
    """An answer as `lin_specs.CheckpointSpec` spells it; None: no answer."""
    answer = reply.answer
    if reply.outcome == Outcome.REFUSED:
        if answer.code == "NOT_FOUND":
            return ("absent",)
        return ("conflict", int(answer.reason.rpartition(":")[2] or 0))
    if reply.outcome != Outcome.OK:
        return None
    if kind == "get":
        cp = answer.checkpoint
        return ("value", cp.value, cp.revision)
    if kind == "put":
        return ("ok", answer.revision)
    return ("ok",)


def _revision_seen(output: tuple[Any, ...]) -> int | None:
    """The revision a client expects next after `output` (None: absent)."""
    if output[0] == "value":
        return int(output[2])
    if output[0] in ("conflict", "ok") and len(output) == 2:
        return int(output[1]) or None
    return None


def nemesis(run: Run) -> None:
    """Pauses past the clients' deadline and kills, at random moments."""
    knobs, target, history = run.knobs, run.target, run.history
    rng = random.Random(knobs.seed)  # noqa: S311 - when to strike
    # A pause first, a kill next (each run has both), then at random.
    scripted = [0.0, 0.6]
    while not run.stop.wait(rng.uniform(0.5, 1.5)):
        draw = scripted.pop(0) if scripted else rng.random()
        if knobs.pauses and draw < 0.45:
            target.pause(knobs.deadline_s * rng.uniform(1.5, 2.5))
            with history.lock:
                history.tally["pauses"] += 1
        elif knobs.kills and draw < 0.8:
            killed, ready = target.restart()
            restart = Operation(RESTARTER, killed, ready, LedgerOp("restart"))
            history.add(history.ledger, restart, "restarts")


def record_history(
    knobs: Knobs, workdir: Path, module: str = "sidecar", args: Sequence[str] = ()
) -> History:
    """Runs the clients and the nemesis for `knobs.seconds` on a daemon of
    `module` started with `args`; the history."""
    target = Target(workdir / "data", module, args)
    run = Run(target, History(), knobs, threading.Event())
    ledger_keys = Keys("c", knobs.live_keys, knobs.ops_per_key)
    checkpoint_keys = Keys("k", knobs.live_keys, knobs.ops_per_key)
    threads: list[threading.Thread] = [
        LedgerClient(i, run, ledger_keys) for i in range(knobs.ledger_clients)
    ]
    threads += [
        CheckpointClient(100 + i, run, checkpoint_keys)
        for i in range(knobs.checkpoint_clients)
    ]
    threads.append(threading.Thread(target=nemesis, args=(run,), daemon=True))
    try:
        for t in threads:
            t.start()
        run.stop.wait(knobs.seconds)
    finally:
        run.stop.set()
        for t in threads:
            t.join(timeout=60)
        run.target.close()
    return run.history
