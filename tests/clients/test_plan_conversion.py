"""The client converts a plan's items as the straightforward conversion
does (each enum by its own lookup, each result converted on its own), on
random items (the seed is printed; EFFECTD_TEST_SEED replays one); an item
whose result is the record's shares one converted result, one whose result
differs never does; a value the client does not know is refused as
before. Negative control: a conversion that gives every item the record's
result is caught."""

from __future__ import annotations

import os
import random

import pytest
from effectd.v1 import ledger_pb2, recovery_pb2

from effectd_client import (
    Channel,
    Effect,
    PlanItem,
    RecoveryAction,
    RecoveryPlan,
    State,
    ToolCall,
    ToolResult,
    _types,
)
from sidecar.rpc import convert
from tests.storage.random_calls import random_call

ITEMS = 300


@pytest.fixture
def seed() -> int:
    chosen = os.environ.get("EFFECTD_TEST_SEED")
    value = int(chosen) if chosen else random.randrange(2**32)  # noqa: S311
    print(f"seed={value}")
    return value


def _result(msg: ledger_pb2.ToolResult) -> ToolResult:
    kind = msg.payload.WhichOneof("kind")
    return ToolResult(
        ok=msg.outcome == ledger_pb2.OUTCOME_OK,
        json_text=msg.payload.json if kind == "json" else None,
        raw=msg.payload.raw if kind == "raw" else None,
        error_code=msg.error_code,
        error_message=msg.error_message,
        digest=msg.digest,
    )


def _call(msg: ledger_pb2.ToolCall) -> ToolCall:
    kept = msg.kept_input.WhichOneof("kind")
    return ToolCall(
        namespace=msg.ref.namespace,
        run_id=msg.ref.run_id,
        call_id=msg.ref.call_id,
        tool_name=msg.tool_name,
        effect=Effect(msg.effect),
        state=State(msg.state),
        revision=msg.revision,
        idempotency_key=msg.idempotency_key,
        attempt=msg.attempt,
        input_fingerprint=msg.input_fingerprint,
        approval_required=msg.approval_required,
        result=_result(msg.result) if msg.HasField("result") else None,
        history=tuple(t.event for t in msg.history),
        acknowledged=msg.acknowledged,
        updated_ns=msg.updated_at.ToNanoseconds(),
        lease_expires_ns=msg.lease_expires_at.ToNanoseconds(),
        channel=Channel(msg.channel or ledger_pb2.CALL_CHANNEL_TOOL),
        forced_effect=Effect(msg.forced_effect) if msg.forced_effect else None,
        kept_input_json=msg.kept_input.json if kept == "json" else None,
        kept_input_raw=msg.kept_input.raw if kept == "raw" else None,
    )


def straightforward(msg: recovery_pb2.RecoverResponse) -> RecoveryPlan:
    items = tuple(
        PlanItem(
            RecoveryAction(i.action),
            _call(i.call),
            _result(i.result) if i.HasField("result") else None,
            i.idempotency_key,
        )
        for i in msg.items
    )
    return RecoveryPlan(items, msg.interrupted)


def _response(seed: int) -> recovery_pb2.RecoverResponse:
    rng = random.Random(seed)  # noqa: S311 - not a secret
    answer = recovery_pb2.RecoverResponse(interrupted=rng.random() < 0.5)
    for i in range(ITEMS):
        call = random_call(rng, f"c{i:04d}")
        item = answer.items.add(
            action=rng.choice(list(RecoveryAction)).value,
            effect=rng.choice(list(Effect)).value,
            idempotency_key=rng.choice(["", call.idempotency_key]),
        )
        item.call.CopyFrom(convert.call_pb(call, history=rng.random() < 0.5))
        match rng.choice(["none", "same", "other"]):
            case "same" if item.call.HasField("result"):
                item.result.CopyFrom(item.call.result)
            case "other":
                item.result.CopyFrom(ledger_pb2.ToolResult(digest="another"))
    return answer


def test_the_conversion_is_the_straightforward_one(seed: int) -> None:
    msg = _response(seed)
    assert RecoveryPlan.from_pb(msg) == straightforward(msg), f"seed={seed}"


def test_an_item_shares_its_result_with_its_record_only_when_equal(
    seed: int,
) -> None:
    msg = _response(seed)
    plan = RecoveryPlan.from_pb(msg)
    shared = 0
    for item, got in zip(msg.items, plan.items, strict=True):
        same = item.HasField("result") and item.call.result == item.result
        if item.HasField("result") and item.call.HasField("result"):
            assert (got.result is got.call.result) == same, f"seed={seed}"
        shared += same
    assert shared, f"seed={seed}"


def test_negative_control_every_item_given_its_record_s_result_is_caught(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def careless(msg: recovery_pb2.RecoveryItem) -> PlanItem:
        call = ToolCall.from_pb(msg.call)
        result = call.result if msg.HasField("result") else None
        action = RecoveryAction(msg.action)
        return PlanItem(action, call, result, msg.idempotency_key)

    monkeypatch.setattr(_types, "_plan_item", careless)
    msg = _response(seed)
    assert RecoveryPlan.from_pb(msg) != straightforward(msg), f"seed={seed}"


@pytest.mark.parametrize(
    ("field", "value"),
    [("action", 99), ("call.effect", 99), ("call.state", 99), ("call.channel", 99)],
)
def test_a_value_the_client_does_not_know_is_refused(field: str, value: int) -> None:
    """As the enums themselves refuse it (ValueError)."""
    msg = _response(1)
    item = msg.items[0]
    target = item.call if field.startswith("call.") else item
    setattr(target, field.removeprefix("call."), value)
    with pytest.raises(ValueError, match="99"):
        RecoveryPlan.from_pb(msg)
