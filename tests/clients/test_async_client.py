"""The asyncio client and safe call behave as the sync ones, on a real daemon."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from effectd_client import (
    AsyncClient,
    AsyncRun,
    Client,
    Decision,
    Effect,
    EffectdError,
    InputMismatch,
    ReconciliationNeeded,
    RecoveryAction,
    RetryRequired,
    RevisionConflict,
    State,
    ToolFailed,
)
from sidecar.clock import ManualClock
from sidecar.testing import RunningDaemon

T = TypeVar("T")


def run_with(daemon: RunningDaemon, body: Callable[[AsyncClient], Awaitable[T]]) -> T:
    """Runs `body` with a fresh AsyncClient on its own event loop."""

    async def main() -> T:
        async with AsyncClient(daemon.target) as client:
            return await body(client)

    return asyncio.run(main())


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(fn)
        for name, fn in vars(cls).items()
        if callable(fn) and not name.startswith("_")
    }


def test_async_client_has_the_sync_clients_methods() -> None:
    """Every public method of Client exists on AsyncClient with its parameters."""
    sync, aio = public_methods(Client), public_methods(AsyncClient)
    assert sync.keys() == aio.keys()
    for name, signature in sync.items():
        assert list(signature.parameters) == list(aio[name].parameters), name


def test_prepare_start_commit_and_read_back(daemon: RunningDaemon) -> None:
    """A call prepared, committed and read through grpc.aio is COMMITTED."""

    async def body(c: AsyncClient) -> None:
        p = await c.prepare_tool("run-a", "c1", "search", {"q": 1})
        assert p.decision is Decision.EXECUTE
        assert not p.attempt_held
        s = await c.start_tool("run-a", "c1")
        assert s.attempt_held
        await c.heartbeat("run-a", "c1", s.call.attempt)
        await c.commit_tool("run-a", "c1", s.call.attempt, {"hits": 2})
        done = await c.get_tool_call("run-a", "c1")
        assert done.state is State.COMMITTED
        assert done.result is not None
        assert done.result.value == {"hits": 2}
        listed = [x.call_id async for x in c.list_tool_calls("run-a")]
        assert listed == ["c1"]
        every = c.list_tool_calls("run-a", all_namespaces=True)
        assert [(x.namespace, x.call_id) async for x in every] == [("default", "c1")]

    run_with(daemon, body)


def test_recover_reconcile_and_acknowledge(
    daemon: RunningDaemon, clock: ManualClock
) -> None:
    """The recovery flow works through the async client end to end."""

    async def body(c: AsyncClient) -> None:
        lost = await c.prepare_tool("run-b", "mail", "send", {"to": "x"}, start=True)
        await c.report_unknown("run-b", "mail", lost.call.attempt, "timeout")
        plan = await c.recover("run-b")
        assert [i.action for i in plan.items] == [RecoveryAction.RECONCILE]
        unknown = await c.get_tool_call("run-b", "mail")
        await c.reconcile(
            "run-b",
            "mail",
            expected_revision=unknown.revision,
            operator="grace",
            reason="found it",
            evidence="message-id 42",
            result={"sent": True},
        )
        await c.acknowledge_recovery("run-b", ["mail"])
        assert not (await c.recover("run-b")).interrupted

    run_with(daemon, body)


def test_approval_through_the_async_client(daemon: RunningDaemon) -> None:
    """An approval decided through the async client makes the call PREPARED."""

    async def body(c: AsyncClient) -> None:
        w = await c.prepare_tool(
            "run-c", "pay", "pay", {"cents": 1}, require_approval=True
        )
        assert w.decision is Decision.AWAIT_APPROVAL
        approved = await c.decide_approval(
            "run-c",
            "pay",
            approve=True,
            approver="ada",
            reason="ok",
            expected_revision=w.call.revision,
            input_fingerprint=w.call.input_fingerprint,
        )
        assert approved.state is State.PREPARED

    run_with(daemon, body)


def test_checkpoints_through_the_async_client(daemon: RunningDaemon) -> None:
    """Checkpoints put, read, list, conflict and delete by revision."""

    async def body(c: AsyncClient) -> None:
        assert await c.get_checkpoint("k") is None
        rev = await c.put_checkpoint("k", b"v1")
        with pytest.raises(RevisionConflict) as conflict:
            await c.put_checkpoint("k", b"v2", expected_revision=rev + 5)
        assert conflict.value.current_revision == rev
        got = await c.get_checkpoint("k")
        assert got is not None
        assert got.value == b"v1"
        assert [x.key async for x in c.list_checkpoints("k")] == ["k"]
        await c.delete_checkpoint("k", rev)
        assert await c.get_checkpoint("k") is None

    run_with(daemon, body)


def test_async_errors_are_the_reason_classes(daemon: RunningDaemon) -> None:
    """A refusal over grpc.aio raises the same reason class as the sync client."""

    async def body(c: AsyncClient) -> None:
        await c.prepare_tool("run-d", "c", "t", {"a": 1})
        with pytest.raises(InputMismatch) as mismatch:
            await c.prepare_tool("run-d", "c", "t", {"a": 2})
        assert isinstance(mismatch.value, EffectdError)
        assert mismatch.value.reason == "INPUT_MISMATCH"

    run_with(daemon, body)


# -- the async safe call -----------------------------------------------------


def test_async_tool_is_replayed_after_a_crash(daemon: RunningDaemon) -> None:
    """A new async client and decorator get the stored result without a run."""
    calls: list[str] = []

    async def agent(c: AsyncClient) -> Any:
        @AsyncRun(c, "run-e").tool("send", effect=Effect.SIDE_EFFECT)
        async def send(to: str) -> dict[str, str]:
            calls.append(to)
            return {"to": to}

        return await send.at("mail")("a")

    assert run_with(daemon, agent) == {"to": "a"}
    assert run_with(daemon, agent) == {"to": "a"}
    assert calls == ["a"]


def test_async_idempotent_write_keeps_its_key(daemon: RunningDaemon) -> None:
    """An async IDEMPOTENT_WRITE that timed out is retried with the same key."""
    keys: list[str] = []

    async def charge(cents: int, *, idempotency_key: str = "") -> int:
        keys.append(idempotency_key)
        if len(keys) == 1:
            raise TimeoutError  # what `asyncio.wait_for` raises when time is up
        return cents

    def attempt(retry: bool) -> Callable[[AsyncClient], Awaitable[int]]:
        async def body(c: AsyncClient) -> int:
            run = AsyncRun(c, "run-f")
            tool = run.tool(
                "charge", effect=Effect.IDEMPOTENT_WRITE, retry_unknown=retry
            )(charge)
            return await tool.at("charge")(5)

        return body

    with pytest.raises(asyncio.TimeoutError):
        run_with(daemon, attempt(retry=False))
    with pytest.raises(RetryRequired):
        run_with(daemon, attempt(retry=False))
    assert run_with(daemon, attempt(retry=True)) == 5
    assert keys == ["run-f:charge", "run-f:charge"]


def test_async_cancelled_side_effect_needs_reconciliation(
    daemon: RunningDaemon,
) -> None:
    """A cancelled async SIDE_EFFECT is reported UNKNOWN and never runs again."""
    calls: list[str] = []
    running = asyncio.Event()

    async def send(to: str) -> None:
        calls.append(to)
        running.set()
        await asyncio.Event().wait()  # until cancelled

    async def cancel_mid_call(c: AsyncClient) -> None:
        tool = AsyncRun(c, "run-g").tool("send")(send)
        task = asyncio.ensure_future(tool.at("mail")("x"))
        await asyncio.wait_for(running.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await c.get_tool_call("run-g", "mail")).state is State.UNKNOWN

    async def ask_again(c: AsyncClient) -> None:
        with pytest.raises(ReconciliationNeeded):
            await AsyncRun(c, "run-g").tool("send")(send).at("mail")("x")
        with pytest.raises(ReconciliationNeeded):
            await AsyncRun(c, "run-g").resume()

    run_with(daemon, cancel_mid_call)
    run_with(daemon, ask_again)
    assert calls == ["x"]


def test_async_definite_error_is_replayed_as_tool_failed(
    daemon: RunningDaemon,
) -> None:
    """An async tool's error is committed; asking again raises ToolFailed."""
    calls: list[int] = []

    async def lookup(n: int) -> int:
        calls.append(n)
        raise KeyError(n)

    async def ask(c: AsyncClient) -> int:
        return await AsyncRun(c, "run-h").tool("lookup")(lookup)(n=3)

    with pytest.raises(KeyError):
        run_with(daemon, ask)
    with pytest.raises(ToolFailed) as failed:
        run_with(daemon, ask)
    assert failed.value.error_code == "KeyError"
    assert failed.value.call.call_id == "lookup-1"
    assert calls == [3]


