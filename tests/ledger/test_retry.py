"""The retry rules of contract §7.2 (ADR-010 D5, D6, D7, R2, R5) as tables.

The full product of contexts, effects and states is checked against the rule
rows; the `retryable` flag is proven inert for every question, and each
property guard has a negative control: a broken rule that the guard catches.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import secrets
from collections.abc import Callable, Iterator
from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar import errors
from sidecar.errors import (
    AttemptsExhausted,
    InvalidTransition,
    ReconciliationRequired,
    RetryDisabled,
)
from sidecar.ledger import retry, rules
from sidecar.ledger.model import Effect, State, ToolCall
from sidecar.ledger.policy import Policy
from sidecar.ledger.retry import (
    Backoff,
    Facts,
    FailureKind,
    Reason,
    RetryContext,
    RetryDecision,
    RetryQuestion,
)
from tests.ledger.builders import (
    LEASE_MS,
    MAX_ATTEMPTS,
    TOOL,
    WALL0,
    answer,
    moment,
    refusal,
    unknown,
)

R, W, SE = Effect.READ, Effect.IDEMPOTENT_WRITE, Effect.SIDE_EFFECT
UNRESOLVED = (State.STARTED, State.UNKNOWN)
KEY = "run-1:call-1"
POLICY = Policy()
BACKOFF = Backoff()
MS = 1_000_000

Decide = Callable[..., RetryDecision]


def ask(
    effect: Effect = R,
    state: State = State.UNKNOWN,
    context: RetryContext = RetryContext.TOOL,
    *,
    failure: FailureKind = FailureKind.APPLICATION,
    retryable: bool = False,
    key: str = KEY,
    attempts_used: int = 1,
    deadline_ns: int | None = None,
    max_attempts: int = 0,
    tool_name: str = TOOL,
) -> RetryQuestion:
    return RetryQuestion(
        facts=Facts(effect, state, key, tool_name),
        context=context,
        failure=failure,
        retryable=retryable,
        attempts_used=attempts_used,
        deadline_ns=deadline_ns,
        max_attempts=max_attempts,
    )


def run(
    question: RetryQuestion,
    policy: Policy = POLICY,
    *,
    jitter: float = 0.0,
    decide: Decide = retry.decide,
) -> RetryDecision:
    return decide(question, policy, BACKOFF, now_wall_ns=WALL0, jitter=jitter)


# --- the rule rows over every context x effect x state ----------------------


def expected(context: RetryContext, effect: Effect, state: State) -> Reason | None:
    """The rule rows, first denial wins (an APPLICATION failure, key present)."""
    if state is State.COMMITTED:
        return Reason.ALREADY_COMMITTED  # contract §7.2: COMMITTED is never retried
    if state is State.AWAITING_APPROVAL:
        return Reason.INVALID_TRANSITION  # ADR-010 D3: only approve executes
    if context is RetryContext.RUN and effect is not R:
        return Reason.RUN_NOT_READ_ONLY  # ADR-010 R5
    if effect is SE:
        if context is RetryContext.DURABLE_BACKGROUND and state in UNRESOLVED:
            return Reason.RECONCILIATION_REQUIRED  # ADR-010 D6 stale durable
        return Reason.SIDE_EFFECT_NOT_RETRY_SAFE  # ADR-010 D6
    return None  # ADR-010 D6: READ, IDEMPOTENT_WRITE with a key


@pytest.mark.parametrize(
    ("context", "effect", "state", "retryable"),
    list(itertools.product(RetryContext, Effect, State, [False, True])),
    ids=lambda x: x.name if hasattr(x, "name") else f"retryable={x}",
)
def test_every_context_effect_and_state_follows_the_rule_rows(
    context: RetryContext, effect: Effect, state: State, retryable: bool
) -> None:
    """Each (context, effect, state) gets the rows' answer, whatever `retryable`
    says; an allowed retry has a wait, a denial names its reason."""
    got = run(ask(effect, state, context, retryable=retryable))
    want = expected(context, effect, state)
    assert (got.allow, got.reason) == (want is None, want)
    assert got.effect is effect
    assert got.message
    if got.allow:
        assert got.backoff_ms == BACKOFF.delay_ms(1, 0.0) == 500
    else:
        assert got.backoff_ms == 0


@pytest.mark.parametrize(
    ("effect", "state", "failure"),
    list(
        itertools.product(
            Effect,
            [State.PREPARED, State.STARTED, State.UNKNOWN],
            [FailureKind.TRANSPORT, FailureKind.TIMEOUT, FailureKind.UNKNOWN],
        )
    ),
    ids=lambda x: x.name,
)
def test_an_mcp_call_is_never_replayed_after_a_transport_failure(
    effect: Effect, state: State, failure: FailureKind
) -> None:
    """An MCP call whose transport failed (or timed out, or failed in an unknown
    way) is MCP_NO_REPLAY for every effect, READ included."""
    # ADR-010 D5: a lost response and a failed execution are indistinguishable.
    got = run(ask(effect, state, RetryContext.MCP, failure=failure))
    assert (got.allow, got.reason) == (False, Reason.MCP_NO_REPLAY)


@pytest.mark.parametrize(
    ("context", "key", "want"),
    [
        # ADR-010 D6: idempotent-write is retry-safe only with a non-empty key.
        *[
            (c, "", Reason.MISSING_IDEMPOTENCY_KEY)
            for c in RetryContext
            if c.name != "RUN"
        ],
        *[(c, KEY, None) for c in RetryContext if c.name != "RUN"],
        # ADR-010 R5: a run is not read-only because its writes are idempotent.
        (RetryContext.RUN, KEY, Reason.RUN_NOT_READ_ONLY),
    ],
    ids=str,
)
def test_an_idempotent_write_needs_its_key(
    context: RetryContext, key: str, want: Reason | None
) -> None:
    """An IDEMPOTENT_WRITE without a key is denied MISSING_IDEMPOTENCY_KEY."""
    got = run(ask(W, State.UNKNOWN, context, key=key))
    assert got.reason is want


@pytest.mark.parametrize("context", list(RetryContext), ids=lambda c: c.name)
def test_a_read_needs_no_key(context: RetryContext) -> None:
    """A READ is retry-safe without any idempotency key, in every context."""
    # ADR-010 D6 "retry-safe is allowed only for read; ..."; R5 for RUN.
    assert run(ask(R, State.UNKNOWN, context, key="")).allow


# --- the operator's policy (ADR-010 R2) --------------------------------------


@pytest.mark.parametrize(
    ("context", "effect"),
    [(c, e) for c in RetryContext for e in (R, W)],
    ids=lambda x: x.name,
)
def test_the_kill_switch_denies_every_otherwise_allowed_retry(
    context: RetryContext, effect: Effect
) -> None:
    """With retry-safe disabled, a retry the rows would allow is RETRY_DISABLED."""
    # ADR-010 R2 "immediately disable the related retry-safe policy".
    off = Policy(retry_safe_enabled=False)
    got = run(ask(effect, State.UNKNOWN, context), off)
    if expected(context, effect, State.UNKNOWN) is None:
        assert got.reason is Reason.RETRY_DISABLED
    else:
        assert got.reason is expected(context, effect, State.UNKNOWN)
    assert not got.allow


@pytest.mark.parametrize("effect", [R, W], ids=lambda e: e.name)
@pytest.mark.parametrize("context", list(RetryContext), ids=lambda c: c.name)
def test_a_forced_side_effect_override_wins(
    context: RetryContext, effect: Effect
) -> None:
    """A tool the operator forced to SIDE_EFFECT is never retried, whatever its
    calls declare, and the answer names the effect assumed."""
    # ADR-010 R2 "change the effect to side-effect"; contract §7.3.
    forced = Policy(effect_overrides=MappingProxyType({TOOL: SE}))
    got = run(ask(effect, State.UNKNOWN, context), forced)
    assert not got.allow
    assert got.effect is SE
    assert got.reason is expected(context, SE, State.UNKNOWN)


# --- attempt budget, deadline and backoff (contract §7.2) -------------------------


@pytest.mark.parametrize(
    ("attempts_used", "max_attempts", "want"),
    [
        (1, 0, None),  # policy budget 3: a second attempt is fine
        (2, 0, None),
        (3, 0, Reason.ATTEMPTS_EXHAUSTED),  # contract §7.2 the budget always applies
        (9, 0, Reason.ATTEMPTS_EXHAUSTED),
        (1, 1, Reason.ATTEMPTS_EXHAUSTED),  # ADR-010 R1: a caller may lower it
        (1, 2, None),
        (3, 10, Reason.ATTEMPTS_EXHAUSTED),  # never raised above the policy
    ],
)
def test_the_attempt_budget(
    attempts_used: int, max_attempts: int, want: Reason | None
) -> None:
    """Attempts used up to the (possibly lowered) budget deny ATTEMPTS_EXHAUSTED."""
    got = run(ask(attempts_used=attempts_used, max_attempts=max_attempts))
    assert got.reason is want
    assert got.max_attempts == min(3, max_attempts or 3)


@pytest.mark.parametrize(
    ("deadline_ms", "jitter", "want"),
    [
        (None, 0.0, None),  # no deadline
        (10_000, 0.0, None),  # the wait of 500 ms fits
        (501, 0.0, None),
        (500, 0.0, Reason.DEADLINE_EXCEEDED),  # the retry would start at it
        (300, 0.0, Reason.DEADLINE_EXCEEDED),  # contract §7.2 the deadline applies
        (300, 0.999, None),  # jitter shortened the wait to 250 ms
        (0, 0.0, Reason.DEADLINE_EXCEEDED),
        (-1_000, 0.0, Reason.DEADLINE_EXCEEDED),  # already passed
    ],
)
def test_a_wait_that_passes_the_deadline_denies(
    deadline_ms: int | None, jitter: float, want: Reason | None
) -> None:
    """A retry whose wait would reach the deadline is DEADLINE_EXCEEDED and
    reports that wait."""
    deadline = None if deadline_ms is None else WALL0 + deadline_ms * MS
    got = run(ask(deadline_ns=deadline), jitter=jitter)
    assert got.reason is want
    assert got.backoff_ms == BACKOFF.delay_ms(1, jitter)


@pytest.mark.parametrize(
    ("retry_number", "jitter", "ms"),
    [
        (1, 0.0, 500),
        (1, 0.5, 375),
        (2, 0.0, 1000),
        (3, 0.0, 2000),
        (4, 0.0, 4000),
        (5, 0.0, 8000),  # the cap
        (9, 0.0, 8000),
        (9, 0.5, 6000),  # jitter survives the cap
        (0, 0.0, 500),  # no attempt yet counts as the first retry
    ],
)
def test_backoff_is_exponential_with_jitter(
    retry_number: int, jitter: float, ms: int
) -> None:
    """The wait doubles from 500 ms to the 8 s cap, less up to half by jitter."""
    assert Backoff().delay_ms(retry_number, jitter) == ms


@given(
    retry_number=st.integers(1, 64),
    jitter=st.floats(0.0, 1.0, exclude_max=True),
)
def test_backoff_stays_in_its_band(retry_number: int, jitter: float) -> None:
    """Every wait lies in (b/2, b] for b the capped exponential."""
    b = min(8000, 500 * 2 ** (retry_number - 1))
    assert b / 2 <= Backoff().delay_ms(retry_number, jitter) <= b


def test_a_seeded_random_source_gives_the_same_waits() -> None:
    """Two rules fed by the same seed answer the same waits (tests can pin them)."""
    seed = secrets.randbits(32)
    print(f"seed={seed}")
    # Jitter spreads retries; it is no secret.
    first, second = random.Random(seed), random.Random(seed)  # noqa: S311
    for attempts in (1, 2, 1, 2):
        a = run(ask(attempts_used=attempts), jitter=first.random())
        b = run(ask(attempts_used=attempts), jitter=second.random())
        assert a == b


# --- property guards and their negative controls -----------------------------


def questions() -> Iterator[RetryQuestion]:
    """Every question worth asking, `retryable` both ways."""
    for context, effect, state, failure, key, used, deadline, flag in itertools.product(
        RetryContext,
        Effect,
        State,
        FailureKind,
        ["", KEY],
        [0, 1, 2, 3, 5],
        [None, WALL0 + 100 * MS, WALL0 + 60_000 * MS],
        [False, True],
    ):
        yield ask(
            effect,
            state,
            context,
            failure=failure,
            retryable=flag,
            key=key,
            attempts_used=used,
            deadline_ns=deadline,
        )


POLICIES = [
    Policy(),
    Policy(retry_safe_enabled=False),
    Policy(max_attempts=1),
    Policy(effect_overrides=MappingProxyType({TOOL: SE})),
]


def retryable_violations(decide: Decide) -> Iterator[RetryQuestion]:
    """Questions whose answer changes with the `retryable` flag alone, as
    they are found (a control stops at the first)."""
    for policy in POLICIES:
        for q in questions():
            flipped = dataclasses.replace(q, retryable=not q.retryable)
            if run(q, policy, decide=decide) != run(flipped, policy, decide=decide):
                yield q


def unsafe_allowances(decide: Decide) -> Iterator[RetryQuestion]:
    """Allowed retries that some rule of contract §7.2 forbids outright, as
    they are found (a control stops at the first)."""
    for policy in POLICIES:
        for q in questions():
            got = run(q, policy, decide=decide)
            effect = policy.effect_of(q.facts.tool_name, q.facts.effect)
            forbidden = (
                effect is SE
                or q.facts.state is State.COMMITTED
                or (effect is W and not q.facts.idempotency_key)
                or (q.context is RetryContext.RUN and effect is not R)
                or (
                    q.context is RetryContext.MCP
                    and q.failure is not FailureKind.APPLICATION
                )
                or not policy.retry_safe_enabled
                or q.attempts_used >= policy.max_attempts
            )
            if got.allow and forbidden:
                yield q


@pytest.mark.slow
def test_retryable_never_changes_an_answer() -> None:
    """For every context, effect, state, failure, key, budget and deadline, the
    answer with `retryable: true` is the answer with `retryable: false`."""
    # ADR-010 D7: `retryable` is a diagnostic, never an authorization.
    assert list(retryable_violations(retry.decide)) == []


@pytest.mark.slow
def test_no_forbidden_retry_is_ever_allowed() -> None:
    """No question that a rule forbids is answered allow, under any policy."""
    assert list(unsafe_allowances(retry.decide)) == []


def _honours_retryable(
    question: RetryQuestion,
    policy: Policy,
    backoff: Backoff,
    *,
    now_wall_ns: int,
    jitter: float,
) -> RetryDecision:
    """Broken on purpose: a retryable error of a SIDE_EFFECT is retried."""
    got = retry.decide(
        question, policy, backoff, now_wall_ns=now_wall_ns, jitter=jitter
    )
    if question.retryable and got.reason is Reason.SIDE_EFFECT_NOT_RETRY_SAFE:
        return dataclasses.replace(got, allow=True, reason=None)
    return got


def _ignores_the_budget(
    question: RetryQuestion,
    policy: Policy,
    backoff: Backoff,
    *,
    now_wall_ns: int,
    jitter: float,
) -> RetryDecision:
    """Broken on purpose: the attempt budget is not checked."""
    roomy = dataclasses.replace(question, attempts_used=0)
    return retry.decide(roomy, policy, backoff, now_wall_ns=now_wall_ns, jitter=jitter)


@pytest.mark.slow
def test_negative_control_a_rule_that_honours_retryable_is_caught() -> None:
    """The two guards above catch a rule that lets `retryable` authorize."""
    assert next(retryable_violations(_honours_retryable), None) is not None
    assert next(unsafe_allowances(_honours_retryable), None) is not None


@pytest.mark.slow
def test_negative_control_a_rule_without_budget_is_caught() -> None:
    """The forbidden-retry guard catches a rule that skips the attempt budget."""
    assert next(unsafe_allowances(_ignores_the_budget), None) is not None


# --- the denial as a refusal, and StartTool's retry (contract §4.2) ---------------


def test_every_reason_has_its_refusal_class() -> None:
    """Each denial reason maps to the error class that owns the same reason."""
    assert set(retry.ERRORS) == set(Reason)
    for reason, cls in retry.ERRORS.items():
        assert cls.reason == reason.name
        assert issubclass(cls, errors.PreconditionFailed)


def _retry_start(call: ToolCall, policy: Policy) -> rules.Step:
    return rules.start(
        call,
        moment(),
        lease_ms=LEASE_MS,
        retry=True,
        expected_revision=None,
        policy=policy,
    )


@pytest.mark.parametrize("effect", [R, W], ids=lambda e: e.name)
def test_start_with_retry_obeys_the_kill_switch(effect: Effect) -> None:
    """StartTool(retry) of an UNKNOWN READ / IDEMPOTENT_WRITE is RETRY_DISABLED
    while the kill switch is off, and the record is left as it was."""
    # ADR-010 R2; contract §4.2 "explicit retry allowed by the retry rules".
    call = unknown(effect)
    step = _retry_start(call, Policy(retry_safe_enabled=False))
    refusal(step, RetryDisabled)
    assert step.call is call


@pytest.mark.parametrize("effect", [R, W], ids=lambda e: e.name)
def test_start_with_retry_of_a_forced_side_effect_requires_reconciliation(
    effect: Effect,
) -> None:
    """A READ / IDEMPOTENT_WRITE whose tool the operator forced to SIDE_EFFECT is
    refused RECONCILIATION_REQUIRED on retry, as contract §4.2 says for StartTool."""
    # ADR-010 R2 "change the effect to side-effect, and enter reconciliation".
    forced = Policy(effect_overrides=MappingProxyType({TOOL: SE}))
    call = unknown(effect)
    step = _retry_start(call, forced)
    refusal(step, ReconciliationRequired)
    # Nothing starts; the forced effect is recorded on the call for good.
    assert (step.call.state, step.call.attempt) == (call.state, call.attempt)
    assert step.call.forced_effect is SE


@pytest.mark.parametrize("effect", [R, W], ids=lambda e: e.name)
def test_start_with_retry_uses_the_same_budget_and_key(effect: Effect) -> None:
    """An allowed StartTool(retry) is attempt 2 with the key of attempt 1; a
    budget of one attempt refuses it ATTEMPTS_EXHAUSTED."""
    # contract §7.2 budget; ADR-010 D2 the key is stable across retries.
    call = unknown(effect)
    again = answer(_retry_start(call, POLICY))
    assert again.call.attempt == 2
    assert again.call.idempotency_key == call.idempotency_key == KEY
    step = rules.start(
        call,
        moment(),
        lease_ms=LEASE_MS,
        retry=True,
        policy=Policy(max_attempts=1),
        expected_revision=None,
    )
    refusal(step, AttemptsExhausted)


def test_start_without_retry_of_an_unknown_read_is_still_invalid() -> None:
    """The retry rules are asked only for an explicit retry."""
    step = rules.start(
        unknown(R),
        moment(),
        lease_ms=LEASE_MS,
        retry=False,
        policy=Policy(max_attempts=MAX_ATTEMPTS),
        expected_revision=None,
    )
    refusal(step, InvalidTransition)


@pytest.mark.parametrize(
    ("context", "effect"), list(itertools.product(RetryContext, Effect))
)
def test_a_recorded_call_with_a_live_lease_is_not_retried(
    context: RetryContext, effect: Effect
) -> None:
    """A recorded STARTED call whose attempt holds a live lease is never
    retried, in any context, as StartTool answers it IN_PROGRESS (contract §5.1);
    the same STARTED facts without a live lease keep their rule rows."""
    live = ask(effect, State.STARTED, context)
    live = dataclasses.replace(
        live, facts=dataclasses.replace(live.facts, lease_live=True)
    )
    got = run(live)
    assert (got.allow, got.reason) == (False, Reason.INVALID_TRANSITION)
    assert run(ask(effect, State.STARTED, context)).reason == expected(
        context, effect, State.STARTED
    )
