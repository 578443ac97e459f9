"""The PostgreSQL the tests run against: one database per test process,
created from the server's `test` database and dropped at the end, and one
schema per test in it, created by `effectd migrate` (`pg_schema.migrate`),
so tests and parallel test processes never see each other's rows.

`EFFECTD_TEST_POSTGRES` names the server (default
postgresql://127.0.0.1:5432/test). A server that cannot be reached fails
the tests that need it: they are never skipped.
"""

from __future__ import annotations

import os
import secrets
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest

from sidecar.config import ServeConfig
from sidecar.storage.api import ReadView, Store, Table, WriteView
from sidecar.storage.lmdb.store import LmdbStore
from sidecar.storage.postgres import schema as pg_schema
from sidecar.storage.postgres.options import PostgresOptions
from sidecar.storage.postgres.store import PostgresStore

SERVER_URL = os.environ.get("EFFECTD_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test")
# What `config` and `store` fixtures serve: "lmdb" unless the environment
# says "postgres" (the whole suite on the shared store).
DEFAULT_STORE = os.environ.get("EFFECTD_TEST_STORE", "lmdb")
BOTH = ("lmdb", "postgres")
# The stores, and the PostgreSQL store through PgBouncer (`tests.support.pgbouncer`).
WITH_BOUNCER = (*BOTH, "pgbouncer")
# How a test of the PostgreSQL store reaches it (the `pg_path` fixture).
PATHS = ("direct", "pgbouncer")


def _with_database(url: str, database: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + database))


def with_schema(url: str, schema: str) -> str:
    """`url` whose connections put their tables in `schema`."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query)
    query.append(("options", f"-csearch_path={schema}"))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def admin() -> psycopg.Connection[tuple[object, ...]]:
    """An autocommit connection to the server's own database."""
    try:
        return psycopg.connect(SERVER_URL, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL at {SERVER_URL} is not reachable ({exc}); the tests of "
            "the shared store need it (set EFFECTD_TEST_POSTGRES)"
        )


@contextmanager
def database() -> Iterator[str]:
    """A new database, dropped at exit; yields its URL."""
    name = f"effectd_test_{os.getpid()}_{secrets.token_hex(4)}"
    with admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(SERVER_URL, name)
    finally:
        with admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def schema(database_url: str, *, migrate: bool = True) -> Iterator[str]:
    """A new schema in the database of `database_url` (created by the
    migrations unless `migrate` is false); yields the store URL."""
    name = f"s_{secrets.token_hex(6)}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    url = with_schema(database_url, name)
    try:
        if migrate:
            pg_schema.migrate_url(url)
        yield url
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")


def terminate(application_name: str, database_url: str) -> int:
    """Ends, as an administrator would (`pg_terminate_backend`), every
    connection to the database whose application name starts with
    `application_name`; returns how many."""
    db = urllib.parse.urlsplit(database_url).path.lstrip("/")
    with admin() as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE starts_with(application_name, %s) AND datname = %s "
            "AND pid <> pg_backend_pid()",
            (application_name, db),
        ).fetchall()
    return len(rows)


def store_of(config: ServeConfig) -> Store:
    """The store a stopped daemon of `config` served, opened again: its
    data directory's LMDB, or the shared store its URL names."""
    if config.store is None:
        return LmdbStore(config.data_dir)
    return PostgresStore(config.store, PostgresOptions())


@pytest.fixture(params=BOTH, name="store_kind")
def both_stores(request: pytest.FixtureRequest) -> str:
    """`store_kind` for a module whose tests run on each store: imported
    into it, it overrides the conftest's."""
    return str(request.param)


def put_checkpoint(key: bytes) -> Callable[[WriteView], bytes]:
    """A store's write function: the checkpoint `key` of namespace "ns" set
    to b"v"; returns `key`."""

    def fn(view: WriteView) -> bytes:
        view.put(Table.CHECKPOINTS, b"ns\x00" + key, b"v")
        return key

    return fn


def get_checkpoint(key: bytes) -> Callable[[ReadView], bytes | None]:
    """A store's read function: the checkpoint `key` of namespace "ns"."""
    return lambda view: view.get(Table.CHECKPOINTS, b"ns\x00" + key)
