"""Crash at every point of every transition's write; after a restart the
state, and the answer to the client's retry, match the table.

Each case: a test build of the daemon (`tests.torture.crashing`) with one
failpoint armed for the transition's RPC; the client sets the record up and
sends the transition's request, which the crash cuts; the daemon is started
again on the same store without failpoints (the production build, in this
process) and the case compares what it finds with its row:

- `seen`: the record after the restart;
- `retry`: what the client gets when it sends the same request again;
- and the request cut by the crash was never answered (no answer leaves
  before its commit is durable).

A crash before the commit (`before_apply`, `before_commit`) loses the
transition: the record is as the setup left it, where a call STARTED under
the crashed daemon is UNKNOWN (ADR-010 D3). A crash after the commit keeps
it: the retry is answered from the record, never run again (a started call
answers RECONCILE, never EXECUTE). A batch crashed after some of its
writes were applied (`mid_batch`, at the store, where a batch of several
requests is made on purpose) leaves none of them. The negative controls: a
row written wrong, a build that answers before its commit, and the
mid-batch check run on a batch crashed after its commit, are all caught.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from effectd_client import Client
from sidecar import failpoints
from sidecar.config import ServeConfig
from sidecar.testing import running_daemon
from tests.support import failpoint_daemon, postgres
from tests.torture import crashing
from tests.torture.crashing import CrashingDaemon
from tests.torture.transitions import BY_NAME, RESULT, VALUE, Transition, answered

# Daemons as processes: out of `make test-fast`.
pytestmark = pytest.mark.slow
# The deep setting (`make torture-deep`) repeats every case, and runs every
# point of every transition on each store and on the session stream; the
# fast one (`make test`) each side of the commit (and the commit's write
# before anything is applied), on PostgreSQL for the transitions of
# `PG_FAST`, on the session stream for the commit.
REPEAT = int(os.environ.get("FAILPOINT_REPEAT", "1"))
DEEP = REPEAT > 1
PG_FAST = ("prepare+start", "commit", "approve", "checkpoint put")


class Fate(enum.Enum):
    LOST = "lost"
    KEPT = "kept"


# Failpoint -> what a crash there does to the transition being written.
FATE = {
    "before_apply": Fate.LOST,
    "before_commit": Fate.LOST,
    "after_commit": Fate.KEPT,
}

COMMITTED = f"COMMITTED by commit result={RESULT!r}"
RECONCILED = f"COMMITTED by reconcile_committed result={RESULT!r}"
CHECKPOINT = f"revision=1 value={VALUE!r}"


@dataclass(frozen=True, slots=True)
class Row:
    """What a case must find after the restart."""

    seen: str
    retry: str


# (transition, fate) -> the row. Rules cited from the contract and ADR-010.
TABLE: dict[tuple[str, Fate], Row] = {
    # contract §4.2 prepare: durable before the agent executes; a repeat is idempotent.
    ("prepare", Fate.LOST): Row("absent", "EXECUTE PREPARED"),
    ("prepare", Fate.KEPT): Row("PREPARED by prepare", "EXECUTE PREPARED"),
    # contract §5.2 prepare+start: EXECUTE means the caller holds the attempt; a call
    # started under a daemon that restarted is UNKNOWN and answers RECONCILE.
    ("prepare+start", Fate.LOST): Row("absent", "EXECUTE held STARTED"),
    ("prepare+start", Fate.KEPT): Row("UNKNOWN by restart", "RECONCILE UNKNOWN"),
    # contract §4.2 start; STARTED/UNKNOWN + SIDE_EFFECT retried:
    # RECONCILIATION_REQUIRED.
    ("start", Fate.LOST): Row("PREPARED by prepare", "EXECUTE held STARTED"),
    ("start", Fate.KEPT): Row("UNKNOWN by restart", "refused RECONCILIATION_REQUIRED"),
    # contract §4.3 commit: the attempt's result is taken while its call is UNKNOWN
    # (settled at restart); a repeat with the same result is a no-op.
    ("commit", Fate.LOST): Row("UNKNOWN by restart", "ok COMMITTED"),
    ("commit", Fate.KEPT): Row(COMMITTED, "ok COMMITTED"),
    # contract §4.2 the agent reports an unknown outcome; a repeat is answered done.
    ("mark unknown", Fate.LOST): Row("UNKNOWN by restart", "ok UNKNOWN"),
    ("mark unknown", Fate.KEPT): Row("UNKNOWN by report_unknown", "ok UNKNOWN"),
    # contract §4.5 approve, bound to the revision it saw: once applied, the same
    # approval is stale (REVISION_CONFLICT), never applied twice.
    ("approve", Fate.LOST): Row("AWAITING_APPROVAL by prepare", "ok PREPARED"),
    ("approve", Fate.KEPT): Row("PREPARED by approve", "refused REVISION_CONFLICT"),
    # contract §4.6 reconcile (operator, at the revision seen).
    ("reconcile", Fate.LOST): Row("UNKNOWN by report_unknown", "ok COMMITTED"),
    ("reconcile", Fate.KEPT): Row(RECONCILED, "refused REVISION_CONFLICT"),
    # contract §8 Put expecting the key absent; no unconditional overwrite.
    ("checkpoint put", Fate.LOST): Row("absent", "ok revision=1"),
    ("checkpoint put", Fate.KEPT): Row(CHECKPOINT, "refused REVISION_CONFLICT"),
}
# PostgreSQL issues checkpoint revisions from a sequence, which a rollback
# does not give back: a put lost after it drew its revision leaves that
# revision unused for ever (revisions only grow; they need not be dense).
PG_ROWS = {
    ("checkpoint put", "before_commit"): Row("absent", "ok revision=2"),
}


@dataclass(frozen=True, slots=True)
class Observed:
    """What one case saw."""

    crashed: bool
    first: str
    seen: str
    retry: str
    log: str


def violations(observed: Observed, row: Row) -> list[str]:
    """How `observed` differs from `row`; [] when it matches."""
    found = []
    if not observed.crashed:
        found.append("the daemon did not crash at the failpoint")
    if observed.first != "cut":
        found.append(f"the cut request was answered: {observed.first!r}")
    if observed.seen != row.seen:
        found.append(f"after restart {observed.seen!r}, the table says {row.seen!r}")
    if observed.retry != row.retry:
        found.append(f"the retry got {observed.retry!r}, the table {row.retry!r}")
    return found


def run_case(
    workdir: Path,
    transition: Transition,
    point: str,
    store: str | None = None,
    *,
    build: str = "",
    session: bool = False,
) -> Observed:
    """One crash at `point` (its store's prefix added) in `transition`'s
    write, then a restart without failpoints on the same store; `session`:
    the client sends its ledger requests on the session stream."""
    data = workdir / "data"
    prefix = "lmdb" if store is None else "pg"
    spec = f"{prefix}.{point}@{transition.method}"
    args = () if store is None else ("--store", store)
    daemon = CrashingDaemon(data, spec, args, build=build)
    try:
        with Client(daemon.target, session=session, timeout=30) as c:
            transition.setup(c)
            first = answered(transition.act, c)
        crashed = daemon.crashed_at_failpoint()
    finally:
        daemon.kill()
    config = ServeConfig(data_dir=data, store=store)
    with running_daemon(config) as d, Client(d.target, session=session) as c:
        seen = transition.seen(c)
        retry = answered(transition.act, c)
    return Observed(crashed, first, seen, retry, daemon.log())


CASES = [
    (name, point)
    for name in BY_NAME
    for point in FATE
    if DEEP or point != "before_apply" or name == "commit"
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("repeat", range(REPEAT))
@pytest.mark.parametrize(("transition", "point"), CASES)
def test_a_crash_at_the_failpoint_leaves_the_row_of_the_table(
    short_tmp: Path, transition: str, point: str, repeat: int
) -> None:
    """LMDB: a crash at each failpoint of each transition leaves the
    table's state, and the retry gets the table's answer."""
    observed = run_case(short_tmp, BY_NAME[transition], point)
    row = TABLE[(transition, FATE[point])]
    assert violations(observed, row) == [], observed.log


# Answers on the session stream leave by another path than unary ones.
SESSION_CASES = [
    (name, point)
    for name in BY_NAME
    for point in FATE
    if DEEP
    or (name, point) in {("commit", "before_commit"), ("commit", "after_commit")}
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("repeat", range(REPEAT))
@pytest.mark.parametrize(("transition", "point"), SESSION_CASES)
def test_a_crash_at_the_failpoint_leaves_the_row_of_the_table_on_a_session(
    short_tmp: Path, transition: str, point: str, repeat: int
) -> None:
    """LMDB, the client's requests as messages of one session stream: the
    same rows (the stream breaks with the crash; the retry is on a new one)."""
    observed = run_case(short_tmp, BY_NAME[transition], point, session=True)
    row = TABLE[(transition, FATE[point])]
    assert violations(observed, row) == [], observed.log


PG_CASES = [
    (name, point)
    for name in BY_NAME
    for point in FATE
    if DEEP or (point != "before_apply" and name in PG_FAST)
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("repeat", range(REPEAT))
@pytest.mark.parametrize(("transition", "point"), PG_CASES)
def test_a_crash_at_the_failpoint_leaves_the_row_of_the_table_on_postgres(
    short_tmp: Path, pg_url: str, transition: str, point: str, repeat: int
) -> None:
    """PostgreSQL: the same table: a crash before COMMIT loses the
    transition, a crash after COMMIT returned keeps it."""
    observed = run_case(short_tmp, BY_NAME[transition], point, pg_url)
    row = PG_ROWS.get((transition, point)) or TABLE[(transition, FATE[point])]
    assert violations(observed, row) == [], observed.log


@pytest.mark.timeout(120)
def test_a_row_written_wrong_is_caught(short_tmp: Path) -> None:
    """Negative control: the commit crashed before its commit matches its
    row, and not the row of a crash after the commit."""
    observed = run_case(short_tmp, BY_NAME["commit"], "before_commit")
    assert violations(observed, TABLE[("commit", Fate.LOST)]) == [], observed.log
    wrong = violations(observed, TABLE[("commit", Fate.KEPT)])
    assert any("after restart" in v for v in wrong), wrong


@pytest.mark.timeout(120)
def test_a_build_that_answers_before_its_commit_is_caught(short_tmp: Path) -> None:
    """Negative control: a store that answers a batch before committing it
    (`failpoint_daemon.AnswersBeforeCommit`), crashed between the two: the
    client was told COMMITTED, the record is not, and the table says so."""
    observed = run_case(
        short_tmp,
        BY_NAME["commit"],
        "before_commit",
        build=failpoint_daemon.ANSWERS_BEFORE_COMMIT,
    )
    found = violations(observed, TABLE[("commit", Fate.LOST)])
    assert found == ["the cut request was answered: 'ok COMMITTED'"], observed.log


BATCH = [b"fp-batch-1", b"fp-batch-2", b"fp-batch-3"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store_kind", postgres.BOTH)
def test_a_crash_mid_batch_loses_every_write_of_the_batch(
    short_tmp: Path, store_url: str | None
) -> None:
    """A crash after the first of a batch's writes was applied, before the
    others: none of them is there after the restart (a batch commits as one
    transaction, on both stores)."""
    store = store_url or str(short_tmp / "data")
    point = "pg.mid_batch@Batch" if store_url else "lmdb.mid_batch@Batch"
    log = short_tmp / "child.log"
    code = crashing.crash_in_a_batch(store, BATCH, point, log)
    assert code == failpoints.CRASH_EXIT, log.read_text()
    assert crashing.rows_left(store, BATCH) == []


@pytest.mark.timeout(120)
def test_a_crash_after_the_batch_commit_keeps_every_write(short_tmp: Path) -> None:
    """Negative control of the mid-batch check: the same batch crashed
    after its commit, and the same check finds every row."""
    store = str(short_tmp / "data")
    log = short_tmp / "child.log"
    code = crashing.crash_in_a_batch(store, BATCH, "lmdb.after_commit@Batch", log)
    assert code == failpoints.CRASH_EXIT, log.read_text()
    assert crashing.rows_left(store, BATCH) == BATCH
