"""A call's compare-and-swap (`api.CallWrite`) as one statement, committed
on its own: how the PostgreSQL store saves a call whose write is alone in
its writer's batch (`sidecar.storage.postgres.store`).

In a batch, a save is a write function: its row read `FOR UPDATE`, the
documents written through the key-value views, the usage counted by their
puts, then COMMIT, four round trips. Alone, it is one statement in
autocommit, whose own conditions are the compare:

- a record replaced: `UPDATE … WHERE k = $k AND revision = $old`, and the
  change of the namespace's counters added to the connection's shard row
  (`views.USAGE_SHARDS`) in the same statement, the bytes from the length
  of the document it replaced, as stored;
- a new call: `INSERT … ON CONFLICT (k) DO NOTHING` (a record or a
  tombstone of the call is a row of that key: nothing is written);
- a new call under a quota (`Quotas.limits_storage`): its growth added to
  the namespace's lock row (`views.USAGE_LOCK_SHARD`) only while the
  namespace stays within its limits, and the call inserted only if it was,
  by a plain INSERT whose unique violation undoes the whole statement. The
  lock row's condition is checked again on its newest version after any
  wait for it (READ COMMITTED's re-check of an updated row), so quota
  checks of one namespace take turns exactly as in a batch, which locks
  the same row (`views.PgReadView._locked_usage`); the other shards are
  read as of the statement's start, as there.

No row changed is a lost compare (`api.Conflict`), or the quota's refusal,
which a read of the counters then words (`quota.refuse_growth`). What a
decision assumed (`CallWrite.holds`) is asked just before the statement; a
write with an audit entry is never alone (its entry extends a chain).

A connection lost with the statement leaves its outcome unknown: the
statement may have committed, and while its backend lives it may still.
`settle` ends that backend (`pg_terminate_backend`, allowed on a backend of
the same user) or finds the server restarted, then reads the call's row:
the document written is there (applied), the row is as compared (not
applied: decided again), or anything else (another write since: not
known, `mayHaveBeenApplied`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import LiteralString

import psycopg

from sidecar.errors import UnsupportedKeyScheme
from sidecar.ledger import quota
from sidecar.ledger.model import State, ToolCall
from sidecar.ledger.quota import Quotas, Usage
from sidecar.ledger.retention import Tombstone
from sidecar.storage import keys, plan_rows, tombstones
from sidecar.storage.api import CallWrite, Conflict
from sidecar.storage.call_documents import RecordFormatError, decode_call, encode_call
from sidecar.storage.plan_rows import Summarize
from sidecar.storage.postgres import tables
from sidecar.storage.postgres.call_statements import (
    NEW_CALL,
    NEW_CALL_WITHIN_QUOTA,
    REPLACE_CALL,
)
from sidecar.storage.postgres.faults import Backend, Failed, Xact, xact_of
from sidecar.storage.postgres.views import Params, StoreConnection
from sidecar.storage.tombstones import TombstoneFormatError

_ROW: LiteralString = "SELECT revision, doc FROM effectd_calls WHERE k = %s"
# Whether the call's row is stored (a record or a tombstone of it), and the
# namespace's counters.
_STORED_AND_USAGE: LiteralString = (
    "SELECT EXISTS (SELECT 1 FROM effectd_calls WHERE k = %s), "
    "coalesce(sum(open_calls), 0), coalesce(sum(stored_bytes), 0), "
    "coalesce(sum(tombstone_bytes), 0) FROM effectd_usage WHERE namespace = %s"
)
# The backend a lost statement ran on: alive still (under the same start),
# and the server's start now.
_BACKEND: LiteralString = (
    "SELECT pg_postmaster_start_time(), EXISTS (SELECT 1 FROM pg_stat_activity "
    "WHERE pid = %s AND backend_start = %s)"
)
_END_BACKEND: LiteralString = "SELECT pg_terminate_backend(%s)"
# Asked this many times, this far apart, whether a lost statement's backend
# is gone.
_GONE_ASKS = 50
_GONE_PAUSE = 0.02


@dataclass(frozen=True, slots=True)
class Sent:
    """A save's statement as sent: the call's key, the document written,
    and the revision compared (None: a new call)."""

    key: bytes
    doc: bytes
    compared: int | None


class Unanswered(Exception):
    """The statement of a save failed (`error`, as psycopg raised it):
    nothing of it is applied, but for a connection lost with it, which
    leaves its outcome to `settle` (autocommit) or to the transaction's."""

    def __init__(self, sent: Sent, error: psycopg.Error) -> None:
        super().__init__(str(error))
        self.sent = sent
        self.error = error


