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

from sidecar.ledger import quota
from sidecar.ledger.model import State, ToolCall
from sidecar.ledger.quota import Quotas, Usage
from sidecar.storage import keys, plan_rows
from sidecar.storage.api import CallWrite, Conflict
from sidecar.storage.call_documents import encode_call
from sidecar.storage.plan_rows import Summarize
from sidecar.storage.postgres import tables
from sidecar.storage.postgres.faults import Backend, Failed, Xact, xact_of
from sidecar.storage.postgres.views import Params, StoreConnection


# The change of a save to its connection's shard row of the namespace's
# counters, applied only when the call's statement `c` wrote (`when`): an
# UPDATE of the row, and an insert only when the UPDATE found none. An
# `INSERT … ON CONFLICT DO UPDATE` of a row that exists locks it before it
# updates it, and that lock is one more WAL record a save. Parameters by
# name: `ns`, `shard`, `open` (the open calls' change); `grown`, an SQL
# expression of the stored bytes' change over `c`.
def _counted(grown: LiteralString, when: LiteralString) -> LiteralString:
    return "".join((
        "s AS (UPDATE effectd_usage AS s SET ",
        "open_calls = s.open_calls + %(open)s::bigint, ",
        "stored_bytes = s.stored_bytes + ", grown, " FROM c ",
        "WHERE s.namespace = %(ns)s::bytea AND s.shard = %(shard)s::integer ",
        "AND ", when, " RETURNING 1), ",
        "u AS (INSERT INTO effectd_usage AS u (namespace, shard, open_calls, ",
        "stored_bytes, tombstone_bytes) SELECT %(ns)s::bytea, ",
        "%(shard)s::integer, %(open)s::bigint, ", grown, ", 0 FROM c ",
        "WHERE ", when, " AND NOT EXISTS (SELECT 1 FROM s) ",
        "ON CONFLICT (namespace, shard) DO UPDATE SET ",
        "open_calls = u.open_calls + EXCLUDED.open_calls, ",
        "stored_bytes = u.stored_bytes + EXCLUDED.stored_bytes) ",
        "SELECT count(*), pg_current_xact_id_if_assigned()::text, ",
        "pg_postmaster_start_time() FROM c",
    ))  # fmt: skip


