"""The PostgreSQL store's schema: its version, the migrations that create and
upgrade it (`effectd migrate --store URL`), and the check a daemon makes at
open, which refuses a schema it does not know, saying what to run.

Version 3 has one table per concept (`sidecar.storage.postgres.tables`);
versions 1 and 2 kept every `api.Table` in one key-value table,
`effectd_kv`. Beside them: `effectd_usage`, the usage counters as rows
sharded per writing connection (`sidecar.storage.postgres.views`), summed on
read; the sequence of daemon incarnations (one per daemon that opens the
store); and the sequence of checkpoint revisions, which never gives a number
twice, whatever is deleted.

Tables are created unqualified, in the first schema of the connection's
`search_path` (`?options=-csearch_path%3Dname` in the URL chooses another
than `public`). The steps up to version 2 run in one transaction under an
advisory lock, so two `migrate` runs (two pods starting) apply them once.
The step to version 3 copies the rows (`sidecar.storage.postgres.upgrade`):
it runs in transactions of its own, resumable, as that module says.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, LiteralString

from sidecar.storage import usage
from sidecar.storage.api import FormatError
from sidecar.storage.postgres import upgrade

if TYPE_CHECKING:
    # Imported where a connection is made: a daemon of the LMDB store, and
    # its command line, load no PostgreSQL driver.
    import psycopg

# The version this effectd reads and writes; a daemon refuses any other.
# 2: plan rows (`storage.plan_rows`), which a daemon of version 1 would leave
# stale (a row would answer for an older record): it must not open the
# store. Records committed before have none and are recovered the long way.
# 3: one table per concept (`storage.postgres.tables`), which a daemon of
# version 2 does not read.
SCHEMA_VERSION = 3
# pg_advisory_xact_lock key of migrations: "effectd" in ASCII.
_MIGRATION_LOCK = 0x65_66_66_65_63_74_64

_CREATE_VERSION = """
CREATE TABLE IF NOT EXISTS effectd_schema (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version integer NOT NULL,
    migrated_at timestamptz NOT NULL DEFAULT now()
)
"""

# version -> the statements that take the schema from version - 1 to it.
MIGRATIONS: Mapping[int, tuple[str, ...]] = {
    1: (
        # bytea compares bytewise, as LMDB orders keys: scans by prefix and
        # `after` walk the primary key in the same order.
        """CREATE TABLE effectd_kv (
            tbl text NOT NULL,
            k bytea NOT NULL,
            v bytea NOT NULL,
            PRIMARY KEY (tbl, k)
        )""",
        """CREATE TABLE effectd_usage (
            namespace bytea NOT NULL,
            shard integer NOT NULL,
            open_calls bigint NOT NULL DEFAULT 0,
            stored_bytes bigint NOT NULL DEFAULT 0,
            tombstone_bytes bigint NOT NULL DEFAULT 0,
            PRIMARY KEY (namespace, shard)
        )""",
        "CREATE SEQUENCE effectd_incarnation",
        "CREATE SEQUENCE effectd_checkpoint_revision",
        # A new store's counters need no count from its records.
        "INSERT INTO effectd_kv (tbl, k, v) VALUES ('meta', %(counted)s, '\\x31')",
    ),
    # Only the version moves: no daemon of version 1 writes plan rows.
    2: ("DELETE FROM effectd_kv WHERE tbl = 'plan_rows'",),
    # The tables; their rows are copied by `upgrade.copy`.
    3: upgrade.CREATE,
}
_PARAMETERS = {"counted": usage.COUNTED_KEY}
# A new store's counters need no count from its records (version 3's
# table of the mark version 1 wrote).
_COUNTED: LiteralString = (
    "INSERT INTO effectd_meta (k, v) VALUES (%(counted)s, '\\x31')"
)


class SchemaError(FormatError):
    """The database holds no effectd schema, or one of another version."""


def _version(conn: psycopg.Connection[tuple[object, ...]]) -> tuple[int, int] | None:
    """The schema version and the version a migration to it started from and
    has not finished (0: none), or None when the database has none."""
    row = conn.execute("SELECT to_regclass('effectd_schema') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        return None
    found = conn.execute(
        "SELECT version, coalesce((to_jsonb(s) ->> 'migrating_from')::int, 0) "
        "FROM effectd_schema s"
    ).fetchone()
    return None if found is None else (int(str(found[0])), int(str(found[1])))


def _newer(found: int) -> SchemaError:
    return SchemaError(
        f"the database has effectd schema version {found}, newer than the "
        f"version {SCHEMA_VERSION} this effectd knows: upgrade effectd"
    )


def migrate(
    conn: psycopg.Connection[tuple[object, ...]],
    *,
    chunk: int = upgrade.CHUNK,
    on_chunk: Callable[[int], None] | None = None,
) -> tuple[int, int]:
    """Creates or upgrades the schema; returns the version found (0: none)
    and the version now. The steps to version 2 run in one transaction; the
    step to 3 marks the schema migrating (no daemon opens it), copies the
    rows `chunk` at a time (`on_chunk` is called with the rows copied after
    each chunk's commit), then drops the old table: run again after a crash,
    it copies again and finishes.

    Raises:
        SchemaError: the schema is newer than this effectd knows (nothing is
            changed).
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        conn.execute(_CREATE_VERSION)
        conn.execute(
            "ALTER TABLE effectd_schema ADD COLUMN IF NOT EXISTS migrating_from integer"
        )
        found, migrating = _version(conn) or (0, 0)
        if found > SCHEMA_VERSION:
            raise _newer(found)
        for version in range(found + 1, SCHEMA_VERSION + 1):
            if version == 3:
                upgrade.start(conn)
            for statement in MIGRATIONS[version]:
                params = _PARAMETERS if "%(" in statement else None
                conn.execute(statement, params)
        if found == 0:
            # A new database: version 2's table, renamed by the step to 3,
            # has nothing to copy but the counters' mark.
            upgrade.finish(conn)
            conn.execute(_COUNTED, _PARAMETERS)
        elif found == SCHEMA_VERSION and not migrating:
            # Left by an effectd that did not drop it when it created the
            # schema: empty of all but that mark.
            upgrade.finish(conn)
        if found < SCHEMA_VERSION:
            migrating = found
            conn.execute(
                "INSERT INTO effectd_schema (version, migrating_from) "
                "VALUES (%(v)s, %(m)s) ON CONFLICT (singleton) DO UPDATE SET "
                "version = %(v)s, migrating_from = %(m)s, migrated_at = now()",
                {"v": SCHEMA_VERSION, "m": migrating},
            )
    if migrating:
        upgrade.copy(conn, chunk=chunk, on_chunk=on_chunk)
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            upgrade.finish(conn)
            conn.execute("UPDATE effectd_schema SET migrating_from = NULL")
    return found, SCHEMA_VERSION


def migrate_url(url: str) -> tuple[int, int]:
    """`migrate` on a new connection to `url` (through a transaction pooler
    too: `connecting`)."""
    import psycopg  # noqa: PLC0415

    from sidecar.storage.postgres import connecting  # noqa: PLC0415

    target = connecting.parse(url)
    with psycopg.connect(
        target.conninfo,
        autocommit=False,
        connect_timeout=10,
        prepare_threshold=target.prepare_threshold,
    ) as conn:
        connecting.begin(conn, target.settings)
        return migrate(conn)


def check(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Refuses a database whose schema is missing, older or newer than
    `SCHEMA_VERSION`, each with what to do.

    Raises:
        SchemaError: the schema is not this effectd's.
    """
    version = _version(conn)
    if version is None:
        raise SchemaError(
            "the database has no effectd schema: create it with "
            "`effectd migrate --store URL`"
        )
    found, migrating = version
    if migrating and found == SCHEMA_VERSION:
        raise SchemaError(
            f"the database's migration from effectd schema version {migrating} "
            f"to {found} has not finished: finish it with "
            "`effectd migrate --store URL`"
        )
    if found > SCHEMA_VERSION:
        raise _newer(found)
    if found < SCHEMA_VERSION:
        raise SchemaError(
            f"the database has effectd schema version {found}, older than "
            f"version {SCHEMA_VERSION}: upgrade it with `effectd migrate --store URL`"
        )
