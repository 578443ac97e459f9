"""A commit that hands its result to the agent marks it delivered in the same
step (contract §6.2 AcknowledgeRecovery, folded into CommitTool): one durable
write instead of two, and never on a commit that is refused."""

from __future__ import annotations

import pytest

from sidecar.errors import ResultMismatch, StaleAttempt
from sidecar.ledger import rules
from sidecar.ledger.model import Decision, Effect, State, ToolCall
from sidecar.ledger.rules import Step
from tests.ledger.builders import (
    answer,
    committed,
    moment,
    ok_result,
    refusal,
    started,
)

EFFECTS = list(Effect)


def _commit(call: ToolCall, attempt: int = 1, body: bytes = b'{"id": 1}') -> Step:
    return rules.commit(
        call,
        moment(),
        attempt=attempt,
        result=ok_result(body),
        expected_revision=None,
        acknowledge=True,
    )


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_a_commit_that_acknowledges_commits_and_marks_delivered(
    effect: Effect,
) -> None:
    """COMMITTED and acknowledged, both transitions in the history."""
    call = started(effect)
    step = _commit(call)
    assert answer(step).decision is Decision.RETURN_RESULT
    assert step.call.state is State.COMMITTED
    assert step.call.acknowledged
    assert step.call.result == ok_result()
    assert step.call.revision == call.revision + 2
    assert [t.event.value for t in step.call.history[-2:]] == [
        "commit",
        "acknowledge",
    ]


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_a_repeated_commit_that_acknowledges_marks_delivered_once(
    effect: Effect,
) -> None:
    """The repeat of a commit whose answer was lost acknowledges the stored
    result if it was not yet; a second repeat changes nothing."""
    call = committed(effect)
    assert not call.acknowledged
    step = _commit(call)
    assert step.call.acknowledged
    assert step.call.revision == call.revision + 1
    again = _commit(step.call)
    assert again.call is step.call


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_a_refused_commit_acknowledges_nothing(effect: Effect) -> None:
    """A stale attempt or another result is refused and the record stays."""
    call = started(effect)
    stale = _commit(call, attempt=2)
    refusal(stale, StaleAttempt)
    assert stale.call is call
    done = committed(effect)
    other = _commit(done, body=b'{"id": 2}')
    refusal(other, ResultMismatch)
    assert other.call is done
    assert not other.call.acknowledged


def test_delivered_leaves_an_acknowledged_call_as_it_is() -> None:
    once = rules.delivered(committed(Effect.READ), moment())
    assert rules.delivered(once, moment()) is once