def test_async_context_manager_replays(daemon: RunningDaemon) -> None:
    """`AsyncRun.call` executes once, then yields the stored result."""

    async def body(c: AsyncClient) -> list[bool]:
        seen = []
        for _ in range(2):
            async with AsyncRun(c, "run-i").call("sum", [1, 2], call_id="s") as s:
                seen.append(s.execute)
                if s.execute:
                    s.set_result(3)
                else:
                    assert s.result == 3
        return seen

    assert run_with(daemon, body) == [True, False]


def test_async_resume_acknowledges_after_the_block(daemon: RunningDaemon) -> None:
    """`AsyncRun` acknowledges a replayed result when its block ends, not
    before: a failure inside leaves REPLAY_RESULT; after a clean block the plan
    says ALREADY_DELIVERED and the replay `delivered` (issue 10 item 14: fails
    before the fix: acknowledged before the block)."""

    async def body(c: AsyncClient) -> list[RecoveryAction]:
        quiet = AsyncRun(c, "run-j", acknowledge=False)
        async with quiet.call("sum", [1, 2], call_id="s") as s:
            s.set_result(3)
        run = AsyncRun(c, "run-j")
        await run.resume()
        with pytest.raises(KeyError):
            async with run.call("sum", [1, 2], call_id="s"):
                raise KeyError("the agent failed while using the result")
        actions = [i.action for i in (await AsyncRun(c, "run-j").resume()).items]
        run = AsyncRun(c, "run-j")
        await run.resume()
        async with run.call("sum", [1, 2], call_id="s") as s:
            assert not s.delivered
        run = AsyncRun(c, "run-j")
        actions += [i.action for i in (await run.resume()).items]
        async with run.call("sum", [1, 2], call_id="s") as s:
            assert (s.execute, s.delivered, s.result) == (False, True, 3)
        return actions

    assert run_with(daemon, body) == [
        RecoveryAction.REPLAY_RESULT,
        RecoveryAction.ALREADY_DELIVERED,
    ]


