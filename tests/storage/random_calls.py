"""Random ledger records of every shape a store can hold, for the tests that
hold a derived form of a record (its plan row) to the record itself."""

from __future__ import annotations

import random

from sidecar.ledger.model import (
    APPROVAL_REJECTED,
    Approval,
    CallRef,
    Channel,
    Effect,
    Event,
    Lease,
    Outcome,
    Payload,
    PayloadKind,
    Reconciliation,
    Resolution,
    Result,
    State,
    ToolCall,
    Transition,
)

TOOLS = ("weather", "send_email", "upsert_contact", "outil-é")
_TEXTS = ("", "x", "lost", "a reason with ünïcode ✓", "a" * 300)
_TIMES = (0, 1, 999_999_999, 10**9, -1, -1_500_000_001, 1_764_770_000_123_456_789)


def _text(rng: random.Random) -> str:
    return rng.choice(_TEXTS)


def _time(rng: random.Random) -> int:
    return rng.choice(_TIMES) if rng.random() < 0.3 else rng.randrange(1 << 62)


def _payload(rng: random.Random) -> Payload:
    if rng.random() < 0.5:
        return Payload(PayloadKind.RAW, rng.randbytes(rng.choice([0, 3, 200])))
    data = rng.choice(['{"t": 21.5}', "", '"é ✓"', "[" + "1," * 100 + "1]"])
    return Payload(PayloadKind.JSON, data.encode())


def _result(rng: random.Random) -> Result:
    if rng.random() < 0.2:
        return Result(Outcome.ERROR, None, APPROVAL_REJECTED, _text(rng), "sha256:r")
    return Result(
        rng.choice(list(Outcome)),
        None if rng.random() < 0.2 else _payload(rng),
        rng.choice(["", "TIMEOUT"]),
        _text(rng),
        rng.choice(["", "sha256:" + "ab" * 32]),
    )


def random_call(
    rng: random.Random,
    call_id: str,
    *,
    run_id: str = "run",
    state: State | None = None,
    incarnation: int = 1,
) -> ToolCall:
    """A record of `state` (random when None) with random fields, valid
    enough to be stored, decoded and answered."""
    state = state or rng.choice(list(State))
    committed = state is State.COMMITTED
    lease = None
    if state is State.STARTED or rng.random() < 0.1:
        lease = Lease(
            rng.choice([incarnation, incarnation - 1]),
            rng.choice([0, 1 << 60]),
            _time(rng),
        )
    return ToolCall(
        ref=CallRef("default", run_id, call_id),
        tool_name=rng.choice(TOOLS),
        effect=rng.choice(list(Effect)),
        state=state,
        revision=rng.choice([1, 2, 127, 128, 1 << 40]),
        input_fingerprint=rng.choice(["", "sha256:" + "cd" * 32]),
        approval_required=rng.random() < 0.3,
        attempt=rng.choice([0, 1, 2, 300]),
        created_ns=_time(rng),
        # The retention index keeps it unsigned.
        updated_ns=abs(_time(rng)),
        lease=lease,
        result=_result(rng) if committed and rng.random() < 0.95 else None,
        acknowledged=committed and rng.random() < 0.4,
        history=tuple(
            Transition(None, state, Event.PREPARE, _time(rng), "agent", "", 1, 0)
            for _ in range(rng.randrange(3))
        ),
        approval=None
        if rng.random() < 0.6
        else Approval(
            rng.random() < 0.5,
            _text(rng),
            _text(rng),
            _time(rng),
            "sha256:cd",
            rng.randrange(5),
        ),
        reconciliations=tuple(
            Reconciliation(
                rng.choice(list(Resolution)),
                _text(rng),
                _text(rng),
                _text(rng),
                _time(rng),
                rng.choice(list(State)),
                rng.randrange(1, 9),
                rng.randrange(4),
            )
            for _ in range(rng.choice([0, 0, 1, 2]))
        ),
        lease_ms=rng.choice([0, 30_000]),
        unknown_since_ns=_time(rng) if state is State.UNKNOWN else 0,
        channel=rng.choice(list(Channel)),
        forced_effect=rng.choice([None, None, Effect.SIDE_EFFECT, Effect.READ]),
        kept_input=None if rng.random() < 0.7 else _payload(rng),
    )
