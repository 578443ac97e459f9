"""The ledger service decides every write under the policy in force when the
write transaction runs, not when the request arrived (a reload's audit entry
always precedes the decisions it governs)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType

import pytest

from sidecar.clock import ManualClock
from sidecar.errors import ReconciliationRequired
from sidecar.ledger.model import Decision, Effect, State
from sidecar.ledger.policy import Policy
from sidecar.ledger.validation import Limits
from sidecar.services.ledger import LedgerService
from sidecar.storage.lmdb.store import LmdbStore
from tests.services.support import (
    TOOL,
    ReloadBeforeWrite,
    SwitchablePolicy,
    spec,
)

FORCED = Policy(effect_overrides=MappingProxyType({TOOL: Effect.SIDE_EFFECT}))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LmdbStore]:
    s = LmdbStore(tmp_path / "data")
    yield s
    s.close()


@pytest.mark.parametrize("on_read", [True, False], ids=["before-read", "before-write"])
def test_a_reload_before_the_write_decides_the_retry(
    store: LmdbStore, on_read: bool
) -> None:
    """A policy forcing SIDE_EFFECT that takes effect after StartTool(retry)
    arrived but before its write refuses the retry (audit F11: fails before the
    fix, the policy was read before the request was queued and attempt 2
    started under the policy the reload had replaced). Also when it takes
    effect after the retry was decided on a snapshot, before its write: the
    write sees the policy changed and the retry is decided again."""
    source = SwitchablePolicy()
    held = ReloadBeforeWrite(store, reload=lambda: None, reads=on_read)
    ledger = LedgerService(held, ManualClock(), Limits(), source)

    async def scenario() -> None:
        answer = await ledger.prepare(spec("c1"))
        ref = answer.call.ref
        await ledger.report_unknown(ref, attempt=1, reason="timeout")

        def reload() -> None:
            source.policy = FORCED

        held.reload = reload
        with pytest.raises(ReconciliationRequired):
            await ledger.start(ref, lease_ms=0, retry=True, expected_revision=None)
        assert (await ledger.get(ref)).state is State.UNKNOWN

    asyncio.run(scenario())


def test_a_reload_before_the_write_decides_a_prepare(store: LmdbStore) -> None:
    """The same for PrepareTool: the repeat prepare of the UNKNOWN write is
    answered RECONCILE under the policy that took effect before its write
    (audit F11: fails before the fix, it answered EXECUTE)."""
    source = SwitchablePolicy()
    held = ReloadBeforeWrite(store, reload=lambda: None)
    ledger = LedgerService(held, ManualClock(), Limits(), source)

    async def scenario() -> None:
        answer = await ledger.prepare(spec("c1"))
        await ledger.report_unknown(answer.call.ref, attempt=1, reason="timeout")

        def reload() -> None:
            source.policy = FORCED

        held.reload = reload
        again = await ledger.prepare(spec("c1", start=False))
        assert again.decision is Decision.RECONCILE
        many = await ledger.prepare_many([spec("c1", start=False)])
        assert many[0].decision is Decision.RECONCILE

    asyncio.run(scenario())
