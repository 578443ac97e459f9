"""The safe tool call runs a tool at most once across agent crashes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from effectd_client import (
    ApprovalPending,
    CallInProgress,
    CallRejected,
    Client,
    Effect,
    InputMismatch,
    OutcomeUnknown,
    ReconciliationNeeded,
    RecoveryAction,
    RetryRequired,
    Run,
    State,
    ToolFailed,
)
from sidecar.clock import ManualClock
from sidecar.testing import RunningDaemon

# A tool factory: given a run, decorates a counting tool and returns it.
Decorate = Callable[[Client, list[str]], Callable[[str], Any]]


class Crash(BaseException):
    """The agent process dies while the tool runs (no handler sees it)."""


def safe(client: Client, calls: list[str]) -> Callable[[str], Any]:
    run = Run(client, "run-once")

    @run.tool("send_email", effect=Effect.SIDE_EFFECT)
    def send_email(to: str) -> dict[str, str]:
        calls.append(to)
        return {"sent_to": to}

    return send_email.at("mail")


def ignores_return_result(client: Client, calls: list[str]) -> Callable[[str], Any]:
    """A broken helper: it prepares, then runs the tool whatever the decision."""

    def send_email(to: str) -> dict[str, str]:
        p = client.prepare_tool(
            "run-once", "mail", "send_email", {"to": to}, start=True
        )
        calls.append(to)
        result = {"sent_to": to}
        if p.attempt_held:
            client.commit_tool("run-once", "mail", p.call.attempt, result)
        return result

    return send_email


def calls_across_a_crash(daemon: RunningDaemon, decorate: Decorate) -> int:
    """Asks for one call, then again from a new agent; counts the executions."""
    calls: list[str] = []
    with Client(daemon.target) as first:
        assert decorate(first, calls)("a@b.c") == {"sent_to": "a@b.c"}
    with Client(daemon.target) as second:  # the agent restarted
        assert decorate(second, calls)("a@b.c") == {"sent_to": "a@b.c"}
    return len(calls)


def test_a_committed_tool_is_replayed_after_a_crash(daemon: RunningDaemon) -> None:
    """After a crash a new client and decorator get the stored result unrun."""
    assert calls_across_a_crash(daemon, safe) == 1


def test_negative_control_a_helper_ignoring_return_result_is_caught(
    daemon: RunningDaemon,
) -> None:
    """The counting check fails for a helper that ignores RETURN_RESULT."""
    assert calls_across_a_crash(daemon, ignores_return_result) == 2


def test_idempotent_write_gets_the_same_key_on_its_retry(client: Client) -> None:
    """An unknown IDEMPOTENT_WRITE is retried only on request, with one key."""
    keys: list[str] = []

    def charge(cents: int, *, idempotency_key: str = "") -> dict[str, int]:
        keys.append(idempotency_key)
        if len(keys) == 1:
            raise TimeoutError("the payment API did not answer")
        return {"charged": cents}

    first = Run(client, "run-pay").tool("charge", effect=Effect.IDEMPOTENT_WRITE)
    with pytest.raises(TimeoutError):
        first(charge).at("charge")(5)
    assert client.get_tool_call("run-pay", "charge").state is State.UNKNOWN

    again = Run(client, "run-pay").tool("charge", effect=Effect.IDEMPOTENT_WRITE)
    with pytest.raises(RetryRequired):
        again(charge).at("charge")(5)
    assert len(keys) == 1

    retry = Run(client, "run-pay").tool(
        "charge", effect=Effect.IDEMPOTENT_WRITE, retry_unknown=True
    )
    assert retry(charge).at("charge")(5) == {"charged": 5}
    assert keys == ["run-pay:charge", "run-pay:charge"]
    done = client.get_tool_call("run-pay", "charge")
    assert (done.state, done.attempt) == (State.COMMITTED, 2)


@pytest.mark.parametrize(
    "interruption",
    [OutcomeUnknown("no answer"), TimeoutError("30 s"), ConnectionError("reset")],
)
def test_an_interrupted_side_effect_needs_reconciliation(
    client: Client, interruption: Exception
) -> None:
    """A SIDE_EFFECT cut off mid-call is UNKNOWN and never runs again."""
    calls: list[str] = []

    def send(to: str) -> None:
        calls.append(to)
        raise interruption

    with pytest.raises(type(interruption)):
        Run(client, "run-cut").tool("send")(send).at("mail")("x")
    assert client.get_tool_call("run-cut", "mail").state is State.UNKNOWN

    with pytest.raises(ReconciliationNeeded) as stopped:
        Run(client, "run-cut").tool("send", retry_unknown=True)(send).at("mail")("x")
    assert stopped.value.call.state is State.UNKNOWN
    assert calls == ["x"]


def test_a_crash_mid_call_is_in_progress_then_needs_reconciliation(
    client: Client, clock: ManualClock
) -> None:
    """A crash leaves the call STARTED: IN_PROGRESS while leased, then RECONCILE."""
    calls: list[str] = []

    def send(to: str) -> None:
        calls.append(to)
        raise Crash

    with pytest.raises(Crash):
        Run(client, "run-crash").tool("send")(send).at("mail")("x")
    with pytest.raises(CallInProgress):
        Run(client, "run-crash").tool("send")(send).at("mail")("x")
    clock.advance(3600)  # the lease of the crashed attempt runs out
    with pytest.raises(ReconciliationNeeded):
        Run(client, "run-crash").resume()
    with pytest.raises(ReconciliationNeeded):
        Run(client, "run-crash").tool("send")(send).at("mail")("x")
    assert calls == ["x"]


def test_a_definite_error_is_committed_and_replayed(client: Client) -> None:
    """A tool's exception is committed; the next ask raises ToolFailed unrun."""
    calls: list[int] = []

    def lookup(n: int) -> int:
        calls.append(n)
        raise ValueError(f"no such order {n}")

    with pytest.raises(ValueError, match="no such order 7"):
        Run(client, "run-err").tool("lookup", effect=Effect.READ)(lookup).at("q")(7)
    stored = client.get_tool_call("run-err", "q")
    assert stored.state is State.COMMITTED
    assert stored.result is not None
    assert not stored.result.ok

    with pytest.raises(ToolFailed) as failed:
        Run(client, "run-err").tool("lookup", effect=Effect.READ)(lookup).at("q")(7)
    assert failed.value.error_code == "ValueError"
    assert failed.value.error_message == "no such order 7"
    assert calls == [7]


