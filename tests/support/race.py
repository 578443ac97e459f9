"""A deliberately racy ledger that the race tests must catch (their negative
control); the racing client processes are `tests.support.racers`."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from sidecar.composition import Services
from sidecar.errors import EffectdError
from sidecar.ledger import rules
from sidecar.ledger.model import CallRef
from sidecar.ledger.rules import Answer, PrepareSpec
from sidecar.server import Daemon
from sidecar.services._common import answered
from sidecar.services.ledger import LedgerService
from sidecar.storage.api import LedgerWrites, Store


class RacyLedger(LedgerService):
    """BROKEN on purpose: reads the record outside the write transaction and
    writes blindly, so concurrent callers all see PREPARED or nothing."""

    async def prepare(self, spec: PrepareSpec) -> Answer:
        old = self._store.read(lambda view: view.load_call(spec.ref))
        # A real pause between the read and the write: the window the race needs.
        await asyncio.sleep(0.001)
        step = rules.prepare(old, spec, self._store.read(self.now))

        def blind_write(view: LedgerWrites) -> Answer | EffectdError:
            view.write_call(old, step.call)
            return step.reply

        return await answered(self._store, blind_write)

    async def start(
        self,
        ref: CallRef,
        *,
        lease_ms: int,
        retry: bool,
        expected_revision: int | None,
        actor: str = rules.AGENT,
    ) -> Answer:
        old = await self.get(ref)
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

        def blind_write(view: LedgerWrites) -> Answer | EffectdError:
            view.write_call(old, step.call)
            return step.reply

        return await answered(self._store, blind_write)


class RacyDaemon(Daemon):
    def compose(self, store: Store) -> Services:
        services = super().compose(store)
        ledger = RacyLedger(
            store, self.seams.clock, self.config.limits, services.policy
        )
        return replace(services, ledger=ledger)
