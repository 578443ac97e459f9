"""The retry service: answers `ledger.retry` questions from the ledger or as asked.

A question about a recorded call takes its facts from the stored record, as
the rules would see it now (a STARTED call whose lease is gone counts as
UNKNOWN), without writing anything: a decision changes no record. The
channel the call was prepared through is a fact too: for a call prepared as
MCP, a child or a background run, its rules apply beside those of the context
the question names, and the first denial wins (StartTool applies the
channel's). The context asked never drops out: an MCP transport failure or a
whole run is denied whatever channel the call was recorded with. The jitter
comes from an injected random source, so tests are deterministic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from sidecar.clock import Clock
from sidecar.errors import NotFound
from sidecar.ledger import retry, rules
from sidecar.ledger.model import CallRef, Channel, State, ToolCall
from sidecar.ledger.policy import PolicySource
from sidecar.services._common import moment
from sidecar.storage.api import LedgerReads, Store
from sidecar.storage.scans import Scans


class RetryService:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        policy: PolicySource,
        *,
        random: Callable[[], float],
        backoff: retry.Backoff | None = None,
        scans: Scans | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._policy = policy
        self._random = random
        self._backoff = backoff or retry.Backoff()
        # A record is read off the event loop on a store whose reads may wait.
        self._scans = scans or Scans(store)

    async def facts_of(
        self, ref: CallRef, question: retry.RetryQuestion
    ) -> tuple[retry.RetryQuestion, retry.RetryContext | None]:
        """`question` with the facts and attempts of the recorded call `ref`,
        and the context of the call's channel when it is not TOOL (for
        `decide`)."""

        def settled(view: LedgerReads) -> ToolCall | None:
            found = view.load_call(ref)
            if found is None:
                return None
            return rules.settle(found, moment(self._clock, self._store, view))

        call = await self._scans.point_read(settled)
        if call is None:
            raise NotFound(
                f"no tool call {ref.run_id}:{ref.call_id} in namespace {ref.namespace}",
                {
                    "namespace": ref.namespace,
                    "runId": ref.run_id,
                    "callId": ref.call_id,
                },
            )
        facts = retry.Facts(
            # A SIDE_EFFECT forced on the call stays one (ADR-010 R2).
            call.recorded_effect,
            call.state,
            call.idempotency_key,
            call.tool_name,
            # Settled: a STARTED call still holds a live lease.
            lease_live=call.state is State.STARTED,
        )
        asked = dataclasses.replace(
            question,
            facts=facts,
            attempts_used=max(question.attempts_used, call.attempt),
        )
        if call.channel is Channel.TOOL:
            return asked, None
        return asked, retry.RetryContext(call.channel.value)

    def decide(
        self,
        question: retry.RetryQuestion,
        channel: retry.RetryContext | None = None,
    ) -> retry.RetryDecision:
        """The rules for `question`, and for its call's recorded `channel`
        (when not TOOL) as well: the question's denial first, then the
        channel's; allowed only when both allow."""
        policy = self._policy.current()
        jitter = self._random()
        now = self._clock.wall_ns()
        decided = retry.decide(
            question, policy, self._backoff, now_wall_ns=now, jitter=jitter
        )
        if not decided.allow or channel is None or channel is question.context:
            return decided
        return retry.decide(
            dataclasses.replace(question, context=channel),
            policy,
            self._backoff,
            now_wall_ns=now,
            jitter=jitter,
        )
