"""The call's channel (TOOL, MCP, CHILD_FOREGROUND, DURABLE_BACKGROUND) is
recorded at prepare, is part of the call's identity, and its retry rules
decide every retry the ledger itself makes (ADR-010 D5, D6; contract §7.2): an
MCP call whose outcome is unknown is never started again."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import pytest

from sidecar.errors import (
    EffectdError,
    InputMismatch,
    McpNoReplay,
    ReconciliationRequired,
)
from sidecar.ledger import rules
from sidecar.ledger.model import Channel, Decision, Effect, State, ToolCall
from sidecar.ledger.policy import Policy
from sidecar.ledger.rules import Answer, Now, PrepareSpec, Step
from sidecar.storage import records
from tests.ledger.builders import LEASE_MS, answer, moment, refusal, spec

RETRYABLE = [Effect.READ, Effect.IDEMPOTENT_WRITE]
NOW = moment()


def _spec(
    effect: Effect, channel: Channel, *, start: bool = True, retry: bool = False
) -> PrepareSpec:
    asked = spec(effect, start=start)
    return dataclasses.replace(asked, channel=channel, retry=retry)


def _unknown(effect: Effect, channel: Channel) -> ToolCall:
    """UNKNOWN after attempt 1, prepared through `channel`."""
    call = rules.prepare(None, _spec(effect, channel), NOW).call
    return rules.report_unknown(call, NOW, attempt=1, reason="connection reset").call


def _start_retry(call: ToolCall, now: Now) -> Step:
    return rules.start(
        call,
        now,
        lease_ms=LEASE_MS,
        retry=True,
        expected_revision=None,
        policy=Policy(),
    )


def _prepare_retry(call: ToolCall, now: Now) -> Step:
    return rules.prepare(call, _spec(call.effect, call.channel, retry=True), now)


# What a retry of an UNKNOWN call of each channel gets (None: attempt 2 held).
RETRY_TABLE: dict[tuple[Channel, Effect], type[EffectdError] | None] = {
    (Channel.TOOL, Effect.READ): None,  # contract §7.2: READ is retry-safe
    (Channel.TOOL, Effect.IDEMPOTENT_WRITE): None,  # ADR-010 D6: with its key
    (Channel.TOOL, Effect.SIDE_EFFECT): ReconciliationRequired,  # ADR-010 D3
    (Channel.MCP, Effect.READ): McpNoReplay,  # ADR-010 D5, whatever the effect
    (Channel.MCP, Effect.IDEMPOTENT_WRITE): McpNoReplay,  # ADR-010 D5
    (Channel.MCP, Effect.SIDE_EFFECT): ReconciliationRequired,  # ADR-010 D3
    (Channel.CHILD_FOREGROUND, Effect.READ): None,  # ADR-010 D6
    (Channel.CHILD_FOREGROUND, Effect.IDEMPOTENT_WRITE): None,  # ADR-010 D6
    (Channel.CHILD_FOREGROUND, Effect.SIDE_EFFECT): ReconciliationRequired,  # D6
    (Channel.DURABLE_BACKGROUND, Effect.READ): None,  # ADR-010 D6
    (Channel.DURABLE_BACKGROUND, Effect.IDEMPOTENT_WRITE): None,  # ADR-010 D6
    # ADR-010 D6: a stale durable execution goes to reconciliation.
    (Channel.DURABLE_BACKGROUND, Effect.SIDE_EFFECT): ReconciliationRequired,
}


@pytest.mark.parametrize(("channel", "effect"), list(RETRY_TABLE))
def test_start_with_retry_follows_the_channels_rules(
    channel: Channel, effect: Effect
) -> None:
    """StartTool(retry) of an UNKNOWN call applies the retry rules of the
    channel it was prepared through (issue 10 item 11: fails before the fix:
    an MCP READ or IDEMPOTENT_WRITE was started again as a plain tool call)."""
    call = _unknown(effect, channel)
    step = _start_retry(call, NOW)
    expected = RETRY_TABLE[channel, effect]
    if expected is None:
        assert answer(step).attempt_held
        assert step.call.attempt == 2
    else:
        refusal(step, expected)
        assert step.call is call


@pytest.mark.parametrize("channel", list(Channel))
@pytest.mark.parametrize("effect", RETRYABLE)
def test_prepare_with_start_and_retry_follows_the_channels_rules(
    channel: Channel, effect: Effect
) -> None:
    """PrepareTool(start, retry) decides the same as StartTool(retry)."""
    call = _unknown(effect, channel)
    step = _prepare_retry(call, NOW)
    expected = RETRY_TABLE[channel, effect]
    if expected is None:
        assert answer(step).attempt_held
    else:
        refusal(step, expected)


@pytest.mark.parametrize("channel", list(Channel))
def test_the_channel_is_recorded_and_part_of_the_identity(channel: Channel) -> None:
    """The record keeps its channel; a repeat prepare through another channel
    is INPUT_MISMATCH and changes nothing."""
    call = rules.prepare(None, _spec(Effect.READ, channel, start=False), NOW).call
    assert call.channel is channel
    again = rules.prepare(call, _spec(Effect.READ, channel, start=False), NOW)
    assert answer(again).decision is Decision.EXECUTE
    for other in Channel:
        if other is channel:
            continue
        step = rules.prepare(call, _spec(Effect.READ, other, start=False), NOW)
        refused = refusal(step, InputMismatch)
        assert channel.name in refused.message
        assert step.call is call


@pytest.mark.parametrize("channel", list(Channel))
def test_the_channel_is_stored(channel: Channel) -> None:
    """The stored record reads back with its channel; one stored before
    channels were kept reads as TOOL (the unspecified channel)."""
    call = _unknown(Effect.READ, channel)
    assert records.decode_call(records.encode_call(call)) == call
    doc = json.loads(records.encode_call(call))
    del doc["channel"]
    assert records.decode_call(json.dumps(doc).encode()).channel is Channel.TOOL


Retry = Callable[[ToolCall, Now], Step]


def _as_tool_call(retry: Retry) -> Retry:
    """BROKEN on purpose, as the ledger was: every retry assumes a plain tool
    call, whatever the channel."""

    def broken(call: ToolCall, now: Now) -> Step:
        return retry(dataclasses.replace(call, channel=Channel.TOOL), now)

    return broken


def mcp_replays(retry: Retry) -> list[str]:
    """Every MCP call of unknown outcome that `retry` starts again."""
    found = []
    for effect in Effect:
        step = retry(_unknown(effect, Channel.MCP), NOW)
        if isinstance(step.reply, Answer) and step.reply.attempt_held:
            found.append(f"MCP {effect.name}: attempt {step.call.attempt} held")
        elif step.call.state is State.STARTED:
            found.append(f"MCP {effect.name}: STARTED without a hold")
    return found


@pytest.mark.parametrize("retry", [_start_retry, _prepare_retry])
def test_no_mcp_call_of_unknown_outcome_is_started_again(retry: Retry) -> None:
    """Neither StartTool(retry) nor PrepareTool(start, retry) starts an MCP call
    again, for any effect (ADR-010 D5)."""
    assert mcp_replays(retry) == []


@pytest.mark.parametrize("retry", [_start_retry, _prepare_retry])
def test_negative_control_a_retry_that_assumes_a_tool_call_is_caught(
    retry: Retry,
) -> None:
    """The checker catches the ledger that assumes every call a tool call."""
    assert mcp_replays(_as_tool_call(retry)) == [
        "MCP READ: attempt 2 held",
        "MCP IDEMPOTENT_WRITE: attempt 2 held",
    ]
