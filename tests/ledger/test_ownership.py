"""Who holds a STARTED call when several daemons share a store
(`ledger.ownership`): the lease judgement as a truth table, the registration
and pass-lock rules, and what `rules.settle` and the requests that settle
first make of a call another daemon started."""

from __future__ import annotations

import dataclasses

import pytest

from sidecar.errors import InvalidTransition, ReconcileQuarantine
from sidecar.ledger import operator_rules, ownership, rules
from sidecar.ledger.model import Decision, Effect, Event, Lease, State, ToolCall
from sidecar.ledger.operator_rules import ReconcileOrder
from sidecar.ledger.ownership import (
    CLOCK_SKEW_NS,
    KnownPeers,
    PassLock,
    Registration,
    Verdict,
)
from sidecar.ledger.rules import Now
from tests.ledger.builders import (
    LEASE_NS,
    MONO0,
    WALL0,
    answer,
    ok_result,
    refusal,
    spec,
    started,
)

A, B = 7, 8
TTL = 15_000_000_000
LEASE = Lease(A, MONO0 + LEASE_NS, WALL0 + LEASE_NS)


def reg(
    incarnation: int = A,
    *,
    daemon_id: str = "a",
    expires_ns: int = WALL0 + TTL,
    ended_ns: int = 0,
    superseded_by: int = 0,
) -> Registration:
    return Registration(
        daemon_id, incarnation, WALL0, expires_ns, ended_ns, superseded_by
    )


def now_of(
    incarnation: int,
    *,
    wall_ns: int = WALL0,
    monotonic_ns: int = MONO0,
    peers: ownership.Peers | None = None,
) -> Now:
    return Now(wall_ns, monotonic_ns, incarnation, peers)


# (judging incarnation, wall offset, monotonic offset, peers, verdict)
JUDGEMENTS = [
    # The holder judges on its monotonic clock, whatever the wall says.
    pytest.param(A, 0, 0, None, Verdict.LIVE, id="holder-live"),
    pytest.param(A, 10 * LEASE_NS, 0, None, Verdict.LIVE, id="holder-wall-jumped"),
    pytest.param(A, 0, LEASE_NS, None, Verdict.EXPIRED, id="holder-expired"),
    # Exclusive store (contract §4.4 "started under an earlier daemon incarnation").
    pytest.param(B, 0, 0, None, Verdict.RESTARTED, id="exclusive-other"),
    pytest.param(
        B, 0, 0, KnownPeers((reg(),)), Verdict.LIVE, id="shared-holder-registered"
    ),
    pytest.param(
        B,
        LEASE_NS + CLOCK_SKEW_NS - 1,
        0,
        KnownPeers((reg(expires_ns=WALL0 + 2 * LEASE_NS),)),
        Verdict.LIVE,
        id="shared-within-skew",
    ),
    pytest.param(
        B,
        LEASE_NS + CLOCK_SKEW_NS,
        0,
        KnownPeers((reg(expires_ns=WALL0 + 2 * LEASE_NS),)),
        Verdict.EXPIRED,
        id="shared-lease-past-skew",
    ),
    pytest.param(B, 0, 0, KnownPeers(), Verdict.LAPSED, id="shared-unregistered"),
    pytest.param(
        B, TTL, 0, KnownPeers((reg(),)), Verdict.LAPSED, id="shared-registration-lapsed"
    ),
    pytest.param(
        B, TTL - 1, 0, KnownPeers((reg(),)), Verdict.LIVE, id="shared-just-before-lapse"
    ),
    pytest.param(
        B,
        0,
        0,
        KnownPeers((reg(ended_ns=WALL0),)),
        Verdict.LAPSED,
        id="shared-holder-stopped",
    ),
    pytest.param(
        B,
        0,
        0,
        KnownPeers((reg(ended_ns=WALL0, superseded_by=9),)),
        Verdict.RESTARTED,
        id="shared-holder-restarted",
    ),
    # Another daemon's registration says nothing about this lease.
    pytest.param(
        B,
        0,
        0,
        KnownPeers((reg(B, daemon_id="b", ended_ns=WALL0, superseded_by=9),)),
        Verdict.LAPSED,
        id="shared-only-others-registered",
    ),
]


