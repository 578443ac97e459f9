"""The retry service: answers `ledger.retry` questions from the ledger or as asked.

A question about a recorded call takes its facts from the stored record, as
the rules would see it now (a STARTED call whose lease is gone counts as
UNKNOWN), without writing anything: a decision changes no record. The
channel the call was prepared through is a fact too: for a call prepared as
MCP, a child or a background run, its rules apply whatever context the
question names (StartTool applies the same). The jitter
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
from sidecar.storage import records
from sidecar.storage.api import ReadView, Store


class RetryService:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        policy: PolicySource,
        *,
        random: Callable[[], float],
        backoff: retry.Backoff | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._policy = policy
        self._random = random
        self._backoff = backoff or retry.Backoff()

    def facts_of(
        self, ref: CallRef, question: retry.RetryQuestion
    ) -> retry.RetryQuestion:
        """`question` with the facts and attempts of the recorded call `ref`."""

        def settled(view: ReadView) -> ToolCall | None:
            found = records.load_call(view, ref)
            if found is None:
                return None
            return rules.settle(found, moment(self._clock, self._store, view))

        call = self._store.read(settled)
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
        context = question.context
        if call.channel is not Channel.TOOL:
            context = retry.RetryContext(call.channel.value)
        return dataclasses.replace(
            question,
            facts=facts,
            context=context,
            attempts_used=max(question.attempts_used, call.attempt),
        )

    def decide(self, question: retry.RetryQuestion) -> retry.RetryDecision:
        return retry.decide(
            question,
            self._policy.current(),
            self._backoff,
            now_wall_ns=self._clock.wall_ns(),
            jitter=self._random(),
        )
