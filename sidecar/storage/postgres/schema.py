"""The PostgreSQL store's schema: its version, the migrations that create and
upgrade it (`effectd migrate --store URL`), and the check a daemon makes at
open, which refuses a schema it does not know.

Every `api.Table` lives in one key-value table, `effectd_kv`, keyed by
(table name, key): a table added to the enum needs no migration. Beside it:
`effectd_usage`, the usage counters as rows sharded per writing connection
(`sidecar.storage.postgres.store`), summed on read; the sequence of daemon
incarnations (one per daemon that opens the store); and the sequence of
checkpoint revisions, which never gives a number twice, whatever is deleted.

Tables are created unqualified, in the first schema of the connection's
`search_path` (`?options=-csearch_path%3Dname` in the URL chooses another
than `public`). A migration runs in one transaction under an advisory lock,
so two `migrate` runs (two pods starting) apply it once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from sidecar.storage import usage
from sidecar.storage.api import FormatError

if TYPE_CHECKING:
    # Imported where a connection is made: a daemon of the LMDB store, and
    # its command line, load no PostgreSQL driver.
    import psycopg

# The version this effectd reads and writes; a daemon refuses any other.
# 2: plan rows (`storage.plan_rows`), which a daemon of version 1 would leave
# stale (a row would answer for an older record): it must not open the
# store. Records committed before have none and are recovered the long way.
SCHEMA_VERSION = 2
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
}
_PARAMETERS = {"counted": usage.COUNTED_KEY}


class SchemaError(FormatError):
    """The database holds no effectd schema, or one of another version."""


def _version(conn: psycopg.Connection[tuple[object, ...]]) -> int | None:
    """The schema version, or None when the database has none."""
    row = conn.execute("SELECT to_regclass('effectd_schema') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        return None
    found = conn.execute("SELECT version FROM effectd_schema").fetchone()
    return None if found is None else int(str(found[0]))


def _newer(found: int) -> SchemaError:
    return SchemaError(
        f"the database has effectd schema version {found}, newer than the "
        f"version {SCHEMA_VERSION} this effectd knows: upgrade effectd"
    )


def migrate(conn: psycopg.Connection[tuple[object, ...]]) -> tuple[int, int]:
    """Creates or upgrades the schema in one transaction; returns the version
    found (0: none) and the version now.

    Raises:
        SchemaError: the schema is newer than this effectd knows (nothing is
            changed).
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        conn.execute(_CREATE_VERSION)
        found = _version(conn) or 0
        if found > SCHEMA_VERSION:
            raise _newer(found)
        for version in range(found + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version]:
                params = _PARAMETERS if "%(" in statement else None
                conn.execute(statement, params)
        conn.execute(
            "INSERT INTO effectd_schema (version) VALUES (%(v)s) "
            "ON CONFLICT (singleton) DO UPDATE SET version = %(v)s, "
            "migrated_at = now()",
            {"v": SCHEMA_VERSION},
        )
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
    found = _version(conn)
    if found is None:
        raise SchemaError(
            "the database has no effectd schema: create it with "
            "`effectd migrate --store URL`"
        )
    if found > SCHEMA_VERSION:
        raise _newer(found)
    if found < SCHEMA_VERSION:
        raise SchemaError(
            f"the database has effectd schema version {found}, older than "
            f"version {SCHEMA_VERSION}: upgrade it with `effectd migrate --store URL`"
        )
