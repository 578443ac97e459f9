"""Two daemons' stores on one database racing prepare-and-start on the same
call: exactly one EXECUTE per round. Each round, both write functions read
the absent record before either writes (a rendezvous inside the view), the
worst interleaving there is. The negative control is the same store without
its locks (READ COMMITTED with nothing read `FOR UPDATE` and every write an
upsert): both see the call absent, both start it, and the same check catches
the second EXECUTE."""

from __future__ import annotations

import asyncio
import threading
from typing import TypeVar

from sidecar.clock import ManualClock
from sidecar.ledger.model import Decision, Effect
from sidecar.ledger.policy import FixedPolicy
from sidecar.ledger.quota import Quotas
from sidecar.ledger.validation import Limits
from sidecar.services.ledger import LedgerService
from sidecar.storage.postgres.store import PostgresOptions, PostgresStore
from tests.services.support import spec
from tests.support.pg_race import Racing, Rendezvous

T = TypeVar("T")
ROUNDS = 20


class LooseStore(PostgresStore):
    """The negative control: READ COMMITTED without row locks."""

    locking = False


def _race(url: str, store_class: type[PostgresStore]) -> list[int]:
    """EXECUTEs per round of two daemons' ledgers racing on one call."""
    options = PostgresOptions(writers=1, readers=1)
    stores = [Racing(store_class(url, options)) for _ in range(2)]
    # Without quotas no usage row is read: the call record is what they race on.
    ledgers = [
        LedgerService(s, ManualClock(), Limits(), FixedPolicy(), quotas=Quotas(0, 0))
        for s in stores
    ]
    executes = []
    try:
        for round_ in range(ROUNDS):
            rendezvous = Rendezvous()
            for s in stores:
                s.rendezvous = rendezvous
            asked = spec(f"call-{round_}", Effect.SIDE_EFFECT, start=True)
            answers: list[Decision] = []

            def prepare(ledger: LedgerService) -> None:
                answers.append(asyncio.run(ledger.prepare(asked)).decision)  # noqa: B023

            threads = [
                threading.Thread(target=prepare, args=(ledger,)) for ledger in ledgers
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert len(answers) == 2
            executes.append(answers.count(Decision.EXECUTE))
    finally:
        for s in stores:
            s.close()
    return executes


def test_two_daemons_racing_on_one_call_execute_it_once(pg_url: str) -> None:
    """Every round: one EXECUTE, the other daemon IN_PROGRESS or RECONCILE."""
    assert _race(pg_url, PostgresStore) == [1] * ROUNDS


def test_without_row_locks_the_race_executes_twice(pg_url: str) -> None:
    """The negative control: READ COMMITTED without row locks lets both
    start the call."""
    executes = _race(pg_url, LooseStore)
    assert max(executes) == 2, executes