def test_an_error_code_attribute_names_the_committed_error(client: Client) -> None:
    """An exception's `error_code` attribute is the stored error code."""

    class Declined(Exception):
        error_code = "CARD_DECLINED"

    def pay() -> None:
        raise Declined("insufficient funds")

    with pytest.raises(Declined):
        Run(client, "run-code").tool("pay")(pay).at("p")()
    with pytest.raises(ToolFailed) as failed:
        Run(client, "run-code").tool("pay")(pay).at("p")()
    assert failed.value.error_code == "CARD_DECLINED"


def test_approval_pending_then_rejected(client: Client) -> None:
    """A call waiting for approval does not run; a rejected one raises its error."""
    calls: list[int] = []

    def pay(cents: int) -> None:
        calls.append(cents)

    tool = Run(client, "run-ok").tool("pay", require_approval=True)(pay)
    with pytest.raises(ApprovalPending) as pending:
        tool.at("p")(5)
    with pytest.raises(ApprovalPending):
        Run(client, "run-ok").resume()
    client.decide_approval(
        "run-ok",
        "p",
        approve=False,
        approver="ada",
        reason="not expected",
        expected_revision=pending.value.call.revision,
        input_fingerprint=pending.value.call.input_fingerprint,
    )
    with pytest.raises(CallRejected) as rejected:
        tool.at("p")(5)
    assert rejected.value.result.error_code == "APPROVAL_REJECTED"
    assert calls == []


def test_an_approved_call_runs_once(client: Client) -> None:
    """Once approved, the plan says EXECUTE and the tool runs once."""
    calls: list[int] = []

    def pay(cents: int) -> int:
        calls.append(cents)
        return cents

    tool = Run(client, "run-yes").tool("pay", require_approval=True)(pay)
    with pytest.raises(ApprovalPending) as pending:
        tool.at("p")(5)
    call = pending.value.call
    client.decide_approval(
        "run-yes",
        "p",
        approve=True,
        approver="ada",
        reason="expected",
        expected_revision=call.revision,
        input_fingerprint=call.input_fingerprint,
    )
    run = Run(client, "run-yes")
    plan = run.resume()
    assert [i.action for i in plan.items] == [RecoveryAction.EXECUTE]
    again = run.tool("pay", require_approval=True)(pay)
    assert again.at("p")(5) == 5
    assert again.at("p")(5) == 5
    assert calls == [5]


def test_resume_replays_done_steps_and_retries_an_unknown_read(
    client: Client, clock: ManualClock
) -> None:
    """Step call ids are deterministic: a resumed run replays the done steps."""
    calls: list[str] = []

    def agent(run: Run, *, crash_at: int | None, retry: bool) -> list[str]:
        @run.tool("search", effect=Effect.READ, retry_unknown=retry)
        def search(q: str) -> str:
            calls.append(q)
            if len(calls) == crash_at:
                raise Crash
            return q.upper()

        return [search("a"), search("b"), search("c")]

    with pytest.raises(Crash):
        agent(Run(client, "run-steps"), crash_at=2, retry=False)
    with pytest.raises(CallInProgress):  # the crashed attempt's lease is live
        agent(Run(client, "run-steps"), crash_at=None, retry=True)
    clock.advance(3600)
    run = Run(client, "run-steps")
    plan = run.resume()
    # search-1 was handed back (so acknowledged) before the crash.
    assert [(i.call.call_id, i.action) for i in plan.items] == [
        ("search-1", RecoveryAction.ALREADY_DELIVERED),
        ("search-2", RecoveryAction.RETRY_NEEDS_POLICY),
    ]
    assert agent(run, crash_at=None, retry=True) == ["A", "B", "C"]
    assert calls == ["a", "b", "b", "c"]