@pytest.mark.parametrize(("judge", "wall", "mono", "peers", "verdict"), JUDGEMENTS)
def test_a_lease_is_judged_by_who_looks_and_its_holders_registration(
    judge: int, wall: int, mono: int, peers: ownership.Peers | None, verdict: Verdict
) -> None:
    """The holder trusts its monotonic clock; another incarnation trusts the
    holder's registration and the lease's wall-clock end plus the skew."""
    got = ownership.judge(
        LEASE,
        incarnation=judge,
        wall_ns=WALL0 + wall,
        monotonic_ns=MONO0 + mono,
        peers=peers,
    )
    assert got.verdict is verdict
    if verdict is not Verdict.LIVE:
        assert got.since_ns <= WALL0 + wall


def test_the_outcome_of_a_lapsed_holder_is_unknown_from_when_it_lapsed() -> None:
    """A holder that died before its lease ended leaves the call unknown from
    its registration's end, not from when another daemon noticed."""
    long = Lease(A, MONO0 + 100 * TTL, WALL0 + 100 * TTL)
    got = ownership.judge(
        long,
        incarnation=B,
        wall_ns=WALL0 + 3 * TTL,
        monotonic_ns=0,
        peers=KnownPeers((reg(),)),
    )
    assert got == ownership.Judgement(Verdict.LAPSED, WALL0 + TTL)


def test_a_start_ends_its_own_earlier_registrations_only() -> None:
    """A restart supersedes the same daemon id's registrations; another
    daemon's, live or not, stay as they are."""
    earlier = reg(A, daemon_id="a")
    other = reg(B, daemon_id="b")
    mine, ended = ownership.register(
        [earlier, other],
        daemon_id="a",
        incarnation=9,
        wall_ns=WALL0 + 1,
        ttl_ns=TTL,
        exclusive=False,
    )
    assert mine == Registration("a", 9, WALL0 + 1, WALL0 + 1 + TTL)
    assert ended == [dataclasses.replace(earlier, ended_ns=WALL0 + 1, superseded_by=9)]


def test_a_start_on_an_exclusive_store_ends_every_other_registration() -> None:
    """On an exclusive store no other daemon can be serving: all are ended,
    once (one superseded already is left as it was)."""
    old = reg(A, daemon_id="a", ended_ns=WALL0, superseded_by=B)
    other = reg(B, daemon_id="b")
    _, ended = ownership.register(
        [old, other],
        daemon_id="c",
        incarnation=9,
        wall_ns=WALL0 + 1,
        ttl_ns=TTL,
        exclusive=True,
    )
    assert [r.incarnation for r in ended] == [B]


def test_renewal_moves_the_expiry_and_never_revives_a_superseded_one() -> None:
    lapsed = reg(expires_ns=WALL0)
    assert ownership.renew(lapsed, wall_ns=WALL0 + 5, ttl_ns=TTL).live(WALL0 + 5)
    superseded = reg(ended_ns=WALL0, superseded_by=B)
    assert ownership.renew(superseded, wall_ns=WALL0 + 5, ttl_ns=TTL) == superseded


def test_renewal_records_when_it_vouched_last() -> None:
    fresh = reg()
    assert fresh.vouched_ns == WALL0
    renewed = ownership.renew(fresh, wall_ns=WALL0 + 5, ttl_ns=TTL)
    assert (renewed.renewed_ns, renewed.vouched_ns) == (WALL0 + 5, WALL0 + 5)


@pytest.mark.parametrize(
    ("registration", "wall_offset", "standing"),
    [
        pytest.param(reg(), 0, ownership.Standing.LIVE, id="renewed-in-time"),
        pytest.param(reg(), TTL, ownership.Standing.LAPSED, id="not-renewed"),
        pytest.param(reg(ended_ns=WALL0), 0, ownership.Standing.ENDED, id="clean-stop"),
        pytest.param(
            reg(ended_ns=WALL0, superseded_by=B),
            0,
            ownership.Standing.SUPERSEDED,
            id="restarted",
        ),
        pytest.param(
            reg(ended_ns=WALL0, superseded_by=B),
            TTL,
            ownership.Standing.SUPERSEDED,
            id="restarted-and-expired",
        ),
    ],
)
def test_where_a_registration_stands_for_an_operator(
    registration: Registration, wall_offset: int, standing: ownership.Standing
) -> None:
    """LIVE exactly when other daemons judge its leases by their own end
    (`judge`); otherwise why not."""
    wall_ns = WALL0 + wall_offset
    assert ownership.standing(registration, wall_ns=wall_ns) is standing
    assert (standing is ownership.Standing.LIVE) == registration.live(wall_ns)


