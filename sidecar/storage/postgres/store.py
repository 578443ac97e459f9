"""The PostgreSQL store: the `api.Store` of many daemons sharing one ledger.

A writer thread commits what is queued (a batch, as LMDB's writer does) in
one READ COMMITTED transaction, and every compare-and-swap the rules make
holds across daemons as under LMDB's single writer, by locks rather than by
aborts (`sidecar.storage.postgres.views` does the locking).

A call's save (`save_call`, without an audit entry: nearly every request's
write) is one statement whose own conditions are the compare
(`sidecar.storage.postgres.call_saves`): alone in its batch, committed on
its own, with no BEGIN, no read before it and no COMMIT; a batch of saves
alone is one transaction of their statements and one COMMIT. Any other
batch runs every function through the views, saves too:

- A row a write function decides on is read `FOR UPDATE`: a call row (its
  record, plan row and tombstone), a checkpoint, a registration, a pass
  lock, a META key (the audit chain's head, the restore marker), and every
  row a scan in a write returns (the lease sweep's STARTED calls, an
  operator's reconciliation walk, expiring tombstones, the restore
  marking's calls). A concurrent writer of that row waits until COMMIT and
  then reads what was committed; its compare (by revision) then fails.
- A key read absent (a new call, whose tombstone is the same row; a
  checkpoint compared as absent; a pass lock never taken; the audit head of
  an empty chain) is written by a plain INSERT, so another transaction's
  insert of the same key fails this one with a unique violation: a genuine
  race on one key, run again (`faults.CONFLICTS`), where the key is then
  found and the compare fails as it should. No other insert can conflict:
  the keys of different calls never meet. A new call decided on a read
  outside the transaction that found neither it nor its tombstone is
  inserted without reading its row again (`_NewCall`): the INSERT is the
  compare.
- A quota check reads a namespace's sharded counters (`effectd_usage`)
  after locking the namespace's lock row, so the checks of one namespace
  take turns at every daemon and each sees the counters every earlier one
  committed: exact, with no global serialization point. Only when a limit
  applies (`Quotas.limits_storage`); the cost is that first executions of
  one namespace with a quota then commit one transaction at a time, across
  daemons (a batch of many calls each), where without a quota they commit
  in parallel. Counter changes are added to the writing connection's shard
  row, never to a row another daemon writes.
- A predicate over many rows that must hold until COMMIT, where neither
  row locks nor unique keys cover a row not yet there, is the
  registrations': a daemon's start (no live daemon of the same id beside
  it, no unfinished restore marking), the removal of registrations gone,
  and the restore marking's check that no daemon is live. A write function
  that scans them runs alone in a transaction holding the registrations'
  advisory lock exclusively from its first statement (`views.Alone`: met in
  a batch, it is put off and run again once the batch committed); any other read
  of a registration (a rule judging another daemon's lease, a renewal)
  holds it shared. The usage recount of an old database (`usage.
  ensure_counted`) locks the counters' table (EXCLUSIVE mode) before it
  counts. SERIALIZABLE is used nowhere: PostgreSQL's serializable checks do
  not see the writes of transactions at a lower level, so a mix would need
  these locks on both sides anyway.

An aborted batch (a unique violation, a deadlock, a connection lost before
COMMIT) runs again on new reads: write functions read everything they
decide on from their view, so running one again is running it for the first
time. A future resolves only after COMMIT returned, or after
`pg_xact_status` said a COMMIT whose answer was lost committed, asked of
the server it ran on, not restarted since (`sidecar.storage.postgres.faults`
says what each failure answers, and why a restart matters). Reads
run on REPEATABLE READ read-only snapshots of their own pool. The
incarnation comes from a sequence: one per daemon, never reused.

Over 400 lines on purpose: the writer's batch, its retries and the lost
COMMIT it settles are one path, read together.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Generic, LiteralString, TypeVar

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from sidecar.errors import NotImplementedYet, QuotaExceeded, ShuttingDown
from sidecar.failpoints import Point, Scoped
from sidecar.ledger.model import State
from sidecar.storage import calls, counting, keys, usage
from sidecar.storage.api import CallWrite, Conflict, ReadView, WriteView
from sidecar.storage.handoff import hand_back
from sidecar.storage.postgres import call_saves, connecting
from sidecar.storage.postgres import schema as pg_schema
from sidecar.storage.postgres.faults import (
    BACKEND_QUERY,
    CONFLICTS,
    MAY_HAVE_BEEN_APPLIED,
    Again,
    Backend,
    Failed,
    Xact,
    backend_of,
    before_commit,
    connection_lost,
    getconn,
    rollback,
    unavailable,
    xact_status,
)
from sidecar.storage.postgres.options import PgStats, PostgresOptions
from sidecar.storage.postgres.views import (
    BEGIN,
    READ_BEGIN,
    REGISTRATIONS_LOCK,
    USAGE_SHARDS,
    Alone,
    Batch,
    DatabaseFailed,
    Params,
    PgReadView,
    PgWriteView,
    Statement,
    StoreConnection,
)

# Jitter from the OS, never from the global `random` an application (or a
# test's random search) owns: it keeps no state.
_JITTER = random.SystemRandom()

T = TypeVar("T")
log = logging.getLogger(__name__)

_Conn = StoreConnection


class _Handoff(Generic[T]):
    """A queued write's outcome, handed by its writer thread to the loop
    that awaits it (`write`, `save_call`): the part of a concurrent
    `Future` the writers use, delivering into an asyncio future with
    `call_soon_threadsafe`. `asyncio.wrap_future` of a concurrent Future
    costs a condition and two chained futures per write.

    Cancelled (`cancel`, on the loop) before a writer took it, the write
    never runs; once taken, `cancel` fails and the outcome is delivered
    when its transaction ended (`_awaited`)."""

    __slots__ = ("_cancelled", "_lock", "_loop", "_taken", "future")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._taken = False
        self._cancelled = False
        self.future: asyncio.Future[T] = loop.create_future()

    def set_running_or_notify_cancel(self) -> bool:
        """A writer takes it: False when it was cancelled before."""
        with self._lock:
            if self._cancelled:
                return False
            self._taken = True
            return True

    def cancel(self) -> bool:
        """On the loop: whether the write was stopped before it ran."""
        with self._lock:
            if self._taken:
                return False
            self._cancelled = True
            return True

    def set_result(self, value: T) -> None:
        hand_back(self._loop, self.future, value, None)

    def set_exception(self, error: BaseException) -> None:
        hand_back(self._loop, self.future, None, error)


# Where a write's outcome goes: a concurrent Future (`submit`), or a
# `_Handoff` to an awaiting loop.
_Outcomes = Future[Any] | _Handoff[Any]
_Item = tuple[Callable[[WriteView], Any], _Outcomes]
_Outcome = tuple[_Outcomes, Any, BaseException | None]
_STOP = object()


_NO_CONNECTION = "no PostgreSQL connection for a write within {} s"
# Connections of the read pool a lost save's outcome is asked on.
_SETTLE_ASKS = 2


def _first_row(conn: _Conn, opening: list[Statement] | None = None) -> call_saves.Run:
    """What runs a statement on `conn` and returns its first row, raising
    psycopg's error; the first one sent with `opening` (a transaction's
    BEGIN), in one round trip."""
    view = PgReadView(conn, opening=opening)

    def run(query: LiteralString, params: Params) -> tuple[object, ...] | None:
        try:
            rows = view.rows(query, params)
        except DatabaseFailed as failed:
            raise failed.error from None
        return rows[0] if rows else None

    return run


def _fail(batch: list[_Item], message: str, *, applied: bool) -> None:
    for _, future in batch:
        future.set_exception(unavailable(message, applied=applied))


async def _awaited(handoff: _Handoff[T]) -> T:
    """The value of a queued write. Cancelled (a request's deadline) before
    its transaction began, the write never runs; after, the cancellation
    waits for the transaction's end, so that a request is never answered
    while its write may still commit: whatever its answer, it comes after
    the write is durable or undone."""
    waiting = handoff.future
    try:
        return await asyncio.shield(waiting)
    except asyncio.CancelledError:
        if not handoff.cancel():
            # Running (or done): its commit is waited for, its outcome
            # dropped with the request it answered.
            await asyncio.wait([waiting])
            if not waiting.cancelled():
                waiting.exception()  # retrieved: no caller is left to see it
        raise


# Whether a call's row (its record or tombstone) is stored.
_CALL_STORED: LiteralString = "SELECT 1 FROM effectd_calls WHERE k = %s"


class _NewCall:
    """The save of a new call, decided on a read outside the transaction
    that found neither its record nor its tombstone (`CallWrite.old` None).
    Its first run takes the call's row as absent without reading it again
    (`PgWriteView.assume_absent`): the row is then written by a plain
    INSERT, so a row stored since that read (a concurrent request's, or
    another daemon's) fails the batch with a unique violation, and the
    batch runs again. Every later run reads the row (`FOR UPDATE`), where
    the compare then fails as it should (`api.Conflict`). A quota's refusal
    on the first run, decided before that INSERT was sent, is one only
    while the row is still absent: a call stored since is a lost compare,
    whatever the quota says now."""

    def __init__(self, key: bytes, save: Callable[[WriteView], None]) -> None:
        self._key = key
        self._save = save
        self._ran = False

    def __call__(self, view: WriteView) -> None:
        if self._ran:
            self._save(view)
            return
        self._ran = True
        assert isinstance(view, PgWriteView), type(view)
        view.assume_absent(self._key)
        try:
            self._save(view)
        except QuotaExceeded:
            # Read after the namespace's lock row was locked (the quota
            # check's): a call stored by a writer that held it is seen.
            if view.rows(_CALL_STORED, (self._key,)):
                raise Conflict("the new call was stored since it was read") from None
            raise


class _CallSave:
    """A queued `save_call`: `write`, and the write function that applies
    it in a batch (`calls.compare_and_save`, counted). Alone in its
    writer's batch, it is one statement instead (`call_saves`)."""

    __slots__ = ("apply", "write")

    def __init__(self, write: CallWrite, apply: Callable[[WriteView], None]) -> None:
        self.write = write
        self.apply = apply

    def __call__(self, view: WriteView) -> None:
        self.apply(view)


def _call_save(fn: Callable[[WriteView], Any]) -> _CallSave | None:
    """The save `fn` queues, if it is one a statement can apply alone."""
    if isinstance(fn, Scoped):
        fn = fn.fn
    if isinstance(fn, _CallSave) and call_saves.alone(fn.write):
        return fn
    return None


class PostgresStore:
    """`api.Store` on the PostgreSQL database at `url` (schema created by
    `effectd migrate`; any other version is refused)."""

    # A test's store without the row locks (the negative control) turns
    # `locking` off (nothing read is locked, every write an upsert), and may
    # widen the window between a read and a write with its own view.
    locking = True
    write_view: type[PgWriteView] = PgWriteView

    def __init__(self, url: str, options: PostgresOptions | None = None) -> None:
        # The URL's `pooler` (`connecting`): behind a transaction pooler no
        # setting or prepared statement outlives a transaction. Its pool
        # sizes override the options'.
        self._target = target = connecting.parse(url)
        o = options or PostgresOptions()
        self.options = o = dataclasses.replace(
            o,
            writers=target.writers or o.writers,
            readers=target.readers or o.readers,
            max_batch=target.max_batch or o.max_batch,
        )
        self.stats = PgStats()
        self._stats_lock = threading.Lock()
        self._closing = threading.Lock()
        self._closed = False
        # The store opens each transaction itself, on connections in
        # autocommit mode (`_pool`): its BEGIN goes with its first statement
        # (`views.BEGIN`, `views.READ_BEGIN`), not as a round trip of its own.
        # A call's save alone in its batch is one statement in autocommit
        # (`call_saves`), but behind a transaction pooler, where a statement
        # outside a transaction could not carry the store's settings, and in
        # a test's store without row locks.
        self._direct = self.locking and not target.per_transaction
        self._openings = {
            read_only: self._made_opening(read_only=read_only)
            for read_only in (False, True)
        }
        self._writes = self._pool("writes", o.writers, self._configure_writer)
        self._reads = self._pool("reads", o.readers, self._configure_reader)
        # Point reads: each statement on its own snapshot, with no transaction
        # around it (one statement where a snapshot costs BEGIN and ROLLBACK).
        # Behind a transaction pooler a statement outside a transaction could
        # not carry its settings: point reads are snapshot reads there.
        self._points = (
            self._reads
            if target.per_transaction
            else self._pool("points", o.readers, self._configure_points)
        )
        self._queue: queue.SimpleQueue[_Item | object] = queue.SimpleQueue()
        self._writers = [
            threading.Thread(target=self._run, name="effectd-pg-writer", daemon=True)
            for _ in range(o.writers)
        ]
        try:
            for writer in self._writers:
                writer.start()
            self._writes.open(wait=True, timeout=o.pool_timeout)
            self._reads.open(wait=True, timeout=o.pool_timeout)
            if self._points is not self._reads:
                self._points.open(wait=True, timeout=o.pool_timeout)
            with self._writes.connection() as conn:
                if target.pooler == "none":
                    connecting.check_direct(conn)
                for statement, values in self._opening():
                    conn.execute(statement, values)
                pg_schema.check(conn)
                row = conn.execute("SELECT nextval('effectd_incarnation')").fetchone()
                conn.commit()
            assert row is not None
            self._incarnation = int(str(row[0]))
            self.submit(usage.ensure_counted).result()
        except PoolTimeout as exc:
            self.close()
            raise unavailable(
                f"PostgreSQL is not reachable: {exc}", applied=False
            ) from None
        except BaseException:
            self.close()
            raise

    def _pool(
        self,
        use: str,
        size: int,
        configure: Callable[[_Conn], None],
    ) -> ConnectionPool[_Conn]:
        """A pool named for its `use`, shown in pg_stat_activity as
        `effectd` (writes) or `effectd/<use>`; opened by `__init__`."""
        o = self.options
        name = o.application_name + ("" if use == "writes" else "/" + use)
        return ConnectionPool(
            self._target.conninfo,
            connection_class=StoreConnection,
            min_size=1,
            max_size=size,
            kwargs={
                # Every connection: the store opens its transactions itself.
                "autocommit": True,
                "application_name": name,
                # Off behind a transaction pooler, whatever the options say.
                "prepare_threshold": (
                    None
                    if self._target.prepare_threshold is None
                    else o.prepare_threshold
                ),
            },
            configure=configure,
            timeout=o.pool_timeout,
            reconnect_timeout=o.reconnect_seconds,
            name="effectd-" + use,
            open=False,
        )

    def _settings(self, *, read_only: bool) -> list[connecting.Setting]:
        """The settings of the store's transactions."""
        settings: list[connecting.Setting] = []
        if not read_only:
            # Every query here is a key lookup or a key range: an index scan,
            # never a sequential scan of a table the planner thinks small.
            settings.append(("enable_seqscan", "off"))
        if self.options.statement_timeout is not None:
            timeout = f"{int(self.options.statement_timeout * 1000)}ms"
            settings.append(("statement_timeout", timeout))
        return settings

    def _opening(self, *, read_only: bool = False) -> list[Statement]:
        """What opens a transaction, sent with its first statement (a new
        list: the views empty it once sent)."""
        return list(self._openings[read_only])

    def _made_opening(self, *, read_only: bool) -> tuple[Statement, ...]:
        """BEGIN (a write's, or a read's snapshot), and behind a transaction
        pooler the settings (`connecting.setting_statement`): made once."""
        begin = READ_BEGIN if read_only else BEGIN
        if not self._target.per_transaction:
            return (begin,)
        settings = [*self._target.settings, *self._settings(read_only=read_only)]
        made = connecting.setting_statement(settings)
        return (begin,) if made is None else (begin, made)

    def _configure(self, conn: _Conn, *, read_only: bool) -> None:
        """A new connection of a pool, in autocommit mode (the store opens
        its transactions itself: `_opening`): the session's settings, but
        behind a transaction pooler, where each transaction makes them."""
        if not self._target.per_transaction:
            for name, value in self._settings(read_only=read_only):
                conn.execute("SELECT set_config(%s, %s, false)", (name, value))

    def _configure_writer(self, conn: _Conn) -> None:
        self._configure(conn, read_only=False)
        if self._direct:
            conn.backend = backend_of(conn.execute(BACKEND_QUERY).fetchone())

    def _configure_reader(self, conn: _Conn) -> None:
        self._configure(conn, read_only=True)

    def _configure_points(self, conn: _Conn) -> None:
        self._configure(conn, read_only=True)

    @property
    def saves_by_statement(self) -> bool:
        return self._direct

    @property
    def incarnation(self) -> int:
        return self._incarnation

    @property
    def exclusive(self) -> bool:
        """Never: every daemon given the same URL serves this store."""
        return False

    # A read takes a pooled connection and round trips to the server.
    reads_wait = True

    # -- reads ------------------------------------------------------------

    def read(self, fn: Callable[[ReadView], T]) -> T:
        """`fn` on a snapshot (a REPEATABLE READ read-only transaction)."""
        return self._read(self._reads, fn, snapshot=True)

    def count_states(self) -> dict[State, int]:
        """The records of each state (`api.CountsStates`), counted by the
        server in one statement: a metrics scrape walks no calls."""
        return self.read(_state_counts)

    def read_point(self, fn: Callable[[ReadView], T]) -> T:
        """`fn`, a read of a few keys (`api.ReadsPoints`), each statement on
        its own snapshot, outside any transaction: a one-key read is one
        statement."""
        return self._read(self._points, fn, snapshot=self._target.per_transaction)

    def _read(
        self,
        pool: ConnectionPool[_Conn],
        fn: Callable[[ReadView], T],
        *,
        snapshot: bool,
    ) -> T:
        """`fn` on a connection of `pool`. A connection found broken (the
        database restarted since it was pooled) means the others pooled with
        it may be too: the pool's idle connections are checked (the broken
        ones replaced) and `fn` runs once more."""
        if self._closed:
            raise ShuttingDown("the store is closed")
        for attempt in (1, 2):
            try:
                with pool.connection() as conn:
                    opening = self._opening(read_only=True) if snapshot else None
                    try:
                        return fn(PgReadView(conn, opening=opening))
                    finally:
                        if snapshot:
                            rollback(conn)
            except PoolTimeout:
                raise unavailable(
                    "no PostgreSQL connection for a read within "
                    f"{self.options.pool_timeout} s",
                    applied=False,
                ) from None
            except DatabaseFailed as failed:
                if attempt == 1 and connection_lost(failed.error):
                    pool.check()
                    continue
                raise unavailable(
                    f"a PostgreSQL read failed: {failed.error}", applied=False
                ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    # -- writes -----------------------------------------------------------

    def submit(self, fn: Callable[[WriteView], T]) -> Future[T]:
        future: Future[T] = Future()
        self._queued(counting.counted(fn), future)
        return future

    def _handed(self, fn: Callable[[WriteView], T]) -> _Handoff[T]:
        """Queues `fn` (usage counted already), its outcome handed to the
        running loop."""
        handoff: _Handoff[T] = _Handoff(asyncio.get_running_loop())
        self._queued(fn, handoff)
        return handoff

    def _queued(self, fn: Callable[[WriteView], T], future: _Outcomes) -> None:
        """Queues `fn` (usage counted already) for the writers."""
        with self._closing:
            if self._closed:
                future.set_exception(ShuttingDown("the store is closed"))
            else:
                failpoints = self.options.failpoints
                self._queue.put(
                    (fn if failpoints is None else failpoints.tag(fn), future)
                )

    async def write(self, fn: Callable[[WriteView], T]) -> T:
        """`submit`, awaited: always through the writer threads, since a
        transaction on PostgreSQL is network round trips the event loop
        must not wait for (`_awaited`)."""
        return await _awaited(self._handed(counting.counted(fn)))

    async def save_call(self, write: CallWrite) -> None:
        """The compare-and-swap of one record (`storage.calls`), as a write
        of its own; a new call's without reading its row first (`_NewCall`)."""
        save = counting.counted(functools.partial(calls.compare_and_save, write=write))
        if write.old is None and self.locking:
            save = _NewCall(keys.call_key(write.new.ref), save)
        await _awaited(self._handed(_CallSave(write, save)))

    def _run(self) -> None:
        """A writer thread: what is queued, up to `max_batch`, goes into one
        transaction (group commit, as LMDB's writer does)."""
        while True:
            first = self._queue.get()
            if first is _STOP:
                self._queue.put(_STOP)  # for the other writers
                return
            batch: list[_Item] = [first]  # type: ignore[list-item]
            while len(batch) < self.options.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    self._queue.put(_STOP)
                    break
                batch.append(item)  # type: ignore[arg-type]
            live = [(fn, f) for fn, f in batch if f.set_running_or_notify_cancel()]
            if len(live) == 1 and self._direct:
                save = _call_save(live[0][0])
                if save is not None:
                    self._save_alone(save, live[0])
                    continue
            if live:
                self._write(live)

    def _save_alone(self, save: _CallSave, item: _Item) -> None:
        """Applies a call's save, alone in its batch, by one statement
        committed on its own (`call_saves`); a statement lost with its
        connection is settled on another."""
        future = item[1]
        try:
            conn = getconn(self._writes, self.options.pool_timeout)
        except PoolTimeout:
            _fail(
                [item], _NO_CONNECTION.format(self.options.pool_timeout), applied=False
            )
            return
        self._at(Point.PG_BEFORE_APPLY, [item])
        self._at(Point.PG_BEFORE_COMMIT, [item])
        started = time.perf_counter()
        try:
            call_saves.save(
                _first_row(conn),
                save.write,
                self.options.summarize,
                conn.info.backend_pid % USAGE_SHARDS,
            )
        except call_saves.Unanswered as failed:
            broken = connection_lost(failed.error) or conn.broken
            if broken:
                # Its backend is ended next, if alive: the pool drops it.
                conn.close()
            self._writes.putconn(conn)
            if isinstance(failed.error, CONFLICTS):
                future.set_exception(Conflict(f"a concurrent write won: {failed}"))
            elif broken:
                self._settle(failed, conn.backend, item)
            else:
                log.error("PostgreSQL refused a write: %s", failed)
                _fail([item], f"a PostgreSQL write failed: {failed}", applied=False)
            return
        except Exception as exc:  # refused: a lost compare, a quota
            self._writes.putconn(conn)
            future.set_exception(exc)
            return
        self._writes.putconn(conn)
        self._at(Point.PG_AFTER_COMMIT, [item])
        self._committed_now(1, time.perf_counter() - started)
        future.set_result(None)

    def _settle(
        self, lost: call_saves.Unanswered, backend: Backend | None, item: _Item
    ) -> None:
        """Answers a save whose statement was lost with its connection, by
        what `call_saves.settle` learns on a connection of the read pool."""
        future = item[1]
        try:
            self._settled(lost, backend)
        except Failed as failed:
            with self._stats_lock:
                self.stats.commits_unknown += 1
            _fail([item], failed.message, applied=failed.applied)
            return
        except (psycopg.Error, PoolTimeout) as exc:
            with self._stats_lock:
                self.stats.commits_unknown += 1
            _fail(
                [item],
                f"PostgreSQL did not answer a write ({lost}), nor whether it "
                f"committed ({exc}); the request may have been applied",
                applied=True,
            )
            return
        except Conflict as not_applied:  # decided again
            with self._stats_lock:
                self.stats.commits_resolved += 1
            future.set_exception(not_applied)
            return
        with self._stats_lock:
            self.stats.commits_resolved += 1
        log.warning("a write was lost with its connection; it committed")
        self._committed_now(1, 0.0)
        future.set_result(None)

    def _settled(self, lost: call_saves.Unanswered, backend: Backend | None) -> None:
        """`call_saves.settle` on a connection of the read pool; asked once
        more, the pool checked, when that connection was found broken (what
        broke the write's connection, a restart, broke the idle ones too).

        Raises:
            Conflict, Failed: as `call_saves.settle`.
            psycopg.Error, PoolTimeout: it could not be asked.
        """
        for ask in range(1, _SETTLE_ASKS + 1):
            try:
                with self._reads.connection(timeout=self.options.pool_timeout) as conn:
                    call_saves.settle(conn, lost, backend)
                    return
            except psycopg.Error as exc:
                if ask == _SETTLE_ASKS or not connection_lost(exc):
                    raise
                self._reads.check()

    def _write(self, batch: list[_Item], *, alone: bool = False) -> None:
        """Commits `batch`, trying again what may be; then runs each function
        put off (`views.Alone`) in a transaction of its own."""
        o = self.options
        deadline = time.monotonic() + o.retry_seconds
        for attempt in range(1, o.max_attempts + 1):
            try:
                outcomes = (
                    self._attempt(batch, alone=True) if alone else self._attempt(batch)
                )
            except Again as again:
                if attempt == o.max_attempts or time.monotonic() > deadline:
                    _fail(
                        batch,
                        f"the write did not commit after {attempt} attempts: {again}",
                        applied=False,
                    )
                    return
                with self._stats_lock:
                    self.stats.retries += 1
                # Contenders spread out, so the next attempt rarely meets them.
                time.sleep(_JITTER.uniform(0, min(0.05, 0.001 * 2**attempt)))
                continue
            except Failed as failed:
                _fail(batch, failed.message, applied=failed.applied)
                return
            later: list[_Item] = []
            functions = {future: fn for fn, future in batch}
            for future, value, error in outcomes:
                if isinstance(error, Alone) and not alone:
                    later.append((functions[future], future))
                elif error is None:
                    future.set_result(value)
                else:
                    future.set_exception(error)
            for item in later:
                with self._stats_lock:
                    self.stats.alone += 1
                self._write([item], alone=True)
            return

    def _attempt(self, batch: list[_Item], *, alone: bool = False) -> list[_Outcome]:
        try:
            conn = getconn(self._writes, self.options.pool_timeout)
        except PoolTimeout:
            raise Failed(
                _NO_CONNECTION.format(self.options.pool_timeout), applied=False
            ) from None
        try:
            if alone:
                return self._transaction(conn, batch, alone=True)
            return self._transaction(conn, batch)
        finally:
            self._writes.putconn(conn)

    def _transaction(
        self, conn: _Conn, batch: list[_Item], *, alone: bool = False
    ) -> list[_Outcome]:
        """Runs each function of `batch` in turn in one transaction
        (`_applied`, or `_saved` for a batch of call saves alone), commits,
        and returns the outcomes, in order (`Alone`: the function is put
        off). `alone`: the transaction holds the registrations' lock
        exclusively from its first statement."""
        saves = [_call_save(fn) for fn, _ in batch] if self._direct else []
        try:
            if not alone and saves and all(saves):
                outcomes, xact = self._saved(conn, batch, saves)  # type: ignore[arg-type]
            else:
                outcomes, xact = self._applied(conn, batch, alone=alone)
        except DatabaseFailed as failed:
            rollback(conn)
            raise before_commit(failed.error) from None
        except psycopg.Error as exc:
            rollback(conn)
            raise before_commit(exc) from None
        except BaseException:
            rollback(conn)
            raise
        self._at(Point.PG_BEFORE_COMMIT, batch)
        self._commit(conn, batch, xact)
        return outcomes

    def _applied(
        self, conn: _Conn, batch: list[_Item], *, alone: bool
    ) -> tuple[list[_Outcome], Xact | None]:
        """Each function of `batch` run in turn, each on its own view: one
        that raises leaves no writes (its view is never flushed) and does not
        affect the others, which see the writes of those before them; the
        writes flushed. The outcomes, and the transaction's id."""
        outcomes: list[_Outcome] = []
        written = Batch(locking=self.locking, alone=alone, opening=self._opening())
        if alone and self.locking:
            PgReadView(conn, opening=written.opening).run(
                "SELECT pg_advisory_xact_lock(%s)", (REGISTRATIONS_LOCK,)
            )
        self._at(Point.PG_BEFORE_APPLY, batch)
        for index, (fn, future) in enumerate(batch):
            if index:
                self._at(Point.PG_MID_BATCH, batch)
            view = self.write_view(conn, written, self.options.summarize)
            try:
                value = fn(view)
            except Exception as exc:  # the request is refused, others go on
                outcomes.append((future, None, exc))
                continue
            except Alone as put_off:  # run again after, alone
                outcomes.append((future, None, put_off))
                continue
            view.done()
            outcomes.append((future, value, None))
        return outcomes, written.flush(conn, conn.info.backend_pid % USAGE_SHARDS)

    def _saved(
        self, conn: _Conn, batch: list[_Item], saves: list[_CallSave]
    ) -> tuple[list[_Outcome], Xact | None]:
        """A batch of call saves alone, each one statement (`call_saves`):
        one whose compare is lost, or which a quota refuses, writes nothing
        and leaves the others be; a statement that fails fails the
        transaction (run again, or answered, as any batch's)."""
        outcomes: list[_Outcome] = []
        run = _first_row(conn, self._opening())
        shard = conn.info.backend_pid % USAGE_SHARDS
        xact: Xact | None = None
        self._at(Point.PG_BEFORE_APPLY, batch)
        for index, ((_, future), save) in enumerate(zip(batch, saves, strict=True)):
            if index:
                self._at(Point.PG_MID_BATCH, batch)
            try:
                wrote = call_saves.save(run, save.write, self.options.summarize, shard)
            except call_saves.Unanswered as failed:
                raise failed.error from None
            except Exception as exc:  # the request is refused, others go on
                outcomes.append((future, None, exc))
                continue
            xact = xact or wrote
            outcomes.append((future, None, None))
        return outcomes, xact

    def _commit(self, conn: _Conn, batch: list[_Item], xact: Xact | None) -> None:
        """COMMITs the transaction `xact` (None: it wrote nothing).

        Raises:
            Again: it did not commit, and may run again.
            Failed: it did not, or whether it did is not known.
        """
        started = time.perf_counter()
        try:
            conn.commit()
        except CONFLICTS as exc:
            raise Again(str(exc)) from None
        except psycopg.Error as exc:
            # A connection that broke with its COMMIT (whatever the error
            # said: a server's FATAL, a pooler's own) may have committed.
            if not (connection_lost(exc) or conn.broken):
                raise Failed(f"COMMIT failed: {exc}", applied=False) from None
            if xact is None:
                # Nothing was written: what was read and decided stands.
                self._committed_now(len(batch), 0.0)
                return
            if self._committed(xact, exc, len(batch)):
                return
            raise Again(f"COMMIT lost, the transaction aborted: {exc}") from None
        self._at(Point.PG_AFTER_COMMIT, batch)
        self._committed_now(len(batch), time.perf_counter() - started)

    def _at(self, point: Point, batch: list[_Item]) -> None:
        """A test build's failpoint (`sidecar.failpoints`); nothing else."""
        failpoints = self.options.failpoints
        if failpoints is not None:
            failpoints.reached(point, [fn for fn, _ in batch])

    def _committed_now(self, size: int, seconds: float) -> None:
        with self._stats_lock:
            self.stats.transactions += 1
            self.stats.writes += size
            self.stats.largest_batch = max(self.stats.largest_batch, size)
        if self.options.on_commit is not None:
            try:
                self.options.on_commit(size, seconds)
            except Exception:  # an observer must never fail a commit
                log.exception("the commit observer failed")

    def _committed(self, xact: Xact, lost: psycopg.Error, size: int) -> bool:
        """Whether the transaction `xact`, whose COMMIT was lost, committed.

        Raises:
            Failed: not known (mayHaveBeenApplied=true).
        """
        status = xact_status(self._reads, xact)
        with self._stats_lock:
            if status is None:
                self.stats.commits_unknown += 1
            else:
                self.stats.commits_resolved += 1
        if status == "committed":
            log.warning("a COMMIT was lost with its connection; it committed")
            self._committed_now(size, 0.0)
            return True
        if status == "aborted":
            return False
        log.error("a COMMIT was lost with its connection; its outcome is unknown")
        raise Failed(
            f"PostgreSQL did not answer COMMIT ({lost}); the request may have "
            "been applied",
            applied=True,
        )

    def close(self) -> None:
        with self._closing:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        for writer in self._writers:
            if writer.is_alive():
                writer.join()
        self._writes.close()
        self._reads.close()
        if self._points is not self._reads:
            self._points.close()

    def backup(self, path: Path) -> int:
        raise NotImplementedYet(
            "the PostgreSQL store is backed up with the database's own tools "
            "(pg_dump, or continuous archiving); see docs/operations.md"
        )


def _state_counts(view: ReadView) -> dict[State, int]:
    """The view's counts by state: its store's snapshot views are PostgreSQL's."""
    assert isinstance(view, PgReadView), type(view)
    return view.state_counts()


__all__ = [
    "MAY_HAVE_BEEN_APPLIED",
    "PgStats",
    "PostgresOptions",
    "PostgresStore",
    "unavailable",
]