# The row's columns by name (`_named`), and the counters' (`_counted`):
# `bytes`, the new call's size.
NEW_CALL: LiteralString = "".join(
    (
        "WITH c AS (INSERT INTO effectd_calls (k, namespace, run_id, call_id, "
        "state, revision, attempt, lease_expires_ns, created_ns, updated_ns, "
        "acknowledged, retained_ns, doc, plan, tomb, compacted_ns) "
        "SELECT %(k)s::bytea, %(namespace)s::text, %(run)s::text, %(call)s::text, "
        "%(state)s::smallint, %(revision)s::bigint, %(attempt)s::integer, "
        "%(lease)s::bigint, %(created)s::bigint, %(updated)s::bigint, "
        "%(ack)s::boolean, %(retained)s::bigint, %(doc)s::bytea, %(plan)s::bytea, "
        "NULL, NULL ON CONFLICT (k) DO NOTHING RETURNING 1), ",
        _counted("%(bytes)s::bigint", "true"),
    )
)
# Whether the namespace's lock row `u` grown by the call stays within the
# limits, the other shards' counters taken from `o`. In an UPDATE (and an
# `ON CONFLICT DO UPDATE`) PostgreSQL looks at it again on the row's newest
# version after waiting for another writer's lock on it, so checks of one
# namespace take turns exactly.
WITHIN_ROW: LiteralString = (
    "(%(lo)s = 0 OR %(open)s <= 0 "
    "OR u.open_calls + (SELECT open_other FROM o) + %(open)s <= %(lo)s) "
    "AND (%(lb)s = 0 "
    "OR u.stored_bytes + (SELECT bytes_other FROM o) + %(bytes)s <= %(lb)s) "
    "AND NOT EXISTS (SELECT 1 FROM effectd_calls WHERE k = %(k)s)"
)
# Parameters by name: the namespace (`ns`), its growth (`open`, `bytes`),
# its limits (`lo`, `lb`; 0: none), the row's columns. -1 is the lock row's
# shard (`views.USAGE_LOCK_SHARD`): grown by UPDATE (`g`), made by `f` only
# when the statement's snapshot has none (it then may meet one made since,
# and grows that one within the limits).
NEW_CALL_WITHIN_QUOTA: LiteralString = "".join((
    "WITH o AS (SELECT coalesce(sum(open_calls), 0) AS open_all, "
    "coalesce(sum(stored_bytes), 0) AS bytes_all, "
    "coalesce(sum(open_calls) FILTER (WHERE shard <> -1), 0) AS open_other, "
    "coalesce(sum(stored_bytes) FILTER (WHERE shard <> -1), 0) AS bytes_other, "
    "coalesce(bool_or(shard = -1), false) AS locked "
    "FROM effectd_usage WHERE namespace = %(ns)s), "
    "g AS (UPDATE effectd_usage AS u SET "
    "open_calls = u.open_calls + %(open)s::bigint, "
    "stored_bytes = u.stored_bytes + %(bytes)s::bigint "
    "WHERE u.namespace = %(ns)s::bytea AND u.shard = -1 AND ", WITHIN_ROW,
    " RETURNING 1), "
    "f AS (INSERT INTO effectd_usage AS u (namespace, shard, open_calls, "
    "stored_bytes, tombstone_bytes) SELECT %(ns)s::bytea, -1, "
    "%(open)s::bigint, %(bytes)s::bigint, 0 FROM o WHERE NOT o.locked "
    "AND (%(lo)s = 0 OR %(open)s <= 0 OR o.open_all + %(open)s <= %(lo)s) "
    "AND (%(lb)s = 0 OR o.bytes_all + %(bytes)s <= %(lb)s) "
    "AND NOT EXISTS (SELECT 1 FROM effectd_calls WHERE k = %(k)s) "
    "ON CONFLICT (namespace, shard) DO UPDATE SET "
    "open_calls = u.open_calls + EXCLUDED.open_calls, "
    "stored_bytes = u.stored_bytes + EXCLUDED.stored_bytes WHERE ", WITHIN_ROW,
    " RETURNING 1), "
    "l AS (SELECT 1 FROM g UNION ALL SELECT 1 FROM f), "
    "c AS (INSERT INTO effectd_calls (k, namespace, run_id, call_id, state, "
    "revision, attempt, lease_expires_ns, created_ns, updated_ns, "
    "acknowledged, retained_ns, doc, plan, tomb, compacted_ns) "
    "SELECT %(k)s::bytea, %(namespace)s::text, %(run)s::text, %(call)s::text, "
    "%(state)s::smallint, %(revision)s::bigint, %(attempt)s::integer, "
    "%(lease)s::bigint, %(created)s::bigint, %(updated)s::bigint, "
    "%(ack)s::boolean, %(retained)s::bigint, %(doc)s::bytea, %(plan)s::bytea, "
    "NULL, NULL FROM l RETURNING 1) "
    "SELECT count(*), pg_current_xact_id_if_assigned()::text, "
    "pg_postmaster_start_time() FROM c",
))  # fmt: skip
# The row's columns by name (`_named`), `old` (the revision compared), and
# the counters' (`_counted`): `size`, the new document's length; the old
# document's is read in the statement, as stored.
REPLACE_CALL: LiteralString = "".join(
    (
        "WITH c AS (UPDATE effectd_calls AS t SET state = %(state)s::smallint, "
        "revision = %(revision)s::bigint, attempt = %(attempt)s::integer, "
        "lease_expires_ns = %(lease)s::bigint, updated_ns = %(updated)s::bigint, "
        "acknowledged = %(ack)s::boolean, retained_ns = %(retained)s::bigint, "
        "doc = %(doc)s::bytea, plan = %(plan)s::bytea "
        "FROM (SELECT k, octet_length(doc) AS was FROM effectd_calls "
        "WHERE k = %(k)s::bytea) AS o "
        "WHERE t.k = %(k)s::bytea AND o.k = t.k AND t.revision = %(old)s::bigint "
        "AND t.doc IS NOT NULL RETURNING o.was), ",
        _counted(
            "(%(size)s::bigint - c.was)",
            "(%(size)s::bigint <> c.was OR %(open)s::bigint <> 0)",
        ),
    )
)
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
        if not found[0] and query is NEW_CALL_WITHIN_QUOTA:
            assert write.quotas is not None
            grown = len(key) + len(doc)
            _refused(run, write.quotas, key, new.ref.namespace, grown=(opened, grown))
    except psycopg.Error as exc:
        raise Unanswered(
            Sent(key, doc, None if old is None else old.revision), exc
        ) from None
    if not found[0]:
        raise Conflict(f"tool call {new.ref.run_id}:{new.ref.call_id} changed")
    return None if found[1] is None else xact_of(found[1:])


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