def test_a_registration_may_be_forgotten_only_long_after_it_is_gone() -> None:
    live = reg()
    assert not ownership.forgettable(live, wall_ns=WALL0 + 1, keep_ns=0)
    stopped = ownership.end(live, wall_ns=WALL0 + 10)
    assert not ownership.forgettable(stopped, wall_ns=WALL0 + 10 + 99, keep_ns=100)
    assert ownership.forgettable(stopped, wall_ns=WALL0 + 10 + 100, keep_ns=100)


# (lock, claimant, wall offset, peers, may run)
LOCKS = [
    pytest.param(None, B, 0, KnownPeers(), True, id="free"),
    pytest.param(PassLock(B, "b", WALL0 + 10), B, 0, KnownPeers(), True, id="own"),
    pytest.param(
        PassLock(A, "a", WALL0 + 10), B, 0, KnownPeers((reg(),)), False, id="held"
    ),
    pytest.param(
        PassLock(A, "a", WALL0 + 10), B, 10, KnownPeers((reg(),)), True, id="run-out"
    ),
    pytest.param(
        PassLock(A, "a", WALL0 + 10),
        B,
        0,
        KnownPeers((reg(ended_ns=WALL0),)),
        True,
        id="holder-gone",
    ),
    pytest.param(
        PassLock(A, "a", WALL0 + 10), B, 0, KnownPeers(), True, id="holder-unknown"
    ),
    pytest.param(PassLock(A, "a", WALL0 + 10), B, 0, None, True, id="exclusive"),
]


@pytest.mark.parametrize(("lock", "claimant", "wall", "peers", "runs"), LOCKS)
def test_one_daemon_runs_a_pass_until_its_lock_runs_out_or_it_is_gone(
    lock: PassLock | None,
    claimant: int,
    wall: int,
    peers: ownership.Peers | None,
    runs: bool,
) -> None:
    assert (
        ownership.may_run(lock, incarnation=claimant, wall_ns=WALL0 + wall, peers=peers)
        is runs
    )


def test_a_claim_holds_the_pass_for_one_interval() -> None:
    lock = ownership.claim(incarnation=B, daemon_id="b", wall_ns=WALL0, interval_ns=5)
    assert lock == PassLock(B, "b", WALL0 + 5)


# --- the rules that settle first, judging another daemon's call -------------


def a_started(effect: Effect = Effect.SIDE_EFFECT) -> ToolCall:
    """STARTED by daemon A (incarnation A) at WALL0, lease LEASE_NS."""
    return started(effect, now_of(A))


def test_another_daemon_leaves_a_live_holders_call_started() -> None:
    """B's settle of A's call while A's registration and the lease are live
    changes nothing: B answers IN_PROGRESS (ADR-010 D3 applies to the dead)."""
    call = a_started()
    at_b = now_of(B, monotonic_ns=0, peers=KnownPeers((reg(),)))
    assert rules.settle(call, at_b) == call
    step = rules.prepare(call, spec(Effect.SIDE_EFFECT, start=True), at_b)
    assert step.call == call
    assert answer(step).decision is Decision.IN_PROGRESS


def test_the_single_daemon_rule_would_settle_it_negative_control() -> None:
    """Negative control: judged as on an exclusive store (any other
    incarnation is gone), the same call is settled: the test above fails if
    the shared store's judgement falls back to that rule."""
    call = a_started()
    settled = rules.settle(call, now_of(B, monotonic_ns=0))
    assert settled.state is State.UNKNOWN
    assert settled.history[-1].event is Event.RESTART


def test_a_lapsed_holders_call_becomes_unknown_and_a_side_effect_reconciles() -> None:
    call = a_started()
    at_b = now_of(B, wall_ns=WALL0 + TTL, monotonic_ns=0, peers=KnownPeers((reg(),)))
    step = rules.prepare(call, spec(Effect.SIDE_EFFECT, start=True), at_b)
    assert step.call.state is State.UNKNOWN
    assert step.call.history[-1].event is Event.EXPIRE
    assert "registration" in step.call.history[-1].reason
    assert step.call.unknown_since_ns == WALL0 + TTL


def test_a_restarted_holders_call_settles_as_a_restart() -> None:
    call = a_started()
    peers = KnownPeers((reg(ended_ns=WALL0 + 1, superseded_by=9),))
    assert rules.holder_restarted(call, now_of(9, monotonic_ns=0, peers=peers))
    # B is not the restarted daemon, but judges A's call the same way.
    settled = rules.settle(call, now_of(B, monotonic_ns=0, peers=peers))
    assert settled.history[-1].event is Event.RESTART


