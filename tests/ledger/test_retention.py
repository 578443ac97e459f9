"""Retention (contract §4.7, ADR-010 R3): the due rule and the tombstone
as tables, then the compaction pass over a real LMDB store on the manual
clock, with a negative control for the acknowledgement check."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sidecar.clock import ManualClock
from sidecar.errors import InputMismatch, NotFound, ResultCompacted
from sidecar.ledger import machine, retention
from sidecar.ledger.fingerprint import fingerprint
from sidecar.ledger.model import (
    APPROVAL_REJECTED,
    CallRef,
    Decision,
    Effect,
    Event,
    Outcome,
    Payload,
    PayloadKind,
    State,
    ToolCall,
)
from sidecar.ledger.policy import FixedPolicy, Policy
from sidecar.ledger.rules import PrepareSpec
from sidecar.ledger.validation import Limits
from sidecar.services.ledger import LedgerService
from sidecar.services.retention import RetentionService
from sidecar.storage import records, tombstones
from sidecar.storage.api import ReadView, Table, WriteView
from sidecar.storage.lmdb.store import LmdbStore
from tests.ledger.builders import (
    OTHER_INPUT,
    REF,
    TOOL,
    WALL0,
    awaiting,
    committed,
    error_result,
    ok_result,
    prepared,
    rejected,
    spec,
    started,
    unknown,
)

DAY_NS = 86_400 * 1_000_000_000
POLICY = Policy(
    retention_seconds=7 * 86_400,
    unacknowledged_retention_seconds=30 * 86_400,
    tombstone_seconds=60 * 86_400,
)
WINDOW_NS = POLICY.retention_seconds * 1_000_000_000
UNACKNOWLEDGED_NS = POLICY.unacknowledged_retention_seconds * 1_000_000_000


def acknowledged(call: ToolCall, at_ns: int = WALL0) -> ToolCall:
    """`call` (COMMITTED) after the agent acknowledged its result at `at_ns`."""
    return machine.apply(
        call, Event.ACKNOWLEDGE, at_ns=at_ns, actor="agent", acknowledged=True
    )


def flagged(call: ToolCall) -> ToolCall:
    """`call` with the acknowledged flag forced on, whatever its state: the
    state rule must hold on its own."""
    return dataclasses.replace(call, acknowledged=True)


# -- the due rule ---------------------------------------------------------------

OLD = 10 * WINDOW_NS
PAST = WINDOW_NS + 1
ack, com = acknowledged, committed

DUE_TABLE: list[tuple[str, ToolCall, int, bool]] = [
    # ADR-010 R3: a record that is not COMMITTED is never deleted, however old.
    ("prepared", flagged(prepared(Effect.READ)), OLD, False),
    ("awaiting", flagged(awaiting(Effect.SIDE_EFFECT)), OLD, False),
    ("started", flagged(started(Effect.SIDE_EFFECT)), OLD, False),
    ("unknown side effect", flagged(unknown(Effect.SIDE_EFFECT)), OLD, False),
    ("unknown read", flagged(unknown(Effect.READ)), OLD, False),
    # contract §4.7, D3: a result not acknowledged may still be replayed: it is
    # kept past the acknowledged window, for the longer one.
    ("not acknowledged, past the window", com(Effect.READ), PAST, False),
    ("not acknowledged, at its window", com(Effect.READ), UNACKNOWLEDGED_NS, False),
    (
        "not acknowledged, past its window",
        com(Effect.READ),
        UNACKNOWLEDGED_NS + 1,
        True,
    ),
    ("rejected, not acknowledged", rejected(Effect.SIDE_EFFECT), PAST, False),
    ("rejected, not acknowledged, old", rejected(Effect.SIDE_EFFECT), OLD, True),
    # contract §4.7: kept for the window after the last change.
    ("acknowledged, just now", ack(com(Effect.READ)), 0, False),
    ("acknowledged, a day", ack(com(Effect.READ)), DAY_NS, False),
    ("acknowledged, at the window", ack(com(Effect.READ)), WINDOW_NS, False),
    ("acknowledged, past the window", ack(com(Effect.READ)), PAST, True),
    ("side effect, past", ack(com(Effect.SIDE_EFFECT)), PAST, True),
    ("error, past", ack(com(Effect.IDEMPOTENT_WRITE, error_result("E"))), PAST, True),
    ("rejected, past", ack(rejected(Effect.SIDE_EFFECT)), PAST, True),
]


@pytest.mark.parametrize(
    ("call", "age_ns", "due"),
    [row[1:] for row in DUE_TABLE],
    ids=[row[0] for row in DUE_TABLE],
)
def test_is_due(call: ToolCall, age_ns: int, due: bool) -> None:
    """A record is due exactly when it is COMMITTED and its last change is
    older than the retention window, or than the unacknowledged window if its
    result was never acknowledged."""
    assert retention.is_due(call, POLICY, call.updated_ns + age_ns) is due


def test_the_window_runs_from_the_last_change() -> None:
    """An acknowledgement a day after the commit restarts the window (contract §4.7
    "kept for the retention window" after the last change)."""
    call = acknowledged(committed(Effect.READ), at_ns=WALL0 + DAY_NS)
    assert not retention.is_due(call, POLICY, WALL0 + WINDOW_NS + 1)
    assert retention.is_due(call, POLICY, WALL0 + DAY_NS + WINDOW_NS + 1)


def test_an_unacknowledged_window_shorter_than_the_window_is_the_window() -> None:
    """A result never delivered is never compacted before a delivered one."""
    short = Policy(retention_seconds=10 * 86_400, unacknowledged_retention_seconds=1)
    call = committed(Effect.READ)
    assert not retention.is_due(call, short, WALL0 + 9 * DAY_NS)
    assert retention.is_due(call, short, WALL0 + 10 * DAY_NS + 1)


def test_the_window_is_the_policys() -> None:
    """A shorter window in the policy compacts sooner."""
    call = acknowledged(committed(Effect.READ))
    short = Policy(retention_seconds=86_400)
    assert retention.is_due(call, short, WALL0 + DAY_NS + 1)
    assert not retention.is_due(call, POLICY, WALL0 + DAY_NS + 1)


# -- the tombstone ----------------------------------------------------------------


def test_the_tombstone_keeps_identity_fingerprint_outcome_and_times() -> None:
    """The tombstone holds what refuses a re-execution, and no payload."""
    call = acknowledged(committed(Effect.IDEMPOTENT_WRITE), at_ns=WALL0 + 5)
    tomb = retention.tombstone(call, WALL0 + WINDOW_NS + 9)
    assert call.result is not None
    assert tomb.ref == REF
    assert (tomb.tool_name, tomb.effect) == (TOOL, Effect.IDEMPOTENT_WRITE)
    assert tomb.input_fingerprint == call.input_fingerprint
    assert (tomb.outcome, tomb.result_digest) == (Outcome.OK, call.result.digest)
    assert (tomb.revision, tomb.attempt) == (call.revision, 1)
    assert (tomb.created_ns, tomb.committed_ns) == (WALL0, WALL0)
    assert (tomb.last_change_ns, tomb.compacted_ns) == (
        WALL0 + 5,
        WALL0 + WINDOW_NS + 9,
    )
    assert tomb.key_scheme == call.key_scheme
    assert tomb.fingerprint_scheme == call.fingerprint_scheme
    assert tomb.acknowledged
    assert not any(isinstance(v, Payload) for v in dataclasses.astuple(tomb))


def test_a_rejection_keeps_its_error_code() -> None:
    """A rejected call's tombstone still says APPROVAL_REJECTED."""
    tomb = retention.tombstone(acknowledged(rejected(Effect.SIDE_EFFECT)), WALL0)
    assert (tomb.outcome, tomb.error_code) == (Outcome.ERROR, APPROVAL_REJECTED)


