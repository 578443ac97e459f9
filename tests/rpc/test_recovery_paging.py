"""Paged `effectd.v1.Recovery.Recover` through a real server: pages of every
size cover the plan once, in call_id order; page tokens stay inside their
run and namespace; calls added while a plan is paged are never repeated and
never push one out; acknowledging the calls of one page leaves the others
as they were; a plan too big for one answer is refused, never cut short."""

from __future__ import annotations

import base64
import functools
import random
import threading
from typing import Any

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc, recovery_pb2_grpc
from effectd.v1 import recovery_pb2 as rpb

from sidecar.clock import ManualClock
from sidecar.rpc import recovery as rpc_recovery
from tests.rpc.support import expect_refusal, prepare_request, ref

Ledger = ledger_pb2_grpc.ToolLedgerStub
Recovery = recovery_pb2_grpc.RecoveryStub
INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture
def recovery_stub(channel: grpc.Channel) -> Recovery:
    return recovery_pb2_grpc.RecoveryStub(channel)


def _recover(stub: Recovery, **kw: Any) -> rpb.RecoverResponse:
    kw.setdefault("run_id", "run")
    return stub.Recover(rpb.RecoverRequest(**kw), timeout=10)


def _committed(ledger: Ledger, call_id: str, run_id: str = "run") -> None:
    answer = ledger.PrepareTool(prepare_request(run_id, call_id, start=True))
    ledger.CommitTool(
        pb.CommitToolRequest(
            ref=ref(run_id, call_id),
            attempt=answer.call.attempt,
            result=pb.ToolResult(
                outcome=pb.OUTCOME_OK, payload=pb.Payload(json=f'"{call_id}"')
            ),
        ),
        timeout=5,
    )


def _mixed_run(ledger: Ledger, count: int) -> None:
    """`count` calls c000.. of every kind recovery plans for."""
    for i in range(count):
        call_id = f"c{i:03d}"
        match i % 4:
            case 0:
                _committed(ledger, call_id)
            case 1:
                ledger.PrepareTool(prepare_request("run", call_id), timeout=5)
            case 2:
                ledger.PrepareTool(
                    prepare_request("run", call_id, start=True, lease_ms=1000),
                    timeout=5,
                )
            case _:
                ledger.PrepareTool(
                    prepare_request("run", call_id, require_approval=True), timeout=5
                )


def _pages(stub: Recovery, size: int, **kw: Any) -> list[rpb.RecoverResponse]:
    pages = []
    token = ""
    for _ in range(10_000):
        page = _recover(stub, page_size=size, page_token=token, **kw)
        pages.append(page)
        token = page.next_page_token
        if not token:
            return pages
    raise AssertionError("paging did not end")


def _ids(pages: list[rpb.RecoverResponse]) -> list[str]:
    return [i.call.ref.call_id for p in pages for i in p.items]


@pytest.mark.parametrize("size", [1, 2, 7, 25, 26, 1000])
def test_pages_of_any_size_hold_the_whole_plan_once(
    ledger_stub: Ledger, recovery_stub: Recovery, clock: ManualClock, size: int
) -> None:
    """The pages, joined, are the unpaged plan item for item (the stale
    STARTED calls settled once, counted by the pages that settled them);
    every page but the last is full and has a token."""
    _mixed_run(ledger_stub, 25)
    clock.advance(2)  # the leases of the STARTED calls ran out
    pages = _pages(recovery_stub, size)
    whole = _recover(recovery_stub)
    assert [i for p in pages for i in p.items] == list(whole.items)
    assert _ids(pages) == sorted(_ids(pages)) == [f"c{i:03d}" for i in range(25)]
    assert sum(p.settled for p in pages) == 6
    assert whole.settled == 0  # settled by the pages already
    assert all(len(p.items) == size and p.next_page_token for p in pages[:-1])
    assert 1 <= len(pages[-1].items) <= size
    assert not pages[-1].next_page_token
    assert any(p.interrupted for p in pages)
    assert whole.interrupted
    assert all(
        p.interrupted
        == any(
            i.action
            in (rpb.RECOVERY_ACTION_RECONCILE, rpb.RECOVERY_ACTION_WAIT_FOR_APPROVAL)
            for i in p.items
        )
        for p in pages
    )


