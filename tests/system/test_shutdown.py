"""SIGTERM while 32 clients are mid-call (contract §10.9, ADR-010 D1).

The daemon runs as its own process; 32 client threads, each on its own
connection, loop PrepareTool(start) + CommitTool with distinct call ids and
record every commit that was answered OK. SIGTERM arrives while they run.
The daemon must exit 0 within its grace; after a restart on the same data
directory every acknowledged call is COMMITTED with exactly the bytes its
client committed; and every answer a client got was either complete and
consistent with its request or a clean UNAVAILABLE / CANCELLED, never
anything in between.

The negative control is a daemon that answers before its commit and exits
at once on SIGTERM: the same check must find acknowledged calls missing.
Run as `python -m tests.system.test_shutdown serve --data-dir D`, this module is
that daemon.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc

from sidecar import cli
from tests.support.ack_before_commit import AckBeforeCommitDaemon
from tests.support.processes import DaemonProcess, daemon_process

pytestmark = pytest.mark.slow

WORKERS = 32
GRACE_SECONDS = 5.0
# Bounds each client's loop; SIGTERM comes long before.
MAX_CALLS_PER_WORKER = 2_000
# A call that fails while the daemon stops may only fail these ways.
CLEAN_ERRORS = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
RUN = "shutdown"


class AbandonsWritesOnSigterm(AckBeforeCommitDaemon):
    """BROKEN on purpose: acknowledges before committing once it serves (its
    own start-up writes commit normally, so it starts as fast as a good one),
    and exits at once on SIGTERM, leaving its writer in the middle of a
    transaction."""

    async def stop(self, grace: float | None = None) -> None:
        os._exit(0)


def _result(call_id: str, i: int) -> bytes:
    """The bytes a call commits: distinct per call, 32 B to 2 KiB long, so a
    torn or swapped record cannot pass for the right one."""
    return hashlib.sha256(call_id.encode()).digest() * (1 + i % 64)


@dataclass
class Progress:
    """What the clients saw, shared between their threads."""

    acknowledged: dict[str, bytes] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    finished: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)

    def ack(self, call_id: str, result: bytes) -> None:
        with self.changed:
            self.acknowledged[call_id] = result
            self.changed.notify_all()

    def fail(self, error: grpc.RpcError, what: str) -> None:
        code = error.code()
        with self.changed:
            self.errors[code.name] += 1
            if code not in CLEAN_ERRORS:
                self.problems.append(f"{what}: {code.name} {error.details()}")

    def problem(self, text: str) -> None:
        with self.changed:
            self.problems.append(text)

    def done(self) -> None:
        with self.changed:
            self.finished += 1
            self.changed.notify_all()


def _same_call(ref: pb.CallRef, answered: pb.CallRef) -> bool:
    # The answer names the namespace the request left to its default.
    return (answered.run_id, answered.call_id) == (ref.run_id, ref.call_id)


def _started_problem(ref: pb.CallRef, answer: pb.PrepareToolResponse) -> str | None:
    call = answer.call
    if (
        answer.decision != pb.DECISION_EXECUTE
        or not answer.attempt_held
        or not _same_call(ref, call.ref)
        or call.state != pb.CALL_STATE_STARTED
        or call.attempt < 1
    ):
        return f"{ref.call_id}: prepare answered {answer}"
    return None


def _committed_problem(
    ref: pb.CallRef, result: bytes, answer: pb.CommitToolResponse
) -> str | None:
    call = answer.call
    if (
        not _same_call(ref, call.ref)
        or call.state != pb.CALL_STATE_COMMITTED
        or call.result.outcome != pb.OUTCOME_OK
        or call.result.payload.raw != result
    ):
        return f"{ref.call_id}: commit answered {call.state} {call.ref}"
    return None


def _client(index: int, target: str, progress: Progress) -> None:
    """One client on its own connection: prepare-and-start, then commit,
    call after call, until the daemon stops answering."""
    try:
        with grpc.insecure_channel(target) as channel:
            stub = ledger_pb2_grpc.ToolLedgerStub(channel)
            for i in range(MAX_CALLS_PER_WORKER):
                ref = pb.CallRef(run_id=RUN, call_id=f"w{index}-{i}")
                result = _result(ref.call_id, i)
                try:
                    started = stub.PrepareTool(
                        pb.PrepareToolRequest(
                            ref=ref,
                            tool_name="send_email",
                            input=pb.Payload(json=f'{{"n": {i}}}'),
                            start=True,
                        ),
                        timeout=60,
                    )
                except grpc.RpcError as exc:
                    progress.fail(exc, f"{ref.call_id}: prepare")
                    return
                problem = _started_problem(ref, started)
                if problem is not None:
                    progress.problem(problem)
                    return
                try:
                    committed = stub.CommitTool(
                        pb.CommitToolRequest(
                            ref=ref,
                            attempt=started.call.attempt,
                            result=pb.ToolResult(
                                outcome=pb.OUTCOME_OK, payload=pb.Payload(raw=result)
                            ),
                        ),
                        timeout=60,
                    )
                except grpc.RpcError as exc:
                    progress.fail(exc, f"{ref.call_id}: commit")
                    return
                problem = _committed_problem(ref, result, committed)
                if problem is not None:
                    progress.problem(problem)
                    return
                progress.ack(ref.call_id, result)
    finally:
        progress.done()


@dataclass(frozen=True)
class Shutdown:
    progress: Progress
    exit_code: int
    log: str


def _sigterm_under_load(
    data: Path, module: str, *, acks_before_sigterm: int, args: Sequence[str] = ()
) -> Shutdown:
    """Starts the daemon, puts 32 clients to work, sends SIGTERM once
    `acks_before_sigterm` commits are acknowledged, and waits for the exit."""
    daemon = DaemonProcess(data, module, ["--grace", str(GRACE_SECONDS), *args])
    progress = Progress()
    threads = [
        threading.Thread(
            target=_client, args=(i, daemon.target, progress), name=f"client-{i}"
        )
        for i in range(WORKERS)
    ]
    try:
        for t in threads:
            t.start()
        with progress.changed:
            under_way = progress.changed.wait_for(
                lambda: (
                    len(progress.acknowledged) >= acks_before_sigterm
                    or progress.finished > 0
                ),
                timeout=60,
            )
            # Every client is still mid-loop: the signal meets calls in flight.
            assert under_way, "the clients made no progress"
            assert progress.finished == 0, progress.problems
            daemon.proc.send_signal(signal.SIGTERM)
        # The grace bounds the stop; the margin covers a loaded machine.
        exit_code = daemon.proc.wait(timeout=GRACE_SECONDS + 30)
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        return Shutdown(progress, exit_code, daemon.log())
    finally:
        daemon.close()


def durability_violations(target: str, acknowledged: dict[str, bytes]) -> list[str]:
    """Acknowledged commits that are not COMMITTED with their exact bytes."""
    found = []
    with grpc.insecure_channel(target) as channel:
        stub = ledger_pb2_grpc.ToolLedgerStub(channel)
        for call_id, result in sorted(acknowledged.items()):
            ref = pb.CallRef(run_id=RUN, call_id=call_id)
            try:
                call = stub.GetToolCall(pb.GetToolCallRequest(ref=ref), timeout=30).call
            except grpc.RpcError as exc:
                found.append(f"{call_id}: {exc.code().name}")
                continue
            if call.state != pb.CALL_STATE_COMMITTED:
                found.append(f"{call_id}: {pb.CallState.Name(call.state)}")
            elif call.result.payload.raw != result:
                found.append(f"{call_id}: result of {len(call.result.payload.raw)} B")
    return found


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigterm_mid_call_loses_no_acknowledged_call(short_tmp: Path) -> None:
    """SIGTERM under 32 busy clients: exit 0, no torn answer, and every
    acknowledged commit COMMITTED with its bytes after a restart."""
    data = short_tmp / "data"
    done = _sigterm_under_load(data, "sidecar", acks_before_sigterm=8 * WORKERS)
    progress = done.progress
    assert done.exit_code == 0, done.log
    assert progress.problems == [], progress.problems[:5]
    assert progress.finished == WORKERS
    # Every client was stopped by the shutdown, cleanly, not by its bound.
    assert sum(progress.errors.values()) == WORKERS, progress.errors
    assert len(progress.acknowledged) >= 8 * WORKERS
    with daemon_process(data) as again:
        assert durability_violations(again.target, progress.acknowledged) == []
        assert again.terminate() == 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_negative_control_abandoned_writes_are_caught(short_tmp: Path) -> None:
    """A daemon that acknowledges before committing and exits at once on
    SIGTERM loses acknowledged calls: the same check must say so."""
    data = short_tmp / "data"
    done = _sigterm_under_load(
        data, "tests.system.test_shutdown", acks_before_sigterm=1
    )
    assert len(done.progress.acknowledged) >= 1
    with daemon_process(data) as again:
        assert durability_violations(again.target, done.progress.acknowledged) != []


def _answers(result: bytes) -> tuple[pb.CallRef, pb.CommitToolResponse]:
    ref = pb.CallRef(run_id=RUN, call_id="w0-0")
    answer = pb.CommitToolResponse(
        call=pb.ToolCall(
            ref=pb.CallRef(namespace="default", run_id=RUN, call_id="w0-0"),
            state=pb.CALL_STATE_COMMITTED,
            result=pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(raw=result)),
        )
    )
    return ref, answer


def _cut_short(answer: pb.CommitToolResponse) -> None:
    answer.call.result.payload.raw = answer.call.result.payload.raw[:-1]


def _not_committed(answer: pb.CommitToolResponse) -> None:
    answer.call.state = pb.CALL_STATE_STARTED


def _another_call(answer: pb.CommitToolResponse) -> None:
    answer.call.ref.call_id = "w0-1"


def _no_result(answer: pb.CommitToolResponse) -> None:
    answer.call.ClearField("result")


@pytest.mark.parametrize(
    "tear", [_cut_short, _not_committed, _another_call, _no_result]
)
def test_negative_control_a_torn_answer_is_caught(
    tear: Callable[[pb.CommitToolResponse], None],
) -> None:
    """The answer check accepts the complete answer and refuses one that is
    cut short, names another call or another state."""
    result = _result("w0-0", 5)
    ref, answer = _answers(result)
    assert _committed_problem(ref, result, answer) is None
    tear(answer)
    assert _committed_problem(ref, result, answer) is not None


if __name__ == "__main__":
    raise SystemExit(cli.main(daemon_class=AbandonsWritesOnSigterm))
