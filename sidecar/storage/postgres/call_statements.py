"""The statements of a call's save alone (`storage.postgres.call_saves`):
a new call, a new call within its namespace's quota, a record replaced; each
adds its change of the counters to the rows `views` says, in the same
statement."""

from __future__ import annotations

from typing import LiteralString


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
    ))  # fmt: skip


# What a statement of a new call answers: the rows it inserted, its
# transaction, and the call's row as its snapshot holds it (the one that
# made the insert lose, when it was committed before the statement began).
_NEW_CALL_FOUND: LiteralString = (
    "SELECT (SELECT count(*) FROM c), pg_current_xact_id_if_assigned()::text, "
    "pg_postmaster_start_time(), e.doc, e.tomb FROM (SELECT) AS one "
    "LEFT JOIN effectd_calls AS e ON e.k = %(k)s::bytea"
)
_FROM_C: LiteralString = (
    "SELECT count(*), pg_current_xact_id_if_assigned()::text, "
    "pg_postmaster_start_time() FROM c"
)


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
        _NEW_CALL_FOUND,
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
    "NULL, NULL FROM l RETURNING 1) ",
    _NEW_CALL_FOUND,
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
        _FROM_C,
    )
)
