"""Inside the safe call's boundary: the lease is renewed while the tool runs,
a deadline ends it as an unknown outcome, the result handed back is
acknowledged, and an IDEMPOTENT_WRITE tool always gets its key."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from effectd_client import (
    AsyncClient,
    AsyncRun,
    Client,
    Decision,
    Effect,
    ReconciliationNeeded,
    Run,
    State,
    ToolCall,
    ToolFailed,
    ToolTimedOut,
    current_call,
)
from effectd_client._recording import RecordingRetry
from sidecar.clock import ManualClock
from sidecar.testing import RunningDaemon

FAST_BEAT = 0.01  # seconds between heartbeats in these tests
ROUNDS = 4  # x 20 s of the manual clock: well past the 30 s lease


class CountingClient(Client):
    """A real client that signals each heartbeat the daemon answered."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.beats = threading.Semaphore(0)

    def heartbeat(
        self,
        run_id: str,
        call_id: str,
        attempt: int,
        lease_ms: int = 0,
        *,
        retry: RecordingRetry | None = None,
    ) -> ToolCall:
        answer = super().heartbeat(run_id, call_id, attempt, lease_ms, retry=retry)
        self.beats.release()
        return answer


def outlive_the_lease(client: CountingClient, clock: ManualClock) -> None:
    """Moves the daemon's clock 80 s on in steps of 20 s, each step followed
    by two heartbeats (so one was surely handled after the step)."""
    for _ in range(ROUNDS):
        while client.beats.acquire(blocking=False):
            pass
        clock.advance(20)
        for _ in range(2):
            assert client.beats.acquire(timeout=30)


def test_a_tool_running_longer_than_its_lease_keeps_it(
    daemon: RunningDaemon, clock: ManualClock
) -> None:
    """While a sync tool runs 80 s of the daemon's clock (lease 30 s), the
    heartbeat keeps the call IN_PROGRESS for anyone else, and its result is
    committed (issue 10 item B5: fails before the fix: RECONCILE, the lease
    looked dead)."""
    decisions = []
    client = CountingClient(daemon.target)
    with client, Client(daemon.target) as other:

        @Run(client, "run-long", heartbeat_interval=FAST_BEAT).tool("export")
        def export() -> str:
            outlive_the_lease(client, clock)
            p = other.prepare_tool("run-long", "e", "export", {}, start=True)
            decisions.append(p.decision)
            return "done"

        assert export.at("e")() == "done"
        assert decisions == [Decision.IN_PROGRESS]
        assert client.get_tool_call("run-long", "e").state is State.COMMITTED


def test_negative_control_without_heartbeats_the_lease_runs_out(
    daemon: RunningDaemon, clock: ManualClock
) -> None:
    """The check above sees a safe call that never heartbeats: the other
    agent is told RECONCILE while the tool still runs."""
    with Client(daemon.target) as client, Client(daemon.target) as other:

        @Run(client, "run-dead", heartbeat_interval=0).tool("export")
        def export() -> str:
            clock.advance(20 * ROUNDS)
            p = other.prepare_tool("run-dead", "e", "export", {}, start=True)
            return p.decision.name

        assert export.at("e")() == "RECONCILE"


def test_an_async_tool_keeps_its_lease(
    daemon: RunningDaemon, clock: ManualClock
) -> None:
    """AsyncRun renews the lease from a task while the tool awaits (issue 10
    item B5: fails before the fix)."""

    class Counting(AsyncClient):
        beats: asyncio.Queue[None]

        async def heartbeat(
            self,
            run_id: str,
            call_id: str,
            attempt: int,
            lease_ms: int = 0,
            *,
            retry: RecordingRetry | None = None,
        ) -> ToolCall:
            answer = await super().heartbeat(
                run_id, call_id, attempt, lease_ms, retry=retry
            )
            self.beats.put_nowait(None)
            return answer

    async def main() -> Decision:
        client = Counting(daemon.target)
        client.beats = asyncio.Queue()
        async with client:
            run = AsyncRun(client, "run-aio", heartbeat_interval=FAST_BEAT)

            @run.tool("export")
            async def export() -> Decision:
                for _ in range(ROUNDS):
                    while not client.beats.empty():
                        client.beats.get_nowait()
                    clock.advance(20)
                    for _ in range(2):
                        await asyncio.wait_for(client.beats.get(), 30)
                p = await client.prepare_tool("run-aio", "e", "export", {})
                return p.decision

            return await export.at("e")()

    assert asyncio.run(main()) is Decision.IN_PROGRESS


def test_a_deadline_ends_a_sync_tool_as_unknown_never_failed(client: Client) -> None:
    """Past `timeout` the call raises ToolTimedOut, the side effect is
    UNKNOWN (never an error result), and the tool sees `cancelled` (issue 10
    item B5: fails before the fix: there was no deadline)."""
    woke = threading.Event()

    @Run(client, "run-late").tool("transfer", timeout=0.05)
    def transfer(eur: int) -> str:
        step = current_call()
        assert step is not None
        step.cancelled.wait(timeout=60)
        woke.set()
        return "sent, too late"

    with pytest.raises(ToolTimedOut) as raised:
        transfer.at("t")(10)
    assert isinstance(raised.value, TimeoutError)
    assert woke.wait(timeout=60)
    call = client.get_tool_call("run-late", "t")
    assert (call.state, call.result) == (State.UNKNOWN, None)
    with pytest.raises(ReconciliationNeeded):
        transfer.at("t")(10)


