"""Two people deciding one call at two daemons of one PostgreSQL store
(issue 14): each round, two operators reconcile one UNKNOWN call at once,
one at each `effectd serve` process, with opposite findings (the result
found; never executed), and two approvers decide one call awaiting approval
(approve; reject), both having seen the same revision. Exactly one of each
pair wins, and the call is as the winner said; the other is refused
REVISION_CONFLICT. The audit log holds exactly one entry per decided call,
the winner's, and its chain verifies.

The negative control is the same daemons on a store whose READ COMMITTED
writes lock nothing (`tests.support.loose_store`): the same check catches both
operators winning in some round. `EFFECTD_OPERATOR_ROUNDS` sets the rounds.
The test fails, never skips, when PostgreSQL is not reachable.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from effectd.v1 import admin_pb2 as apb
from effectd.v1.admin_pb2_grpc import AdminStub

from effectd_client import Client, EffectdError, State, ToolCall
from tests.support.processes import daemon_processes

pytestmark = pytest.mark.slow

# The actor, what the actor's decision leaves the call in, its audit action.
Side = tuple[str, State, "apb.AuditAction.ValueType"]
ROUNDS = int(os.environ.get("EFFECTD_OPERATOR_ROUNDS", "25"))
CONTROL_ROUNDS = 10
INPUT = {"amount": 100}
RECONCILERS: tuple[Side, Side] = (
    ("reconciler-found", State.COMMITTED, apb.AUDIT_ACTION_RECONCILE_COMMITTED),
    ("reconciler-dead", State.PREPARED, apb.AUDIT_ACTION_RECONCILE_NOT_EXECUTED),
)
APPROVERS: tuple[Side, Side] = (
    ("approver-yes", State.PREPARED, apb.AUDIT_ACTION_APPROVE),
    ("approver-no", State.COMMITTED, apb.AUDIT_ACTION_REJECT),
)


@dataclass(frozen=True, slots=True)
class Round:
    call_id: str
    # Per side: the call as the winner got it, or the refusal's reason.
    answers: tuple[ToolCall | str, ...]
    final: State


def _at_once(actions: Sequence[Callable[[], ToolCall]]) -> tuple[ToolCall | str, ...]:
    """Runs `actions` in threads released together; each one's answer."""
    barrier = threading.Barrier(len(actions), timeout=30)
    answers: list[ToolCall | str] = ["no answer"] * len(actions)

    def run(i: int) -> None:
        barrier.wait()
        try:
            answers[i] = actions[i]()
        except EffectdError as exc:
            answers[i] = exc.reason

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(actions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return tuple(answers)


def _reconcile_round(clients: Sequence[Client], call_id: str) -> Round:
    started = clients[0].prepare_tool("ops", call_id, "charge", INPUT, start=True)
    unknown = clients[0].report_unknown("ops", call_id, started.call.attempt, "lost")
    assert unknown.state is State.UNKNOWN

    def found() -> ToolCall:
        return clients[0].reconcile(
            "ops",
            call_id,
            expected_revision=unknown.revision,
            operator=RECONCILERS[0][0],
            reason="the charge is in the ledger",
            evidence="receipt 1",
            result={"charged": 100},
        )

    def dead() -> ToolCall:
        return clients[1].reconcile(
            "ops",
            call_id,
            expected_revision=unknown.revision,
            operator=RECONCILERS[1][0],
            reason="the worker died before charging",
            evidence="worker log",
            not_executed=True,
            confirmed_dead_attempt=unknown.attempt,
        )

    answers = _at_once([found, dead])
    return Round(call_id, answers, clients[1].get_tool_call("ops", call_id).state)


def _approval_round(clients: Sequence[Client], call_id: str) -> Round:
    asked = (
        clients[0]
        .prepare_tool("ops", call_id, "charge", INPUT, require_approval=True)
        .call
    )
    assert asked.state is State.AWAITING_APPROVAL

    def decide(i: int) -> Callable[[], ToolCall]:
        return lambda: clients[i].decide_approval(
            "ops",
            call_id,
            approve=i == 0,
            approver=APPROVERS[i][0],
            reason="reviewed",
            expected_revision=asked.revision,
            input_fingerprint=asked.input_fingerprint,
        )

    answers = _at_once([decide(0), decide(1)])
    return Round(call_id, answers, clients[1].get_tool_call("ops", call_id).state)


def _audit(target: str) -> tuple[list[apb.AuditEntry], apb.VerifyAuditResponse]:
    with grpc.insecure_channel(target) as channel:
        stub = AdminStub(channel)
        entries: list[apb.AuditEntry] = []
        token = ""
        while True:
            page = stub.ListAudit(
                apb.ListAuditRequest(page_size=1000, page_token=token), timeout=30
            )
            entries.extend(page.entries)
            token = page.next_page_token
            if not token:
                return entries, stub.VerifyAudit(apb.VerifyAuditRequest(), timeout=30)


def _round_violations(
    got: Round,
    sides: Sequence[Side],
    audited: Sequence[apb.AuditEntry],
) -> list[str]:
    """Not exactly one winner; the loser not refused REVISION_CONFLICT; the
    call not as the winner left it; not exactly the winner's audit entry."""
    winners = [i for i, a in enumerate(got.answers) if not isinstance(a, str)]
    refusals = [a for a in got.answers if isinstance(a, str)]
    if len(winners) != 1 or refusals != ["REVISION_CONFLICT"]:
        return [f"{got.call_id}: {len(winners)} won, refused {refusals}"]
    actor, state, action = sides[winners[0]]
    found = []
    if got.final is not state:
        found.append(f"{got.call_id}: {got.final.name}, {actor} won")
    mine = [(e.actor, e.action) for e in audited]
    if mine != [(actor, action)]:
        found.append(f"{got.call_id}: audit {mine}, {actor} won")
    return found


def _decide(short_tmp: Path, url: str, module: str, rounds: int) -> list[str]:
    """The violations of `rounds` rounds of each race at two daemons."""
    print(f"2 daemons ({module}), {rounds} rounds of each race")
    dirs = [short_tmp / "a", short_tmp / "b"]
    played: list[tuple[Round, Sequence[Side]]] = []
    with (
        daemon_processes(dirs, module, ("--store", url)) as daemons,
        Client(daemons[0].target) as a,
        Client(daemons[1].target) as b,
    ):
        for r in range(rounds):
            played.append((_reconcile_round([a, b], f"reconcile-{r}"), RECONCILERS))
            played.append((_approval_round([a, b], f"approve-{r}"), APPROVERS))
        entries, verdict = _audit(daemons[0].target)
    by_call: dict[str, list[apb.AuditEntry]] = {}
    for e in entries:
        by_call.setdefault(e.ref.call_id, []).append(e)
    found = [
        v
        for got, sides in played
        for v in _round_violations(got, sides, by_call.get(got.call_id, []))
    ]
    if not verdict.ok or verdict.entries_checked != len(entries):
        found.append(f"audit chain: {verdict}, {len(entries)} entries listed")
    winners = Counter(
        a.state.name for got, _ in played for a in got.answers if not isinstance(a, str)
    )
    print(f"winners left the calls {dict(winners)}")
    return found


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_of_two_operators_at_two_daemons_wins(short_tmp: Path, pg_url: str) -> None:
    assert _decide(short_tmp, pg_url, "sidecar", ROUNDS) == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_negative_control_a_store_without_isolation_is_caught(
    short_tmp: Path, pg_url: str
) -> None:
    found = _decide(short_tmp, pg_url, "tests.support.loose_store", CONTROL_ROUNDS)
    print("\n".join(found))
    assert found