# What runs a statement: the first row it returns.
Run = Callable[[LiteralString, Params], "tuple[object, ...] | None"]


def columns(k: bytes, call: ToolCall, doc: bytes, plan: bytes | None) -> tables.Columns:
    """`tables.columns(k, doc, plan, None)` of `doc`, the encoded `call`, read from
    the record itself rather than by decoding its document again."""
    lease = call.lease
    retained = (
        call.updated_ns
        if call.state is State.COMMITTED and call.result is not None
        else None
    )
    return (
        k, call.ref.namespace, call.ref.run_id, call.ref.call_id,
        tables.STATE_CODES[call.state], call.revision, call.attempt,
        None if lease is None else lease.expires_wall_ns, call.created_ns,
        call.updated_ns, call.acknowledged, retained, doc, plan, None, None,
    )  # fmt: skip


def alone(write: CallWrite) -> bool:
    """Whether `write` can be saved by one statement of its own."""
    return write.audit is None


def save(
    run: Run, write: CallWrite, summarize: Summarize | None, shard: int
) -> Xact | None:
    """Applies `write` by one statement, sent by `run` (in autocommit, or
    in a transaction of saves alone: `store`); its counter changes go to
    shard `shard`. Returns the transaction's id once it wrote (None: not
    yet).

    Raises:
        Conflict: the stored record is not the one `write` was decided on,
            or what the decision assumed changed; nothing was written.
        QuotaExceeded: the new call would take its namespace past
            `write.quotas`; nothing was written.
        Unanswered: the statement failed.
    """
    if write.holds is not None and not write.holds():
        raise Conflict("what the decision assumed changed before its write")
    new = write.new
    key = keys.call_key(new.ref)
    doc = encode_call(new)
    plan = plan_rows.encode(new, summarize)
    row = columns(key, new, doc, plan)
    was_open = write.old is not None and write.old.state is not State.COMMITTED
    opened = int(new.state is not State.COMMITTED) - int(was_open)
    namespace = new.ref.namespace.encode()
    old = write.old
    params = _named(row)
    params["ns"] = namespace
    params["open"] = opened
    if old is not None:
        query: LiteralString = REPLACE_CALL
        params.update(old=old.revision, size=len(doc), shard=shard)
    elif write.quotas is not None and write.quotas.limits_storage:
        query = NEW_CALL_WITHIN_QUOTA
        quotas = write.quotas
        params.update(bytes=len(key) + len(doc), lo=quotas.open_calls)
        params["lb"] = quotas.stored_bytes
    else:
        query = NEW_CALL
        params.update(bytes=len(key) + len(doc), shard=shard)
    try:
        found = run(query, params)
        assert found is not None
        if not found[0] and old is None:
            stored_doc, stored_tomb = found[3:5]
            if stored_doc is not None or stored_tomb is not None:
                raise Conflict(
                    f"tool call {new.ref.run_id}:{new.ref.call_id} exists",
                    _readable(stored_doc, stored_tomb),
                )
            if query is NEW_CALL_WITHIN_QUOTA:
                assert write.quotas is not None
                grown = len(key) + len(doc)
                _refused(
                    run, write.quotas, key, new.ref.namespace, grown=(opened, grown)
                )
    except psycopg.Error as exc:
        raise Unanswered(
            Sent(key, doc, None if old is None else old.revision), exc
        ) from None
    if not found[0]:
        raise Conflict(f"tool call {new.ref.run_id}:{new.ref.call_id} changed")
    return None if found[1] is None else xact_of(found[1:3])