def test_an_empty_run_is_one_empty_page(recovery_stub: Recovery) -> None:
    page = _recover(recovery_stub, page_size=10)
    assert (list(page.items), page.next_page_token) == ([], "")


@pytest.mark.parametrize("size", [1001, 2**32 - 1])
def test_a_page_size_out_of_bounds_is_refused(
    recovery_stub: Recovery, size: int
) -> None:
    got = expect_refusal(
        lambda: _recover(recovery_stub, page_size=size), INVALID, "INVALID_REQUEST"
    )
    assert got.fields == ("page_size",)


def _token_of(namespace: str, run_id: str, call_id: str) -> str:
    key = f"{namespace}\x00{run_id}\x00{call_id}".encode()
    return base64.urlsafe_b64encode(key).decode()


def test_a_token_leads_nowhere_outside_its_run_and_namespace(
    ledger_stub: Ledger, recovery_stub: Recovery
) -> None:
    """A token of another run, of the same run in another namespace, a
    forged one naming another run's key, or garbage: INVALID_ARGUMENT on
    page_token, never a call of another run or namespace."""
    for ns in ("", "other"):
        for run_id in ("run", "run2"):
            for i in range(3):
                ledger_stub.PrepareTool(
                    prepare_request(run_id, f"c{i}", namespace=ns), timeout=5
                )
    own = _recover(recovery_stub, page_size=1).next_page_token
    assert own
    foreign = [
        _recover(recovery_stub, run_id="run2", page_size=1).next_page_token,
        _recover(recovery_stub, namespace="other", page_size=1).next_page_token,
        _token_of("default", "run2", "c0"),
        _token_of("other", "run", "c0"),
        _token_of("default", "ru", ""),
        "not base64!",
        base64.urlsafe_b64encode(b"").decode() + "=",
        "x" * 10_000,
    ]
    for token in foreign:
        for size in (1, 0):
            got = expect_refusal(
                functools.partial(
                    _recover, recovery_stub, page_size=size, page_token=token
                ),
                INVALID,
                "INVALID_REQUEST",
            )
            assert got.fields == ("page_token",), token
    # The run's own token goes on inside the run and namespace.
    rest = _recover(recovery_stub, page_size=10, page_token=own)
    assert [i.call.ref.call_id for i in rest.items] == ["c1", "c2"]
    assert {(i.call.ref.namespace, i.call.ref.run_id) for i in rest.items} == {
        ("default", "run")
    }


def test_another_namespace_sees_an_empty_plan_and_acknowledges_nothing(
    ledger_stub: Ledger, recovery_stub: Recovery
) -> None:
    """A run's calls are never in another namespace's plan, and that
    namespace's acknowledgement of them is NOT_FOUND."""
    _committed(ledger_stub, "c0")
    assert list(_recover(recovery_stub, namespace="other", page_size=5).items) == []
    got = expect_refusal(
        lambda: recovery_stub.AcknowledgeRecovery(
            rpb.AcknowledgeRecoveryRequest(
                namespace="other", run_id="run", call_ids=["c0"]
            ),
            timeout=5,
        ),
        grpc.StatusCode.NOT_FOUND,
        "NOT_FOUND",
    )
    assert got.metadata["index"] == "0"
    item = _recover(recovery_stub, page_size=5).items[0]
    assert item.action == rpb.RECOVERY_ACTION_REPLAY_RESULT