def test_resume_acknowledges_the_replayed_results(
    client: Client, clock: ManualClock
) -> None:
    """A result the plan replays is acknowledged when the run asks for it."""
    quiet = Run(client, "run-ack", acknowledge=False)
    tool = quiet.tool("read", effect=Effect.READ)(lambda q: q)
    assert tool.at("r")(1) == 1
    run = Run(client, "run-ack")
    plan = run.resume()
    assert [i.action for i in plan.items] == [RecoveryAction.REPLAY_RESULT]
    assert run.tool("read", effect=Effect.READ)(lambda q: q + 1).at("r")(1) == 1
    assert "acknowledge" in client.get_tool_call("run-ack", "r").history


def test_resume_does_not_hand_out_a_delivered_result_again(client: Client) -> None:
    """Once a result is acknowledged, the plan says ALREADY_DELIVERED without
    the result, the replay says `delivered`, and nothing is acknowledged twice
    (issue 10 item 14: fails before the fix: the plan said REPLAY_RESULT with
    the result again)."""
    tool = Run(client, "run-done").tool("read", effect=Effect.READ)(lambda q: q)
    assert tool.at("r")(1) == 1  # handed back, so acknowledged
    run = Run(client, "run-done")
    plan = run.resume()
    assert [i.action for i in plan.items] == [RecoveryAction.ALREADY_DELIVERED]
    assert plan.items[0].result is None
    with run.call("read", {"q": 1}, call_id="r", effect=Effect.READ) as step:
        assert (step.execute, step.delivered, step.result) == (False, True, 1)
    history = client.get_tool_call("run-done", "r").history
    assert history.count("acknowledge") == 1


def test_a_crash_while_using_a_replayed_result_leaves_it_to_replay(
    client: Client,
) -> None:
    """A replayed result is acknowledged only after the block that uses it
    ends: an agent that dies inside gets REPLAY_RESULT again, so the result is
    not lost to an ALREADY_DELIVERED; a block that ends acknowledges it (issue
    10 item 14: fails before the fix: the acknowledgement came before the
    block)."""
    quiet = Run(client, "run-lost", acknowledge=False)
    assert quiet.tool("read", effect=Effect.READ)(lambda q: q).at("r")(1) == 1
    run = Run(client, "run-lost")
    assert [i.action for i in run.resume().items] == [RecoveryAction.REPLAY_RESULT]
    seen: list[bool] = []

    def dies_using_it() -> None:
        with run.call("read", {"q": 1}, call_id="r", effect=Effect.READ) as step:
            seen.append(step.delivered)
            raise Crash

    with pytest.raises(Crash):
        dies_using_it()
    assert seen == [False]
    plan = Run(client, "run-lost").resume()
    assert [i.action for i in plan.items] == [RecoveryAction.REPLAY_RESULT]
    with run.call("read", {"q": 1}, call_id="r", effect=Effect.READ):
        pass
    plan = Run(client, "run-lost").resume()
    assert [i.action for i in plan.items] == [RecoveryAction.ALREADY_DELIVERED]


def test_raw_results_are_bytes_both_times(client: Client) -> None:
    """With raw=True a result is committed and replayed as bytes."""
    calls: list[str] = []

    def fetch(url: str) -> bytes:
        calls.append(url)
        return b"\x00\xffpng"

    for _ in range(2):
        tool = Run(client, "run-raw").tool("fetch", effect=Effect.READ, raw=True)
        assert tool(fetch).at("f")("http://x") == b"\x00\xffpng"
    assert calls == ["http://x"]


def test_another_input_for_the_same_call_is_refused(client: Client) -> None:
    """The same call id with another input raises InputMismatch, unrun."""
    calls: list[str] = []

    def send(to: str) -> None:
        calls.append(to)

    Run(client, "run-mm").tool("send")(send).at("m")("a")
    with pytest.raises(InputMismatch):
        Run(client, "run-mm").tool("send")(send).at("m")("b")
    assert calls == ["a"]


def test_the_context_manager_runs_the_protocol(client: Client) -> None:
    """`Run.call` says whether to execute, and commits what the block set."""
    with Run(client, "run-cm").call("sum", [1, 2], call_id="s") as step:
        assert step.execute
        step.set_result(3)
    with Run(client, "run-cm").call("sum", [1, 2], call_id="s") as step:
        assert not step.execute
        assert step.result == 3
    call = client.get_tool_call("run-cm", "s")
    assert call.result is not None
    assert call.result.value == 3


def test_an_idempotent_write_without_a_key_parameter_is_refused(
    client: Client,
) -> None:
    """A tool that cannot take the idempotency key is refused when decorated."""

    def charge(cents: int) -> int:
        return cents

    with pytest.raises(TypeError, match="idempotency_key"):
        Run(client, "run-k").tool("charge", effect=Effect.IDEMPOTENT_WRITE)(charge)
    assert list(client.list_tool_calls("run-k")) == []
