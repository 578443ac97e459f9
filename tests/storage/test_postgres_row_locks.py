"""What the PostgreSQL store's READ COMMITTED writes hold by locks
(`sidecar.storage.postgres.store`), each with two daemons' stores on one
database whose write functions meet right after the read they decide on
(`tests.support.pg_race.Rendezvous`, in the store's write view), round
after round:

- a checkpoint compared as absent (a Put expecting no key) is written by
  one of them; the other's insert meets the first one's (a unique
  violation), its batch runs again, finds the key and answers
  REVISION_CONFLICT;
- at a namespace's open-call quota, two new calls of the namespace: exactly
  one is admitted, the other refused QUOTA_EXCEEDED (the second quota check
  waits for the namespace's lock row, then counts the first call).

The negative control of each is the same store without its locks (nothing
read `FOR UPDATE`, no namespace lock row, every write an upsert): both
writes win the round, which the same check catches. The first executions of
one call racing are `test_postgres_race`'s.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from sidecar.clock import ManualClock
from sidecar.errors import QuotaExceeded, RevisionConflict
from sidecar.ledger.checkpoints import Expect
from sidecar.ledger.model import Effect
from sidecar.ledger.policy import FixedPolicy
from sidecar.ledger.quota import Quotas
from sidecar.ledger.validation import Limits
from sidecar.services.checkpoints import CheckpointService
from sidecar.services.ledger import LedgerService
from sidecar.storage.api import Table
from sidecar.storage.postgres.store import PostgresOptions, PostgresStore
from sidecar.storage.postgres.views import PgWriteView
from tests.services.support import spec
from tests.support.pg_race import Rendezvous

CHECKPOINT_ROUNDS = 12
# A locked quota check makes the other wait at the rendezvous until its
# bound: few rounds, a short bound.
QUOTA_ROUNDS = 6
QUOTA_MEETING_SECONDS = 1.0


class UnlockedStore(PostgresStore):
    """The negative control: READ COMMITTED without row locks."""

    locking = False


class Meeting:
    """The rendezvous of the current round."""

    rendezvous = Rendezvous()


def _meeting(
    base: type[PostgresStore], table: Table, meeting: Meeting
) -> type[PostgresStore]:
    """`base`, its write functions meeting at `meeting`'s rendezvous right
    after their first read of `table`."""

    class View(PgWriteView):
        def get(self, table_read: Table, key: bytes) -> bytes | None:
            found = super().get(table_read, key)
            if table_read is table:
                meeting.rendezvous.meet()
            return found

    class Store(base):  # type: ignore[valid-type,misc]
        write_view = View

    return Store


@dataclass(frozen=True)
class Race:
    table: Table
    rounds: int
    meeting_seconds: float
    run: Callable[[PostgresStore, int], Coroutine[Any, Any, object]]


def _rounds(url: str, base: type[PostgresStore], race: Race) -> list[list[str]]:
    """What each of two stores answered `race.run(store, round)` in each
    round, both at once: "ok", or the refusal's reason."""
    meeting = Meeting()
    store_class = _meeting(base, race.table, meeting)
    options = PostgresOptions(writers=1, readers=1)
    stores = [store_class(url, options) for _ in range(2)]
    found: list[list[str]] = []
    lock = threading.Lock()
    try:
        for round_ in range(race.rounds):
            meeting.rendezvous = Rendezvous(race.meeting_seconds)
            answers: list[str] = []

            def run(store: PostgresStore, answers: list[str], round_: int) -> None:
                try:
                    asyncio.run(race.run(store, round_))
                    answer = "ok"
                except (RevisionConflict, QuotaExceeded) as refused:
                    answer = refused.reason
                with lock:
                    answers.append(answer)

            threads = [
                threading.Thread(target=run, args=(s, answers, round_)) for s in stores
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            found.append(sorted(answers))
    finally:
        for s in stores:
            s.close()
    return found


async def _put_absent(store: PostgresStore, round_: int) -> object:
    service = CheckpointService(store, ManualClock(), quotas=Quotas(0, 0))
    return await service.put("ns", Expect(f"cursor-{round_}", None), b"mine")


def _checkpoints(url: str, store_class: type[PostgresStore]) -> list[list[str]]:
    race = Race(Table.CHECKPOINTS, CHECKPOINT_ROUNDS, 3.0, _put_absent)
    return _rounds(url, store_class, race)


def test_a_checkpoint_compared_as_absent_is_written_once(pg_url: str) -> None:
    """Every round: one Put wins, the other answers REVISION_CONFLICT."""
    rounds = _checkpoints(pg_url, PostgresStore)
    assert rounds == [["REVISION_CONFLICT", "ok"]] * CHECKPOINT_ROUNDS


def test_without_row_locks_both_puts_of_an_absent_checkpoint_win(
    pg_url: str,
) -> None:
    """The negative control: both read the key absent and both write it."""
    rounds = _checkpoints(pg_url, UnlockedStore)
    assert ["ok", "ok"] in rounds, rounds


async def _new_call(store: PostgresStore, round_: int) -> object:
    ledger = LedgerService(
        store,
        ManualClock(),
        Limits(),
        FixedPolicy(),
        quotas=Quotas(open_calls=1, stored_bytes=0),
    )
    # A namespace of its own each round; a call of its own per store.
    asked = spec(
        f"call-{id(store)}-{round_}",
        Effect.SIDE_EFFECT,
        start=True,
        namespace=f"quota-{round_}",
    )
    return await ledger.prepare(asked)


def _quotas(url: str, store_class: type[PostgresStore]) -> list[list[str]]:
    race = Race(Table.USAGE, QUOTA_ROUNDS, QUOTA_MEETING_SECONDS, _new_call)
    return _rounds(url, store_class, race)


def test_a_quota_at_its_limit_admits_one_call_across_two_stores(
    pg_url: str,
) -> None:
    """Every round: one call admitted, the other refused QUOTA_EXCEEDED."""
    rounds = _quotas(pg_url, PostgresStore)
    assert rounds == [["QUOTA_EXCEEDED", "ok"]] * QUOTA_ROUNDS


def test_without_row_locks_both_calls_pass_the_quota(pg_url: str) -> None:
    """The negative control: both count the namespace empty, both admitted."""
    rounds = _quotas(pg_url, UnlockedStore)
    assert ["ok", "ok"] in rounds, rounds
