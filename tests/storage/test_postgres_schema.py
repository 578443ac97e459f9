"""Choosing the shared store and its schema: `effectd migrate --store URL`
creates and upgrades it, a daemon refuses a database without it or with a
newer one, and the URL's password never shows in what is printed."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from sidecar import settings
from sidecar.cli import main
from sidecar.config import ConfigError, ServeConfig, masked_url, url_password
from sidecar.observability.metrics import Metrics
from sidecar.storage import usage
from sidecar.storage.postgres import schema as pg_schema
from sidecar.stores import open_store
from tests.settings.support import layered
from tests.support import postgres


@pytest.fixture
def bare_url(pg_database: str) -> Iterator[str]:
    """A store URL whose schema nobody migrated yet."""
    with postgres.schema(pg_database, migrate=False) as url:
        yield url


@pytest.fixture(autouse=True)
def _no_store_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("EFFECTD_") and not name.startswith("EFFECTD_TEST_"):
            monkeypatch.delenv(name)


def test_migrate_creates_the_schema_once(
    bare_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first run creates version 3; a second finds it there and changes
    nothing."""
    assert main(["migrate", "--store", bare_url]) == 0
    assert "upgraded from schema version 0 to 3" in capsys.readouterr().out
    assert main(["migrate", "--store", bare_url]) == 0
    assert "is at schema version 3" in capsys.readouterr().out