def _readable(
    doc: object, tomb: object
) -> tuple[ToolCall | None, Tombstone | None] | None:
    """The call of a row a new call's insert found (`api.Conflict.found`);
    None for one this daemon cannot read (a newer daemon's), which a read
    then refuses as it should."""
    try:
        if doc is not None:
            assert isinstance(doc, bytes | memoryview), type(doc)
            return decode_call(bytes(doc)), None
        assert isinstance(tomb, bytes | memoryview), type(tomb)
        return None, tombstones.decode(bytes(tomb))
    except (UnsupportedKeyScheme, RecordFormatError, TombstoneFormatError):
        return None


def _named(row: tables.Columns) -> dict[str, object]:
    """A record's columns (`columns`) by the names the statements give
    them."""
    (
        k, namespace, run, call, state, revision, attempt, lease, created,
        updated, ack, retained, doc, plan, _, _,
    ) = row  # fmt: skip
    return {
        "k": k,
        "namespace": namespace,
        "run": run,
        "call": call,
        "state": state,
        "revision": revision,
        "attempt": attempt,
        "lease": lease,
        "created": created,
        "updated": updated,
        "ack": ack,
        "retained": retained,
        "doc": doc,
        "plan": plan,
    }


def _refused(
    run: Run, quotas: Quotas, key: bytes, namespace: str, *, grown: tuple[int, int]
) -> None:
    """Raises the quota's refusal of a new call the statement did not
    insert, worded from the counters as they are now; returns when the call
    is stored (a lost compare: another request made it since the decision,
    whatever the quota says now) or when the counters no longer refuse it
    (a call finished meanwhile)."""
    found = run(_STORED_AND_USAGE, (key, namespace.encode()))
    assert found is not None
    stored, *counters = found
    if stored:
        return
    before = Usage(*(int(str(n)) for n in counters))
    refusal = quota.refuse_growth(namespace, before, before.plus(*grown), quotas)
    if refusal is not None:
        raise refusal


def settle(conn: StoreConnection, lost: Unanswered, backend: Backend | None) -> None:
    """What became of a statement lost with the connection that ran on
    `backend` (None: not known), asked on `conn`, another connection.

    Raises:
        Conflict: it did not commit, and never will.
        Failed: not known (`applied`: it may have been).
    """
    if backend is None or not _gone(conn, backend):
        raise Failed(
            "PostgreSQL did not answer the write, and its backend could not "
            "be ended; the request may have been applied",
            applied=True,
        )
    sent = lost.sent
    found = conn.statement(_ROW, (sent.key,)).fetchone()
    if found is not None and found[1] == sent.doc:
        return
    if (found is None and sent.compared is None) or (
        found is not None and found[0] == sent.compared
    ):
        raise Conflict(f"the write was lost with its connection: {lost}")
    raise Failed(
        "PostgreSQL did not answer the write, and the call changed since; "
        "the request may have been applied",
        applied=True,
    )


def _gone(conn: StoreConnection, backend: Backend) -> bool:
    """Whether `backend` is gone (ended by this call if still alive): a
    statement it ran has committed or never will."""
    for ask in range(_GONE_ASKS):
        found = conn.statement(_BACKEND, (backend.pid, backend.started)).fetchone()
        assert found is not None
        server_started, alive = found
        if server_started != backend.server_started or not alive:
            return True
        if ask == 0:
            conn.statement(_END_BACKEND, (backend.pid,)).fetchone()
        time.sleep(_GONE_PAUSE)
    return False
