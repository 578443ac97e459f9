"""Many client processes racing on one tool call, and a deliberately racy
ledger that the race tests must catch (their negative control)."""

from __future__ import annotations

import asyncio
import multiprocessing.synchronize
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from multiprocessing.queues import Queue
from typing import Any

import grpc
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc

from sidecar.composition import Services
from sidecar.errors import EffectdError
from sidecar.ledger import rules
from sidecar.ledger.model import CallRef
from sidecar.ledger.rules import Answer, PrepareSpec
from sidecar.server import Daemon
from sidecar.services.ledger import LedgerService
from sidecar.storage import records
from sidecar.storage.api import Store, WriteView


@dataclass(frozen=True, slots=True)
class Outcome:
    worker: int
    round: int
    decision: pb.Decision.ValueType
    holds_attempt: bool


def worker(  # noqa: PLR0917 - multiprocessing passes arguments by position
    index: int,
    target: str,
    mode: str,
    rounds: int,
    barrier: multiprocessing.synchronize.Barrier,
    out: Queue[Any],
) -> None:
    """One client process: each round, wait for all others, then send the
    same prepare-and-start (mode "prepare") or start (mode "start")."""
    with grpc.insecure_channel(target) as channel:
        stub = ledger_pb2_grpc.ToolLedgerStub(channel)
        grpc.channel_ready_future(channel).result(timeout=30)
        for r in range(rounds):
            ref = pb.CallRef(run_id="race", call_id=f"call-{r}")
            barrier.wait(timeout=60)
            if mode == "prepare":
                request = pb.PrepareToolRequest(
                    ref=ref,
                    tool_name="charge_card",
                    input=pb.Payload(json='{"amount": 100}'),
                    start=True,
                )
                answer = stub.PrepareTool(request, timeout=30)
                out.put(Outcome(index, r, answer.decision, answer.attempt_held))
            else:
                started = stub.StartTool(pb.StartToolRequest(ref=ref), timeout=30)
                held = started.decision == pb.DECISION_EXECUTE
                out.put(Outcome(index, r, started.decision, held))


def violations(outcomes: Sequence[Outcome], rounds: int, workers: int) -> list[str]:
    """Rounds in which not exactly one caller holds the attempt while all
    the others are told IN_PROGRESS."""
    by_round: dict[int, list[Outcome]] = {r: [] for r in range(rounds)}
    for o in outcomes:
        by_round[o.round].append(o)
    found = []
    for r, got in by_round.items():
        holders = [o for o in got if o.holds_attempt]
        others = {o.decision for o in got if not o.holds_attempt}
        if (
            len(got) != workers
            or len(holders) != 1
            or others - {pb.DECISION_IN_PROGRESS}
        ):
            found.append(
                f"round {r}: {len(got)} answers, {len(holders)} hold the attempt, "
                f"others {sorted(pb.Decision.Name(d) for d in others)}"
            )
    return found


class RacyLedger(LedgerService):
    """BROKEN on purpose: reads the record outside the write transaction and
    writes blindly, so concurrent callers all see PREPARED or nothing."""

    async def prepare(self, spec: PrepareSpec) -> Answer:
        old = self._store.read(lambda view: records.load_call(view, spec.ref))
        # A real pause between the read and the write: the window the race needs.
        await asyncio.sleep(0.001)
        step = rules.prepare(old, spec, self._store.read(self.now))

        def blind_write(view: WriteView) -> Answer | EffectdError:
            records.save_call(view, old, step.call)
            return step.reply

        return await self._write(blind_write)

    async def start(
        self,
        ref: CallRef,
        *,
        lease_ms: int,
        retry: bool,
        expected_revision: int | None,
        actor: str = rules.AGENT,
    ) -> Answer:
        old = self.get(ref)
        # A real pause between the read and the write: the window the race needs.
        await asyncio.sleep(0.001)
        policy = self._policy.current()
        step = rules.start(
            old,
            self._store.read(self.now),
            lease_ms=lease_ms or policy.default_lease_ms,
            retry=retry,
            policy=policy,
            expected_revision=expected_revision,
            actor=actor,
        )

        def blind_write(view: WriteView) -> Answer | EffectdError:
            records.save_call(view, old, step.call)
            return step.reply

        return await self._write(blind_write)


class RacyDaemon(Daemon):
    def compose(self, store: Store) -> Services:
        services = super().compose(store)
        ledger = RacyLedger(
            store, self.seams.clock, self.config.limits, services.policy
        )
        return replace(services, ledger=ledger)


def counts(outcomes: Sequence[Outcome]) -> Mapping[str, int]:
    tally: dict[str, int] = {}
    for o in outcomes:
        name = pb.Decision.Name(o.decision)
        tally[name] = tally.get(name, 0) + 1
    return tally