def test_a_deadline_cancels_an_async_tool_as_unknown(daemon: RunningDaemon) -> None:
    """AsyncRun cancels the tool at its deadline; the outcome is unknown
    (issue 10 item B5: fails before the fix)."""
    seen: list[str] = []

    async def main() -> ToolCall:
        async with AsyncClient(daemon.target) as client:

            @AsyncRun(client, "run-alate").tool("transfer", timeout=0.05)
            async def transfer(eur: int) -> str:
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    seen.append("cancelled")
                    raise
                return "never"

            with pytest.raises(ToolTimedOut):
                await transfer.at("t")(10)
            return await client.get_tool_call("run-alate", "t")

    call = asyncio.run(main())
    assert seen == ["cancelled"]
    assert (call.state, call.result) == (State.UNKNOWN, None)


def test_a_block_that_finishes_after_its_deadline_commits_what_it_knows(
    client: Client,
) -> None:
    """In the context manager the deadline is a signal: a block that still
    returns its result has a known outcome, and it is committed."""
    with Run(client, "run-cm").call("sum", [1, 2], call_id="s", timeout=0) as step:
        assert step.cancelled.wait(timeout=60)
        step.set_result(3)
    call = client.get_tool_call("run-cm", "s")
    assert call.result is not None
    assert (call.state, call.result.value) == (State.COMMITTED, 3)


# -- acknowledgement (G28) ------------------------------------------------------


def acknowledged(client: Client, run_id: str, call_id: str) -> bool:
    return "acknowledge" in client.get_tool_call(run_id, call_id).history


def test_results_handed_back_are_acknowledged(client: Client) -> None:
    """A fresh result, its replay and an error result are acknowledged once
    the safe call hands them back (issue 10 item G28: fails before the fix:
    only replays named by a recovery plan were)."""
    run = Run(client, "run-ack")
    tool = run.tool("read", effect=Effect.READ)(lambda q: q)
    assert tool.at("fresh")(1) == 1
    assert acknowledged(client, "run-ack", "fresh")

    @run.tool("fail", effect=Effect.READ)
    def fail() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        fail.at("err")()
    assert acknowledged(client, "run-ack", "err")
    with pytest.raises(ToolFailed):
        fail.at("err")()


def test_acknowledge_false_leaves_it_to_the_agent(client: Client) -> None:
    """With `acknowledge=False` the agent acknowledges after its transcript."""
    tool = Run(client, "run-noack", acknowledge=False).tool("t")(lambda: 1)
    assert tool.at("c")() == 1
    assert not acknowledged(client, "run-noack", "c")
    client.acknowledge_recovery("run-noack", ["c"])
    assert acknowledged(client, "run-noack", "c")


def test_a_replay_is_acknowledged_without_a_recovery_plan(client: Client) -> None:
    """A committed call asked again (no `resume()`) is acknowledged."""
    quiet = Run(client, "run-rep", acknowledge=False).tool("t")(lambda: 5)
    assert quiet.at("c")() == 5
    assert Run(client, "run-rep").tool("t")(lambda: 6).at("c")() == 5
    assert acknowledged(client, "run-rep", "c")


# -- the idempotency key (G31) --------------------------------------------------


def test_a_key_parameter_without_a_default_gets_the_key(client: Client) -> None:
    """`idempotency_key` without a default is bound by the safe call (issue
    10 item G31: fails before the fix: a bare TypeError, missing argument)."""
    keys: list[str] = []

    @Run(client, "run-key").tool("charge", effect=Effect.IDEMPOTENT_WRITE)
    def charge(cents: int, idempotency_key: str) -> int:
        keys.append(idempotency_key)
        step = current_call()
        assert step is not None
        assert step.idempotency_key == idempotency_key
        return cents

    # A type checker asks for the key (the signature has it without default);
    # the safe call binds it.
    assert charge.at("c")(5) == 5  # type: ignore[call-arg]
    assert keys == ["run-key:c"]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((5, "mine"), {}), ((5,), {"idempotency_key": "mine"})],
    ids=["positional", "keyword"],
)
def test_a_caller_given_key_is_refused_before_anything_is_recorded(
    client: Client, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """The key is the ledger's, never the caller's: refused with a message
    that says so, and nothing is prepared."""

    @Run(client, "run-own").tool("charge", effect=Effect.IDEMPOTENT_WRITE)
    def charge(cents: int, idempotency_key: str) -> int:
        return cents

    with pytest.raises(TypeError, match="given by the safe call"):
        charge.at("c")(*args, **kwargs)
    assert list(client.list_tool_calls("run-own")) == []


def test_a_positional_only_key_is_refused_at_decoration(client: Client) -> None:
    """A key the safe call cannot pass by name is refused when decorated."""

    def charge(cents: int, idempotency_key: str, /) -> int:
        return cents

    with pytest.raises(TypeError, match="keyword parameter"):
        Run(client, "run-po").tool("charge", effect=Effect.IDEMPOTENT_WRITE)(charge)