@pytest.mark.parametrize(
    "call",
    [prepared(Effect.READ), started(Effect.READ), unknown(Effect.SIDE_EFFECT)],
    ids=["prepared", "started", "unknown"],
)
def test_no_tombstone_for_an_unresolved_record(call: ToolCall) -> None:
    """ADR-010 R3: only a COMMITTED record can become a tombstone; the rule
    refuses even when a caller skips `is_due`."""
    with pytest.raises(ValueError, match="never compacted"):
        retention.tombstone(call, WALL0)


DUPLICATE_TABLE: list[tuple[str, PrepareSpec, type[Exception]]] = [
    # contract §4.7: the tombstone still refuses a re-execution.
    ("same call", spec(Effect.READ), ResultCompacted),
    ("same call, prepare and start", spec(Effect.READ, start=True), ResultCompacted),
    # contract §3.3: another input is INPUT_MISMATCH, tombstone or not.
    ("other input", spec(Effect.READ, payload=OTHER_INPUT), InputMismatch),
    ("other tool", spec(Effect.READ, tool_name="other"), InputMismatch),
    ("other effect", spec(Effect.SIDE_EFFECT), InputMismatch),
]


@pytest.mark.parametrize(
    ("again", "refusal"),
    [row[1:] for row in DUPLICATE_TABLE],
    ids=[row[0] for row in DUPLICATE_TABLE],
)
def test_a_duplicate_prepare_is_refused(
    again: PrepareSpec, refusal: type[Exception]
) -> None:
    """A prepare of a compacted call is refused, never a new EXECUTE, with
    metadata saying it was compacted."""
    tomb = retention.tombstone(acknowledged(committed(Effect.READ)), WALL0)
    error = retention.duplicate_prepare(tomb, again)
    assert type(error) is refusal
    assert error.metadata["compacted"] == "true"
    assert error.metadata["resultDigest"] == tomb.result_digest


