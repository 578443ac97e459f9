"""The lease sweep: STARTED calls whose lease ran out become UNKNOWN
without anyone touching them, in bounded batches, on the injected clock."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from effectd.v1 import admin_pb2, admin_pb2_grpc, ledger_pb2_grpc
from effectd.v1 import ledger_pb2 as pb

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.ledger.model import (
    KEY_SCHEMES,
    CallRef,
    Effect,
    Payload,
    PayloadKind,
    State,
)
from sidecar.ledger.policy import FixedPolicy
from sidecar.ledger.rules import PrepareSpec
from sidecar.ledger.validation import Limits
from sidecar.services.lease_sweep import LeaseSweep, SweepPass
from sidecar.services.ledger import LedgerService
from sidecar.storage import keys, records
from sidecar.storage.api import Table
from sidecar.storage.lmdb.store import LmdbStore
from sidecar.testing import running_daemon
from tests.ledger.builders import started
from tests.rpc.support import prepare_request, ref
from tests.support.postgres import both_stores  # noqa: F401  (each store)

Ledger = ledger_pb2_grpc.ToolLedgerStub
INTERVAL = 5.0


def _started(ledger: Ledger, call_id: str, lease_ms: int) -> pb.ToolCall:
    answer = ledger.PrepareTool(
        prepare_request("run", call_id, start=True, lease_ms=lease_ms), timeout=5
    )
    assert answer.attempt_held
    return answer.call


def _state(ledger: Ledger, call_id: str) -> pb.ToolCall:
    return ledger.GetToolCall(
        pb.GetToolCallRequest(ref=ref("run", call_id)), timeout=5
    ).call


def _listed(ledger: Ledger, state: pb.CallState.ValueType) -> list[str]:
    page = ledger.ListToolCalls(
        pb.ListToolCallsRequest(run_id="run", states=[state]), timeout=5
    )
    return [c.ref.call_id for c in page.calls]


def test_the_daemon_settles_expired_calls_on_its_clock(
    config: ServeConfig, clock: ManualClock
) -> None:
    """Once the injected clock passes a lease and an interval, the daemon's own
    task turns the untouched call UNKNOWN: listings and stats count it as
    waiting for a person; a call with a live lease stays STARTED (issue 10
    item 15: fails before the fix: nothing settled it until touched)."""
    fast = dataclasses.replace(config, settle_interval_seconds=INTERVAL)
    with (
        running_daemon(fast, clock) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        ledger = Ledger(channel)
        _started(ledger, "stuck", lease_ms=1000)
        _started(ledger, "live", lease_ms=600_000)
        running.wait_for_periodic_tasks()
        clock.advance(INTERVAL / 2)  # past the lease, not yet the interval
        assert _listed(ledger, pb.CALL_STATE_STARTED) == ["live", "stuck"]
        clock.advance(INTERVAL / 2)
        # The task woke, ran its pass (committed), and sleeps again.
        running.wait_for_periodic_tasks()
        stuck = _state(ledger, "stuck")
        assert stuck.state == pb.CALL_STATE_UNKNOWN
        assert stuck.history[-1].event == "expire"
        assert stuck.history[-1].actor == "effectd"
        assert _state(ledger, "live").state == pb.CALL_STATE_STARTED
        assert _listed(ledger, pb.CALL_STATE_UNKNOWN) == ["stuck"]
        stats = admin_pb2_grpc.AdminStub(channel).GetStats(
            admin_pb2.GetStatsRequest(), timeout=5
        )
        [ns] = stats.namespaces
        assert (ns.started, ns.unknown) == (1, 1)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LmdbStore]:
    s = LmdbStore(tmp_path / "data")
    yield s
    s.close()


def _spec(call_id: str, lease_ms: int) -> PrepareSpec:
    return PrepareSpec(
        ref=CallRef("default", "run", call_id),
        tool_name="tool",
        effect=Effect.SIDE_EFFECT,
        input=Payload(PayloadKind.JSON, b"{}"),
        fingerprint="sha256:" + "0" * 64,
        require_approval=False,
        start=True,
        lease_ms=lease_ms,
    )


def _states(store: LmdbStore) -> dict[str, State]:
    calls = store.read(
        lambda view: [
            records.decode_call(raw)
            for _, raw in view.scan(Table.CALLS, keys.namespace_prefix("default"))
        ]
    )
    return {c.ref.call_id: c.state for c in calls}


def test_a_pass_settles_in_bounded_batches(
    store: LmdbStore, clock: ManualClock
) -> None:
    """Five expired calls and one live one, batches of two: three full write
    transactions and one that finds the end, the five settled, the live one
    untouched; a second pass finds nothing to do."""
    ledger = LedgerService(store, clock, Limits(), FixedPolicy())
    service = LeaseSweep(store, clock, batch=2)

    async def scenario() -> tuple[SweepPass, SweepPass]:
        for i in range(5):
            await ledger.prepare(_spec(f"c{i}", lease_ms=1000))
        await ledger.prepare(_spec("live", lease_ms=60_000))
        clock.advance(2)
        return await service.sweep(), await service.sweep()

    first, second = asyncio.run(scenario())
    assert first == SweepPass(examined=6, settled=5, transactions=4)
    assert second == SweepPass(examined=1, settled=0, transactions=1)
    states = _states(store)
    assert states.pop("live") is State.STARTED
    assert set(states.values()) == {State.UNKNOWN}


def test_a_batch_size_below_one_is_refused(store: LmdbStore) -> None:
    """A pass must make progress: a batch of 0 is a programming error."""
    with pytest.raises(ValueError, match="batch"):
        LeaseSweep(store, ManualClock(), batch=0)


def test_a_pass_walks_past_a_call_of_an_unknown_key_scheme(
    store: LmdbStore, clock: ManualClock
) -> None:
    """A STARTED call of a key scheme this daemon does not know is left as it
    is (it is refused whenever touched), and the expired call after it is
    settled all the same: one such call must not stop the pass."""
    ledger = LedgerService(store, clock, Limits(), FixedPolicy())

    async def prepare() -> None:
        await ledger.prepare(_spec("b-expired", lease_ms=1000))

    asyncio.run(prepare())
    future = dataclasses.replace(
        started(Effect.SIDE_EFFECT),
        ref=CallRef("default", "run", "a-future"),
        key_scheme=max(KEY_SCHEMES) + 1,
    )
    store.submit(functools.partial(records.save_call, old=None, new=future)).result()
    clock.advance(2)
    done = asyncio.run(LeaseSweep(store, clock).sweep())
    assert done.settled == 1
    assert _states_by_index(store) == {
        "a-future": State.STARTED,
        "b-expired": State.UNKNOWN,
    }


def _states_by_index(store: LmdbStore) -> dict[str, State]:
    """The by-state index, without decoding records."""
    found = {}
    index = store.read(lambda view: list(view.scan(Table.CALL_STATES, b"")))
    for state in State:
        prefix = records.state_prefix(state)
        for key, _ in index:
            if key.startswith(prefix):
                found[key.rsplit(b"\x00", 1)[1].decode()] = state
    return found