def test_calls_added_between_pages_are_never_repeated_or_lose_one(
    ledger_stub: Ledger, recovery_stub: Recovery
) -> None:
    """Seeded: while a plan is paged, calls are added before and after the
    cursor. Every call that existed before paging is in exactly one page, in
    order; an added call is in a later page exactly when it sorts after the
    last call read."""
    seed = random.randrange(2**32)  # noqa: S311 - a test seed
    print(f"seed={seed}")
    rng = random.Random(seed)  # noqa: S311 - not a secret
    initial = [f"c{i:03d}" for i in range(0, 60, 2)]
    for call_id in initial:
        ledger_stub.PrepareTool(prepare_request("run", call_id), timeout=5)
    seen: list[str] = []
    expected_added: set[str] = set()
    token = ""
    for _ in range(1000):
        page = _recover(recovery_stub, page_size=rng.randint(1, 5), page_token=token)
        seen.extend(i.call.ref.call_id for i in page.items)
        token = page.next_page_token
        if not token:
            break
        for _ in range(rng.randint(0, 3)):
            call_id = f"c{rng.randrange(60):03d}{rng.choice('ab')}"
            if call_id in expected_added or any(call_id == s for s in seen):
                continue
            ledger_stub.PrepareTool(prepare_request("run", call_id), timeout=5)
            if call_id > seen[-1]:
                expected_added.add(call_id)
    assert len(seen) == len(set(seen)), seed
    assert seen == sorted(seen), seed
    assert set(initial) <= set(seen), seed
    assert set(seen) - set(initial) == expected_added, seed


def test_calls_added_by_another_client_while_paging_change_no_page(
    daemon: Any, recovery_stub: Recovery
) -> None:
    """Calls prepared on another channel while the plan is paged: no call is
    repeated, every call prepared before paging is in the plan once."""
    with grpc.insecure_channel(daemon.target) as ch:
        writer = ledger_pb2_grpc.ToolLedgerStub(ch)
        initial = [f"c{i:03d}" for i in range(0, 200, 2)]
        for call_id in initial:
            writer.PrepareTool(prepare_request("run", call_id), timeout=5)
        stop = threading.Event()
        added: list[str] = []

        def add() -> None:
            for i in range(1, 200, 2):
                if stop.is_set():
                    return
                writer.PrepareTool(prepare_request("run", f"c{i:03d}"), timeout=5)
                added.append(f"c{i:03d}")

        thread = threading.Thread(target=add)
        thread.start()
        try:
            seen = _ids(_pages(recovery_stub, 3))
        finally:
            stop.set()
            thread.join(timeout=30)
    assert len(seen) == len(set(seen))
    assert seen == sorted(seen)
    assert set(initial) <= set(seen)
    assert set(seen) <= set(initial) | set(added)


def test_acknowledging_one_page_leaves_the_other_pages_to_replay(
    ledger_stub: Ledger, recovery_stub: Recovery
) -> None:
    """An agent acknowledges the results of the page it appended: those
    calls are ALREADY_DELIVERED, the calls of the page it has not read yet
    still replay."""
    for i in range(6):
        _committed(ledger_stub, f"c{i}")
    first = _recover(recovery_stub, page_size=3)
    ids = [i.call.ref.call_id for i in first.items]
    recovery_stub.AcknowledgeRecovery(
        rpb.AcknowledgeRecoveryRequest(run_id="run", call_ids=ids), timeout=5
    )
    again = _recover(recovery_stub)
    actions = {i.call.ref.call_id: i.action for i in again.items}
    assert actions == {
        **dict.fromkeys(ids, rpb.RECOVERY_ACTION_ALREADY_DELIVERED),
        **dict.fromkeys(["c3", "c4", "c5"], rpb.RECOVERY_ACTION_REPLAY_RESULT),
    }


def test_a_plan_too_big_for_one_answer_is_refused_not_cut(
    ledger_stub: Ledger, recovery_stub: Recovery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without page_size, a plan over the one-answer limit is
    INVALID_ARGUMENT on page_size; under it, the whole plan comes at once;
    paged, the same plan comes in full."""
    for i in range(5):
        _committed(ledger_stub, f"c{i}")
    whole = _recover(recovery_stub)
    assert len(whole.items) == 5
    assert not whole.next_page_token
    monkeypatch.setattr(rpc_recovery, "UNPAGED_LIMIT_BYTES", whole.ByteSize() - 1)
    got = expect_refusal(lambda: _recover(recovery_stub), INVALID, "INVALID_REQUEST")
    assert got.fields == ("page_size",)
    assert len(_ids(_pages(recovery_stub, 2))) == 5
    monkeypatch.setattr(rpc_recovery, "UNPAGED_LIMIT_BYTES", whole.ByteSize())
    assert _recover(recovery_stub) == whole