def test_the_tombstone_document_round_trips() -> None:
    """The stored form decodes to the same tombstone."""
    tomb = retention.tombstone(acknowledged(rejected(Effect.SIDE_EFFECT)), WALL0 + 1)
    assert tombstones.decode(tombstones.encode(tomb)) == tomb


# -- the compaction pass over a real store -------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LmdbStore]:
    s = LmdbStore(tmp_path / "data")
    yield s
    s.close()


def _ledger(store: LmdbStore, clock: ManualClock) -> LedgerService:
    return LedgerService(store, clock, Limits(), FixedPolicy(POLICY))


def _spec(
    call_id: str, effect: Effect = Effect.READ, start: bool = True
) -> PrepareSpec:
    payload = Payload(PayloadKind.JSON, b'{"q": 1}')
    return PrepareSpec(
        ref=CallRef("default", "run", call_id),
        tool_name=TOOL,
        effect=effect,
        input=payload,
        fingerprint=fingerprint(payload),
        require_approval=False,
        start=start,
        lease_ms=60_000,
    )


async def _commit(ledger: LedgerService, call_id: str) -> ToolCall:
    answer = await ledger.prepare(_spec(call_id))
    done = await ledger.commit(
        answer.call.ref, attempt=1, result=ok_result(), expected_revision=None
    )
    return done.call


def _acknowledge(store: LmdbStore, clock: ManualClock, ref: CallRef) -> None:
    """Acknowledges through the storage API, as AcknowledgeRecovery stores it."""

    def apply(view: WriteView) -> None:
        old = records.load_call(view, ref)
        assert old is not None
        records.save_call(view, old, acknowledged(old, clock.wall_ns()))

    store.submit(apply).result()


def _rows(view: ReadView, table: Table) -> list[tuple[bytes, bytes]]:
    return list(view.scan(table, b""))


def _record(store: LmdbStore, ref: CallRef) -> ToolCall | None:
    return store.read(lambda view: records.load_call(view, ref))


def test_after_the_window_a_duplicate_prepare_is_refused(
    store: LmdbStore, clock: ManualClock
) -> None:
    """Before the window a repeat prepare answers RETURN_RESULT; after it the
    pass compacts the call and the repeat is RESULT_COMPACTED, not EXECUTE."""
    ledger = _ledger(store, clock)
    service = RetentionService(store, clock, FixedPolicy(POLICY))

    async def scenario() -> None:
        call = await _commit(ledger, "c")
        _acknowledge(store, clock, call.ref)
        clock.advance(6 * 86_400)
        assert (await service.compact()).compacted == 0
        again = await ledger.prepare(_spec("c", start=False))
        assert again.decision is Decision.RETURN_RESULT
        clock.advance(86_400 + 1)
        assert (await service.compact()).compacted == 1
        with pytest.raises(ResultCompacted) as refused:
            await ledger.prepare(_spec("c"))
        assert refused.value.metadata["outcome"] == "OK"
        with pytest.raises(InputMismatch):
            await ledger.prepare(dataclasses.replace(_spec("c"), fingerprint="x"))
        with pytest.raises(NotFound) as missing:
            await ledger.get(call.ref)
        assert missing.value.metadata["compacted"] == "true"
        with pytest.raises(NotFound) as missing:
            await ledger.start(call.ref, lease_ms=0, retry=True, expected_revision=None)
        assert missing.value.metadata["compacted"] == "true"

    asyncio.run(scenario())
    ref = CallRef("default", "run", "c")
    assert _record(store, ref) is None
    index = store.read(lambda v: list(v.scan(Table.CALL_STATES, b"")))
    assert index == []