def test_recover_reads_every_page_of_a_plan(daemon: RunningDaemon) -> None:
    """`recover` joins the pages of a plan larger than a page, in call_id
    order, interrupted when any page is; `recover_pages` yields the pages
    themselves; sync and async alike."""
    ids = [f"c{i:02d}" for i in range(7)]

    async def body(c: AsyncClient) -> None:
        for call_id in ids:
            await c.prepare_tool("run-p", call_id, "search", {"q": call_id})
        await c.prepare_tool("run-p", "z", "pay", {}, require_approval=True)
        plan = await c.recover("run-p", page_size=3)
        assert [i.call.call_id for i in plan.items] == [*ids, "z"]
        assert plan.interrupted
        pages = [p async for p in c.recover_pages("run-p", page_size=3)]
        assert [len(p.items) for p in pages] == [3, 3, 2]
        assert [p.interrupted for p in pages] == [False, False, True]

    run_with(daemon, body)
    with Client(daemon.target) as c:
        plan = c.recover("run-p", page_size=3)
        assert [i.call.call_id for i in plan.items] == [*ids, "z"]
        assert plan.interrupted
        pages = list(c.recover_pages("run-p", page_size=2))
        assert [len(p.items) for p in pages] == [2, 2, 2, 2]
        assert c.recover("run-p") == plan
