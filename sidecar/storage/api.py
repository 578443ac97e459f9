"""The storage interface the services are written against.

A write is a function of a `WriteView`, submitted to the store; the store
runs it inside a write transaction and resolves the returned future only
after that transaction is durably committed. If the function raises, none of
its writes are applied and the future carries the exception. Writes of other
functions in the same group commit are unaffected.

A view answers in the ledger's terms (`LedgerReads`, `LedgerWrites`): each
operation one a service needs, which each backend implements its own way
(`storage.table_ledger` over tables of bytes, LMDB's; PostgreSQL's typed
rows, `storage.postgres.call_reads`). The services use nothing else of a
store (`tests/repository/test_ledger_seam.py`); the tables of bytes
(`Table`, `Tables`) are the backends' own, and their format upgrades' and
restores'.

Over 400 lines on purpose: the seam is one contract, the ledger's
operations beside the store that hands them out, read whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from sidecar.errors import UnsupportedKeyScheme
from sidecar.ledger.audit import Entry, Fact, Head
from sidecar.ledger.checkpoints import StoredCheckpoint
from sidecar.ledger.model import CallRef, IdentityEnum, State, ToolCall
from sidecar.ledger.ownership import PassLock, Registration
from sidecar.ledger.quota import Quotas, StoreFill, Usage
from sidecar.ledger.retention import Tombstone
from sidecar.storage.plan_rows import Summarize

T = TypeVar("T")


class Table(IdentityEnum):
    """The tables of the store; each maps bytes keys to bytes values.

    CALLS, PLAN_ROWS and TOMBSTONES hold the documents of `storage.records`,
    `storage.plan_rows` and `storage.tombstones`; CALL_STATES,
    RETENTION_TIMES and TOMBSTONE_TIMES are their indexes, written in step
    with them by those modules, in the same write function. A store may keep
    those documents in columns of its own and read the indexes from them
    (PostgreSQL, `storage.postgres.tables`): an index entry written without
    its record, or a value there that is not such a document, is not kept.
    Every other table keeps any bytes.
    """

    META = "meta"
    CALLS = "calls"
    # (state, record key) -> b"": records by state, for sweeps and listings.
    CALL_STATES = "call_states"
    CHECKPOINTS = "checkpoints"
    # Big-endian sequence number -> audit entry; append-only, hash-chained.
    AUDIT = "audit"
    # Record key -> tombstone of a call compacted after the retention window
    # (contract §4.7); it still refuses a re-execution.
    TOMBSTONES = "tombstones"
    # (compacted wall time, 8 bytes big-endian) + record key -> b"": the
    # tombstones in the order their lifetime ends.
    TOMBSTONE_TIMES = "tombstone_times"
    # Namespace -> (open calls, stored bytes); kept in step with CALLS,
    # CALL_STATES, CHECKPOINTS and TOMBSTONES by `sidecar.storage.usage`.
    USAGE = "usage"
    # (acknowledged byte, last change wall time, 8 bytes big-endian) + record
    # key -> b"": the COMMITTED records with a result, in the order their
    # retention window ends (`sidecar.storage.retention_times`).
    RETENTION_TIMES = "retention_times"
    # Record key -> the plan row of a COMMITTED record with a result: what a
    # recovery plan shows of it, ready to answer (`sidecar.storage.plan_rows`).
    PLAN_ROWS = "plan_rows"
    # Incarnation, 8 bytes big-endian -> the registration of the daemon that
    # opened the store under it (`sidecar.storage.daemons`).
    DAEMONS = "daemons"
    # Name of a periodic pass -> the lock of the daemon that runs it
    # (`sidecar.storage.daemons`).
    PASSES = "passes"


class FormatError(RuntimeError):
    """The store holds a format (LMDB) or schema (PostgreSQL) this effectd
    does not read; the message says what to do."""


class Conflict(Exception):
    """A compare-and-swap lost (`Store.save_call`): the stored record is no
    longer the one the write was decided on. Nothing was written; read the
    record again and decide again.

    `found`: the call as the compare found it (its record, or its
    tombstone), where the store read it with the compare, on a snapshot as
    a read's: what to decide again on, with no read of one's own. None:
    not read."""

    def __init__(
        self,
        message: str,
        found: tuple[ToolCall | None, Tombstone | None] | None = None,
    ) -> None:
        super().__init__(message)
        self.found = found


@dataclass(frozen=True, slots=True)
class CallWrite:
    """A compare-and-swap of one call record: `new` replaces the record read
    as `old` only while the stored one is still at `old`'s revision; with
    `old` None, `new` is a new call, saved only while the store holds neither
    a record nor a tombstone of it, and, with `quotas`, only while the
    namespace stays within them (`ledger.quota.refuse_growth`). `holds` is
    what else the decision assumed (the policy it was made under), asked in
    the write transaction: False is a `Conflict` too. `audit` is the entry
    the rule writes with the record (an operator's decision), appended to
    the audit chain in the same transaction."""

    old: ToolCall | None
    new: ToolCall
    quotas: Quotas | None = None
    holds: Callable[[], bool] | None = None
    audit: Fact | None = None


# A record as a walk over many lists it: the record, or, for one a newer
# daemon made with an idempotency key scheme this one cannot compute, the
# refusal (ADR-010 R4) as a value, for the walk to skip or raise.
Listed = ToolCall | UnsupportedKeyScheme


class CallReads(Protocol):
    """The calls of the ledger as the services read them: records and the
    tombstones of compacted ones, found by identity, walked by key or by
    state. A record's key (`keys.call_key`) is its place in the walks:
    opaque above the store, handed back as `after` to resume one."""

    def load_call(self, ref: CallRef) -> ToolCall | None:
        """The record of `ref`; None: none stored (maybe a tombstone)."""
        ...

    def load_call_at(self, key: bytes) -> ToolCall | None:
        """The record stored under `key`, as a walk named it."""
        ...

    def find_call(self, ref: CallRef) -> tuple[ToolCall | None, Tombstone | None]:
        """The record of `ref`, or else the tombstone of its compacted record."""
        ...

    def calls(
        self, prefix: bytes, *, after: bytes | None = None, history: bool = True
    ) -> Iterator[tuple[bytes, Listed]]:
        """(key, record) of the calls whose key starts with `prefix` (one
        namespace's, `keys.namespace_prefix`; one run's,
        `keys.run_prefix`), in key order, after `after`. Without
        `history`, each record's history is left out (`decode_call`)."""
        ...

    def calls_in_state(
        self, state: State, namespace: str | None = None, *, after: bytes | None = None
    ) -> Iterator[bytes]:
        """The keys of the records in `state` (of `namespace`, or of every
        one), in key order, after the key `after`."""
        ...

    def plan(
        self, prefix: bytes, *, after: bytes | None = None, rows: bool = True
    ) -> Iterator[tuple[bytes, Listed | bytes]]:
        """What a recovery plan shows of each call under `prefix` (a run's),
        in key order, after `after`: with `rows`, a COMMITTED record's plan
        row, ready to answer (`storage.plan_rows`), where it has a current
        one; else the record without its history."""
        ...


class Tables(Protocol):
    """The tables of bytes a store keeps (`Table`), read: what the codecs
    of `storage.records` and its siblings lay the ledger out on."""

    def get(self, table: Table, key: bytes) -> bytes | None: ...

    def scan(
        self, table: Table, prefix: bytes, *, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Items whose key starts with `prefix`, in key order, after `after`."""
        ...


class WritableTables(Tables, Protocol):
    def put(self, table: Table, key: bytes, value: bytes) -> None: ...

    def delete(self, table: Table, key: bytes) -> None: ...

    @property
    def summarize(self) -> Summarize | None:
        """What makes the plan rows of the records saved here: the one the
        store was opened with (`storage.plan_rows`); None: no rows."""
        ...


class RetentionReads(Protocol):
    """What a retention pass reads (contract §4.7)."""

    def retained(
        self, *, acknowledged: bool, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """(place, key) of the COMMITTED records with a result that are
        `acknowledged` (or not), in the order their retention window ends
        (by last change), after the place `after`: what a pass may compact,
        so that it stops at the first one not due."""
        ...


class CheckpointReads(Protocol):
    """The checkpoints of the ledger (contract §8)."""

    def load_checkpoint(self, namespace: str, key: str) -> StoredCheckpoint | None: ...

    def checkpoints(
        self, namespace: str, prefix: str, *, after: bytes | None = None
    ) -> Iterator[tuple[bytes, StoredCheckpoint]]:
        """(place, checkpoint) of the checkpoints of `namespace` whose stored
        key may start with `prefix` (`keys.checkpoint_ranges`: a long key
        stored hashed shares only its first bytes), in stored-key order,
        after the place `after`; the reader filters by `prefix` and counts
        what it read."""
        ...


class UsageReads(Protocol):
    """The usage counters of each namespace (`ledger.quota`)."""

    def usage(self, namespace: str) -> Usage:
        """The counters of `namespace` as of this view, its own writes
        counted."""
        ...

    def usages(self) -> dict[str, Usage]:
        """Every namespace's stored counters; one with nothing is absent."""
        ...


class AuditReads(Protocol):
    """The audit log: an append-only, hash-chained list of entries."""

    def audit_head(self) -> Head | None:
        """The newest entry's sequence and hash; None: no entry yet."""
        ...

    def audit_entry(self, sequence: int) -> bytes | None:
        """The stored bytes of an entry (`audit.decode`)."""
        ...

    def audit_entries(self, after: int = 0) -> Iterator[tuple[int, bytes]]:
        """(sequence, stored bytes) of the entries after `after`, oldest first."""
        ...


class RegistrationReads(Protocol):
    """The daemons that serve the store (`ledger.ownership`)."""

    def registration(self, incarnation: int) -> Registration | None: ...

    def registrations(self) -> Iterator[Registration]:
        """Every registration kept, oldest incarnation first."""
        ...

    def pass_lock(self, name: str) -> PassLock | None:
        """The lock of the daemon that runs the periodic pass `name`."""
        ...

    def refuse_unfinished_restore(self) -> None:
        """Raises `marking.UnfinishedRestore` while a marking of the store as
        restored began and did not finish (`storage.marking`)."""
        ...


class LedgerReads(
    CallReads,
    RetentionReads,
    CheckpointReads,
    UsageReads,
    AuditReads,
    RegistrationReads,
    Protocol,
):
    """Everything a service reads, in the ledger's terms."""


class ReadView(Tables, LedgerReads, Protocol):
    """What a read function of the store is handed: the ledger, and the
    tables of bytes the backends of today keep it in (for the store's own
    modules, its format upgrades and restores; a service reads the
    ledger)."""


class CallWrites(CallReads, Protocol):
    """The calls of the ledger as the services change them, in a write."""

    def write_call(self, old: ToolCall | None, new: ToolCall) -> None:
        """Stores `new`, which replaces `old` as loaded (None: a new call)."""
        ...

    def compact_call(self, call: ToolCall, tomb: Tombstone) -> None:
        """Replaces the stored record `call` (as loaded) by its tombstone."""
        ...

    def expire_tombstones(self, before_ns: int, limit: int) -> tuple[int, bool]:
        """Deletes the tombstones made before `before_ns`, oldest first, at
        most `limit`; how many, and whether more may be due."""
        ...


class CheckpointWrites(CheckpointReads, Protocol):
    def next_checkpoint_revision(self) -> int:
        """A revision never given before, store-wide: no ABA."""
        ...

    def save_checkpoint(self, namespace: str, cp: StoredCheckpoint) -> None: ...

    def delete_checkpoint(self, namespace: str, key: str) -> None: ...


class AuditWrites(AuditReads, Protocol):
    def append_audit(self, fact: Fact) -> Entry:
        """Seals `fact` after the chain's head and stores it, in this write."""
        ...


class RegistrationWrites(RegistrationReads, Protocol):
    def save_registration(self, reg: Registration) -> None: ...

    def forget_registration(self, incarnation: int) -> None: ...

    def save_pass_lock(self, name: str, lock: PassLock) -> None: ...


class LedgerWrites(
    LedgerReads,
    CallWrites,
    CheckpointWrites,
    AuditWrites,
    RegistrationWrites,
    Protocol,
):
    """Everything a service writes, in the ledger's terms."""


class WriteView(ReadView, WritableTables, LedgerWrites, Protocol):
    """What a write function of the store is handed."""


class Store(Protocol):
    @property
    def incarnation(self) -> int:
        """This open of the store: a number no other open of the same store,
        by any daemon, ever had (LMDB: how many times a daemon opened it,
        this one included)."""
        ...

    @property
    def exclusive(self) -> bool:
        """True when no other daemon can serve this store while this one has
        it open (LMDB, by the data directory's lock): every other incarnation
        is then an earlier one, gone (`ledger.ownership`)."""
        ...

    @property
    def reads_wait(self) -> bool:
        """True when a read may wait on more than this process's memory
        (PostgreSQL: a pooled connection, the network, the server): the
        services then run even a one-key read off the event loop
        (`Scans.point_read`). False (LMDB): a read is a few microseconds of
        memory-mapped pages, cheaper inline than a hop to a thread."""
        ...

    @property
    def saves_by_statement(self) -> bool:
        """True when `save_call` is a statement a database server runs on
        its own (PostgreSQL, `storage.postgres.call_saves`): a change decided
        on a point read, then saved, then costs two round trips, where
        deciding it in a write transaction costs three."""
        ...

    def read(self, fn: Callable[[ReadView], T]) -> T:
        """Runs `fn` on a consistent snapshot; never waits for writers."""
        ...

    def submit(self, fn: Callable[[WriteView], T]) -> Future[T]:
        """Queues `fn` for the writer; the future resolves after the commit.
        `fn` runs on a `counting.Counting` view, so the usage counters change in
        the same transaction as the records they count."""
        ...

    async def write(self, fn: Callable[[WriteView], T]) -> T:
        """`submit`, awaited on the running event loop: `fn`'s value once
        the commit is durable (raises what `fn` raised, or the store's
        error). `fn` may run on the loop's own thread, gathered with the
        loop's other writes: a write of a few records (many: `submit`).
        Cancelled before its transaction begins, `fn` is not run."""
        ...

    async def save_call(self, write: CallWrite) -> None:
        """Applies `write` once its compare holds, durably (as `write`).

        Raises:
            Conflict: the stored record is not the one `write` was decided on.
            QuotaExceeded: the new call would take its namespace past
                `write.quotas`.
        """
        ...

    def close(self) -> None:
        """Finishes queued writes, then closes; later submits fail."""
        ...

    def backup(self, path: Path) -> int:
        """Copies a consistent snapshot into `path`, a new or empty directory
        (`BackupTargetError` otherwise); returns the bytes written."""
        ...


@runtime_checkable
class IssuesRevisions(Protocol):
    """A write view whose store gives checkpoint revisions from a sequence of
    its own (PostgreSQL), instead of a counter row in META that every
    concurrent checkpoint write would contend on."""

    def issued_revision(self) -> int | None:
        """A revision never given before; None: use the counter in META."""
        ...


@runtime_checkable
class SkipsRevisions(Protocol):
    """A write view of a store whose checkpoint revisions come from a
    sequence (`IssuesRevisions`), which a restore moves ahead there."""

    def skip_revisions(self, gap: int) -> None:
        """Moves the sequence `gap` ahead of every revision it gave."""
        ...


@runtime_checkable
class ReadsPoints(Protocol):
    """A store that serves a read of a few keys cheaper than a snapshot
    (PostgreSQL: each key one statement, outside a transaction), where each
    key may be read on its own snapshot. For a rule that decides on a record
    it then saves by compare-and-swap (`Store.save_call`), which holds the
    record to what was read; never for what must be read together."""

    def read_point(self, fn: Callable[[ReadView], T]) -> T: ...


@runtime_checkable
class CountsStates(Protocol):
    """A store that counts its records of each state without walking them
    (PostgreSQL: the server counts, in one statement)."""

    def count_states(self) -> dict[State, int]: ...


@runtime_checkable
class ReportsFill(Protocol):
    """A store that knows how full it is (LMDB)."""

    def fill(self) -> StoreFill: ...