def test_a_batch_of_prepares_with_a_compacted_call_writes_nothing(
    store: LmdbStore, clock: ManualClock
) -> None:
    """PrepareTools refuses the whole batch when one call is compacted."""
    ledger = _ledger(store, clock)
    service = RetentionService(store, clock, FixedPolicy(POLICY))

    async def scenario() -> None:
        call = await _commit(ledger, "old")
        _acknowledge(store, clock, call.ref)
        clock.advance(8 * 86_400)
        await service.compact()
        with pytest.raises(ResultCompacted) as refused:
            await ledger.prepare_many([_spec("new"), _spec("old")])
        assert refused.value.metadata["index"] == "1"

    asyncio.run(scenario())
    assert _record(store, CallRef("default", "run", "new")) is None


DueRule = Callable[[ToolCall, Policy, int], bool]


def _unresolved_and_unacknowledged(
    store: LmdbStore,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    due: DueRule,
    days: int = 20,
) -> None:
    """The check: a pass `days` later (past the acknowledged window, not the
    unacknowledged one), with `due` as the rule, compacts the acknowledged
    call and leaves every other record whole."""
    ledger = _ledger(store, clock)
    monkeypatch.setattr(retention, "is_due", due)

    async def scenario() -> None:
        done = await _commit(ledger, "acked")
        _acknowledge(store, clock, done.ref)
        await _commit(ledger, "not-acked")
        await ledger.prepare(_spec("prepared", start=False))
        await ledger.prepare(_spec("started"))
        s = await ledger.prepare(_spec("unknown", Effect.SIDE_EFFECT))
        await ledger.report_unknown(s.call.ref, attempt=1, reason="lost")
        clock.advance(days * 86_400)
        await RetentionService(store, clock, FixedPolicy(POLICY)).compact()

    asyncio.run(scenario())
    states = {}
    for call_id in ("not-acked", "prepared", "started", "unknown"):
        call = _record(store, CallRef("default", "run", call_id))
        assert call is not None, f"{call_id} was compacted"
        states[call_id] = call.state
    assert states == {
        "not-acked": State.COMMITTED,
        "prepared": State.PREPARED,
        "started": State.STARTED,
        "unknown": State.UNKNOWN,
    }
    assert _record(store, CallRef("default", "run", "acked")) is None