def test_a_heartbeat_at_another_daemon_moves_the_lease_to_it() -> None:
    """A heartbeat that B receives for A's live attempt extends it under B's
    incarnation: the attempt belongs to B from then on, and A's restart no
    longer touches it."""
    call = a_started()
    peers = KnownPeers((reg(),))
    at_b = now_of(B, wall_ns=WALL0 + 1000, monotonic_ns=50, peers=peers)
    step = rules.heartbeat(call, at_b, attempt=1, lease_ms=30_000)
    beat = answer(step).call
    assert beat.lease is not None
    assert beat.lease.incarnation == B
    assert beat.lease.deadline_ns == 50 + 30_000_000_000
    restarted = KnownPeers(
        (reg(ended_ns=WALL0 + 2000, superseded_by=9), reg(B, daemon_id="b"))
    )
    assert not rules.holder_restarted(beat, now_of(9, peers=restarted))


def test_a_heartbeat_at_another_daemon_after_the_wall_lease_is_refused() -> None:
    """Past the lease's wall-clock end (and the skew), B settles A's call
    and refuses the heartbeat: the attempt lost its lease."""
    call = a_started()
    peers = KnownPeers((reg(expires_ns=WALL0 + 10 * LEASE_NS),))
    at_b = now_of(B, wall_ns=WALL0 + LEASE_NS + CLOCK_SKEW_NS, peers=peers)
    step = rules.heartbeat(call, at_b, attempt=1, lease_ms=30_000)
    refusal(step, InvalidTransition)
    assert step.call.state is State.UNKNOWN


def test_a_commit_at_another_daemon_is_taken_live_or_lapsed() -> None:
    """The result of the attempt that holds the call is recorded wherever it
    arrives, before or after its holder lapsed."""
    call = a_started()
    for peers in (KnownPeers((reg(),)), KnownPeers()):
        at_b = now_of(B, peers=peers)
        step = rules.commit(
            rules.settle(call, at_b),
            at_b,
            attempt=1,
            result=ok_result(),
            expected_revision=None,
        )
        assert answer(step).call.state is State.COMMITTED


# --- a lease granted after its holder's registration lapsed -----------------


def test_a_lease_granted_after_its_holder_lapsed_is_unknown_from_its_grant() -> None:
    """A holder whose renewal came late (or whose wall clock stepped ahead)
    still ran when it granted the lease: judged restarted or lapsed later,
    the outcome is unknown from the grant at the earliest, never from the
    registration's earlier end (which would void the quarantine of a call
    whose attempt began a moment ago)."""
    granted = WALL0 + 10 * TTL
    lease = Lease(A, MONO0 + LEASE_NS, granted + LEASE_NS)
    for registration in (
        reg(ended_ns=granted + 1, superseded_by=9),  # its daemon restarted
        reg(),  # lapsed at WALL0 + TTL, never renewed
    ):
        got = ownership.judge(
            lease,
            incarnation=9,
            wall_ns=granted + 2,
            monotonic_ns=0,
            peers=KnownPeers((registration,)),
            granted_ns=granted,
        )
        assert got.verdict in (Verdict.RESTARTED, Verdict.LAPSED)
        assert got.since_ns == granted


def test_a_late_grant_after_a_restart_keeps_the_reconcile_quarantine() -> None:
    """The rules pass the record's grant to the judgement: a call started
    after its daemon's registration lapsed, then found by the daemon's next
    incarnation, is in quarantine from its start, so "never executed" is
    refused at once (seen by an operator through Reconcile)."""
    granted = WALL0 + 10 * TTL
    call = started(Effect.SIDE_EFFECT, now_of(A, wall_ns=granted))
    peers = KnownPeers((reg(ended_ns=granted + 1, superseded_by=9),))
    at_restart = now_of(9, wall_ns=granted + 2, peers=peers)
    settled = rules.settle(call, at_restart)
    assert settled.state is State.UNKNOWN
    assert settled.unknown_since_ns == granted
    order = ReconcileOrder(
        expected_revision=call.revision,
        result=None,
        operator="olga",
        reason="checked the target",
        evidence="nothing there yet",
    )
    step = operator_rules.reconcile(call, at_restart, order)
    assert isinstance(step.reply, ReconcileQuarantine)
    assert step.call is call