def test_migrate_reads_the_url_from_the_environment(
    bare_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert main(["migrate"]) == 2
    assert "set --store or EFFECTD_STORE" in capsys.readouterr().err
    monkeypatch.setenv("EFFECTD_STORE", bare_url)
    assert main(["migrate"]) == 0


@pytest.mark.parametrize("init", [(), ("--init",)], ids=["", "init"])
def test_a_daemon_refuses_a_database_without_the_schema(
    bare_url: str,
    short_tmp: Path,
    capsys: pytest.CaptureFixture[str],
    init: tuple[str, ...],
) -> None:
    """Exit 2, naming the command that creates it; nothing is created, with
    --init too: a daemon never makes a database's schema (issue 25 item 2)."""
    argv = ["serve", "--data-dir", str(short_tmp / "d"), "--store", bare_url, *init]
    assert main(argv) == 2
    assert "effectd migrate --store URL" in capsys.readouterr().err
    with psycopg.connect(bare_url) as conn:
        row = conn.execute("SELECT to_regclass('effectd_calls')").fetchone()
    assert row == (None,)


def test_a_daemon_and_migrate_refuse_a_newer_schema(
    pg_url: str, short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A schema written by a newer effectd is neither served nor
    "upgraded" down."""
    with psycopg.connect(pg_url) as conn:
        conn.execute("UPDATE effectd_schema SET version = 99")
    argv = ["serve", "--data-dir", str(short_tmp / "d"), "--store", pg_url]
    assert main(argv) == 2
    assert "schema version 99, newer than the version 3" in capsys.readouterr().err
    assert main(["migrate", "--store", pg_url]) == 2
    assert "upgrade effectd" in capsys.readouterr().err
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT version FROM effectd_schema").fetchone() == (99,)


def test_an_older_schema_is_refused_until_migrated(pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        conn.execute("UPDATE effectd_schema SET version = 0")
        with pytest.raises(pg_schema.SchemaError, match="older than version 3"):
            pg_schema.check(conn)


def test_a_store_url_must_be_postgresql(short_tmp: Path) -> None:
    config = ServeConfig(data_dir=short_tmp, store="mysql://u:hunter22@db/x")
    with pytest.raises(ConfigError) as raised:
        config.validate()
    assert raised.value.setting == "store"
    assert "hunter22" not in str(raised.value)
    assert "mysql://u:***@db/x" in str(raised.value)


@pytest.mark.parametrize(
    ("url", "shown", "password"),
    [
        ("postgresql://db/x", "postgresql://db/x", None),
        ("postgresql://u@db/x", "postgresql://u@db/x", None),
        ("postgresql://u:s3cr%40t@db:5432/x", "postgresql://u:***@db:5432/x", "s3cr@t"),
        (
            "postgresql://u@db/x?sslmode=require&password=pw&application_name=a",
            "postgresql://u@db/x?sslmode=require&password=***&application_name=a",
            "pw",
        ),
    ],
)
def test_a_url_is_shown_with_its_password_masked(
    url: str, shown: str, password: str | None
) -> None:
    assert masked_url(url) == shown
    assert url_password(url) == password


def test_print_config_masks_the_store_password() -> None:
    """--print-config shows where the store is, never its password (and
    leaves the line commented: the file it makes holds no secret)."""
    resolved = layered((), {"EFFECTD_STORE": "postgresql://app:pw-1234@db/ledger"}, "")
    assert resolved.config.store == "postgresql://app:pw-1234@db/ledger"
    text = settings.render(resolved)
    assert "pw-1234" not in text
    assert '# store = "postgresql://app:***@db/ledger"' in text
    plain = layered(("--store", "postgresql://app@db/ledger"), {}, "")
    assert 'store = "postgresql://app@db/ledger"' in settings.render(plain)


def test_the_log_never_shows_the_store_password(
    short_tmp: Path, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon logs which store it opens, masked; a password it was
    given is masked in every later line."""
    with_password = pg_url.replace("://", "://root:not-a-real-password@", 1)
    config = ServeConfig(data_dir=short_tmp / "d", store=with_password)
    with caplog.at_level("INFO"):
        store = open_store(config, Metrics())
        store.close()
    lines = [r.getMessage() for r in caplog.records]
    opened = [line for line in lines if "shared store" in line]
    assert opened
    assert all("not-a-real-password" not in line for line in opened)
    assert any("root:***@" in line for line in opened)


def test_a_daemon_whose_database_is_unreachable_exits_2(
    short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing listens at the URL's port: the daemon says so and exits 2,
    once its pool gave up (5 s), without a traceback."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    url = f"postgresql://127.0.0.1:{port}/none?connect_timeout=1"
    argv = ["serve", "--data-dir", str(short_tmp / "d"), "--store", url]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "PostgreSQL is not reachable" in err
    assert "Traceback" not in err


def test_migrate_refuses_what_is_not_a_reachable_postgresql_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Another scheme exits 2 naming it; an unreachable server exits 1, the
    password masked in what is printed."""
    assert main(["migrate", "--store", "sqlite:///x.db"]) == 2
    assert "is not a postgresql:// URL" in capsys.readouterr().err
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    url = f"postgresql://u:hunter22@127.0.0.1:{port}/none?connect_timeout=1"
    assert main(["migrate", "--store", url]) == 1
    err = capsys.readouterr().err
    assert "u:***@127.0.0.1" in err
    assert "hunter22" not in err


def test_a_version_1_schema_migrates_to_3_and_an_older_daemon_refuses_it(
    bare_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store of version 1 (whose plan rows a later daemon must not trust)
    is upgraded through 2 to 3; a daemon of an earlier version then refuses
    it as newer."""
    with psycopg.connect(bare_url) as conn:
        conn.execute(pg_schema._CREATE_VERSION)
        for statement in pg_schema.MIGRATIONS[1]:
            conn.execute(
                statement, pg_schema._PARAMETERS if "%(" in statement else None
            )
        conn.execute(
            "INSERT INTO effectd_kv (tbl, k, v) VALUES ('plan_rows', 'ns', 'stale')"
        )
        conn.execute("INSERT INTO effectd_schema (version) VALUES (1)")
    assert main(["migrate", "--store", bare_url]) == 0
    assert "upgraded from schema version 1 to 3" in capsys.readouterr().out
    with psycopg.connect(bare_url) as conn:
        assert conn.execute("SELECT version FROM effectd_schema").fetchone() == (3,)
        assert conn.execute("SELECT count(*) FROM effectd_calls").fetchone() == (0,)
        monkeypatch.setattr(pg_schema, "SCHEMA_VERSION", 2)
        with pytest.raises(pg_schema.SchemaError, match="newer than the version 2"):
            pg_schema.check(conn)


_TABLES = (
    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
    "ORDER BY tablename"
)
_VERSION_3_TABLES = [
    "effectd_audit",
    "effectd_calls",
    "effectd_checkpoints",
    "effectd_daemons",
    "effectd_meta",
    "effectd_passes",
    "effectd_schema",
    "effectd_usage",
]


def test_a_new_database_holds_version_3s_tables_alone(bare_url: str) -> None:
    """Created from nothing, the schema passes through version 2's key-value
    table: none is left behind, and the new store's usage counters are
    marked counted (a first daemon has no records to count)."""
    assert pg_schema.migrate_url(bare_url) == (0, 3)
    with psycopg.connect(bare_url) as conn:
        assert [t for (t,) in conn.execute(_TABLES)] == _VERSION_3_TABLES
        assert conn.execute(
            "SELECT v FROM effectd_meta WHERE k = %s", (usage.COUNTED_KEY,)
        ).fetchone() == (b"1",)


def test_migrate_removes_the_empty_table_an_earlier_version_left(
    bare_url: str,
) -> None:
    """A database created by an effectd that left version 2's table behind
    (renamed, emptied of all but a marker) loses it at the next migrate."""
    pg_schema.migrate_url(bare_url)
    with psycopg.connect(bare_url) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS effectd_kv_2 (tbl text, k bytea, v bytea)"
        )
    assert pg_schema.migrate_url(bare_url) == (3, 3)
    with psycopg.connect(bare_url) as conn:
        assert [t for (t,) in conn.execute(_TABLES)] == _VERSION_3_TABLES