def test_unacknowledged_records_wait_for_their_window(
    store: LmdbStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR-010 R3, contract §4.7: past the acknowledged window only the
    acknowledged committed call is a tombstone; the others are whole, in
    their states."""
    _unresolved_and_unacknowledged(store, clock, monkeypatch, retention.is_due)


def test_a_year_later_unresolved_records_are_still_whole(
    store: LmdbStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR-010 R3: a year later every record that is not COMMITTED is whole;
    the check fails only on the committed call never acknowledged, which is
    a tombstone by then."""
    with pytest.raises(AssertionError, match="not-acked was compacted"):
        _unresolved_and_unacknowledged(
            store, clock, monkeypatch, retention.is_due, days=365
        )
    for call_id in ("prepared", "started", "unknown"):
        assert _record(store, CallRef("default", "run", call_id)) is not None


def test_an_unacknowledged_result_is_compacted_after_its_window(
    store: LmdbStore, clock: ManualClock
) -> None:
    """A committed call whose result nobody acknowledged is kept for the
    unacknowledged window, then becomes a tombstone that still refuses a
    duplicate prepare and says it was never acknowledged (issue 10 item G28:
    fails before the fix: it was kept for ever, and the store only grew)."""
    ledger = _ledger(store, clock)
    service = RetentionService(store, clock, FixedPolicy(POLICY))

    async def scenario() -> None:
        await _commit(ledger, "c")
        clock.advance(29 * 86_400)
        assert (await service.compact()).compacted == 0
        again = await ledger.prepare(_spec("c", start=False))
        assert again.decision is Decision.RETURN_RESULT
        clock.advance(30 * 86_400)
        assert (await service.compact()).compacted == 1
        with pytest.raises(ResultCompacted) as refused:
            await ledger.prepare(_spec("c"))
        assert refused.value.metadata["acknowledged"] == "false"
        assert "never acknowledged" in str(refused.value)

    asyncio.run(scenario())
    assert _record(store, CallRef("default", "run", "c")) is None


def test_a_tombstone_is_deleted_after_its_lifetime(
    store: LmdbStore, clock: ManualClock
) -> None:
    """A tombstone refuses a duplicate for its lifetime, then the pass
    deletes it and its index entry: the identity is forgotten, and a prepare
    of it is a new call (issue 10 item A2: fails before the fix: tombstones
    were kept, and counted, for ever)."""
    ledger = _ledger(store, clock)
    service = RetentionService(store, clock, FixedPolicy(POLICY))

    async def scenario() -> None:
        call = await _commit(ledger, "c")
        _acknowledge(store, clock, call.ref)
        clock.advance(8 * 86_400)
        assert (await service.compact()).compacted == 1
        clock.advance(59 * 86_400)
        assert (await service.compact()).expired == 0
        with pytest.raises(ResultCompacted):
            await ledger.prepare(_spec("c", start=False))
        clock.advance(86_400 + 1)
        assert (await service.compact()).expired == 1
        again = await ledger.prepare(_spec("c", start=False))
        assert (again.decision, again.call.revision) == (Decision.EXECUTE, 1)

    asyncio.run(scenario())
    for table in (Table.TOMBSTONES, Table.TOMBSTONE_TIMES):
        assert store.read(functools.partial(_rows, table=table)) == []


def test_tombstones_expire_in_bounded_batches_oldest_first(
    store: LmdbStore, clock: ManualClock
) -> None:
    """Tombstones made at different times expire each at its own time, in
    transactions of at most the batch size."""
    ledger = _ledger(store, clock)
    service = RetentionService(store, clock, FixedPolicy(POLICY), batch=2)

    async def scenario() -> None:
        for round_ in range(2):
            for n in range(3):
                call = await _commit(ledger, f"c{round_}-{n}")
                _acknowledge(store, clock, call.ref)
            clock.advance(8 * 86_400)
            assert (await service.compact()).compacted == 3
        clock.advance(53 * 86_400)  # past the first three's lifetime only
        first = await service.compact()
        assert first.expired == 3
        # Nothing committed is due: 2 write transactions of expiries, 2 then 1.
        assert first.transactions == 2
        clock.advance(8 * 86_400)
        assert (await service.compact()).expired == 3

    asyncio.run(scenario())


def test_negative_control_a_rule_that_ignores_acknowledgement_is_caught(
    store: LmdbStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: a broken due rule that forgets the acknowledgement
    compacts the unacknowledged call early, and the check above fails."""
    correct = retention.is_due

    def ignoring(call: ToolCall, policy: Policy, now_wall_ns: int) -> bool:
        return correct(
            dataclasses.replace(call, acknowledged=True), policy, now_wall_ns
        )

    with pytest.raises(AssertionError, match="not-acked was compacted"):
        _unresolved_and_unacknowledged(store, clock, monkeypatch, ignoring)


def test_negative_control_a_rule_that_ignores_the_state_still_sees_committed_only(
    store: LmdbStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: a due rule that says yes to everything is caught by
    the check (the unacknowledged call goes), while the unresolved records
    stay: the pass walks only the COMMITTED index (ADR-010 R3)."""

    def everything(call: ToolCall, policy: Policy, now_wall_ns: int) -> bool:
        return True

    with pytest.raises(AssertionError, match="not-acked was compacted"):
        _unresolved_and_unacknowledged(store, clock, monkeypatch, everything)
    for call_id in ("prepared", "started", "unknown"):
        assert _record(store, CallRef("default", "run", call_id)) is not None


class _Switchable:
    """A policy source whose value a test replaces, as a reload does."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def current(self) -> Policy:
        return self.policy


def test_each_pass_uses_the_policy_in_force(
    store: LmdbStore, clock: ManualClock
) -> None:
    """A window shortened by a reload applies from the next pass on."""
    ledger = _ledger(store, clock)
    source = _Switchable(POLICY)
    service = RetentionService(store, clock, source)

    async def scenario() -> None:
        call = await _commit(ledger, "c")
        _acknowledge(store, clock, call.ref)
        clock.advance(2 * 86_400)
        assert (await service.compact()).compacted == 0
        source.policy = Policy(retention_seconds=86_400)
        assert (await service.compact()).compacted == 1

    asyncio.run(scenario())


def test_a_batch_must_be_positive(store: LmdbStore, clock: ManualClock) -> None:
    """A batch of 0 would never finish a pass: refused."""
    with pytest.raises(ValueError, match="batch"):
        RetentionService(store, clock, FixedPolicy(), batch=0)


def test_compacting_checks_the_tombstone_is_of_the_call() -> None:
    """The storage helper refuses to replace a record by another call's
    tombstone."""
    call = acknowledged(committed(Effect.READ))
    other = dataclasses.replace(
        retention.tombstone(call, WALL0), ref=CallRef("default", "run-1", "x")
    )
    with pytest.raises(ValueError, match="another call"):
        tombstones.compact(None, call, other)  # type: ignore[arg-type]
