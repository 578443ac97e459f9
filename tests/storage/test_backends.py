"""The registry of store backends (`storage.backends`): which `--store` URLs
open which backend, and that each backend's entry opens its store."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path

import pytest

from sidecar.config import ConfigError, validate_store_url
from sidecar.ledger.model import Outcome, Result, State
from sidecar.rpc import summaries
from sidecar.storage import backends
from sidecar.storage.api import CallWrite, Table
from sidecar.storage.keys import call_key
from sidecar.storage.lmdb.store import LmdbStore
from sidecar.storage.postgres.store import PostgresStore
from tests.storage.random_calls import random_call


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("postgresql://u@h/db", "postgresql"),
        ("POSTGRES://h/db", "postgresql"),
        ("mysql://h/db", None),
        ("/var/lib/effectd", None),
        ("", None),
    ],
)
def test_a_url_opens_the_backend_of_its_scheme(url: str, name: str | None) -> None:
    found = backends.of_url(url)
    assert (None if found is None else found.name) == name


def test_the_configuration_refuses_a_url_no_backend_takes() -> None:
    validate_store_url("postgresql://h/db")
    with pytest.raises(ConfigError, match="not a postgresql:// URL"):
        validate_store_url("redis://h/0")


def test_every_backend_has_a_unique_name_and_its_own_schemes() -> None:
    names = [b.name for b in backends.BACKENDS]
    assert len(set(names)) == len(names)
    assert len(set(backends.SCHEMES)) == len(backends.SCHEMES)
    assert backends.DEFAULT.schemes == ()


def test_each_entry_opens_its_store(tmp_path: Path, pg_url: str) -> None:
    """The default backend opens a data directory, PostgreSQL a URL."""
    lmdb = backends.DEFAULT.entry().open(str(tmp_path / "data"), backends.Opening())
    try:
        assert isinstance(lmdb, LmdbStore)
    finally:
        lmdb.close()
    backend = backends.of_url(pg_url)
    assert backend is not None
    pg = backend.entry().open(pg_url, backends.Opening())
    try:
        assert isinstance(pg, PostgresStore)
    finally:
        pg.close()


def test_the_shared_store_writes_no_plan_rows(pg_url: str) -> None:
    """PostgreSQL is opened without the daemon's `summarize`: a committed
    record's row holds its document alone, which Recover decodes."""
    backend = backends.of_url(pg_url)
    assert backend is not None
    opening = backends.Opening(summarize=summaries.summarize)
    store = backend.entry().open(pg_url, opening)
    try:
        started = dataclasses.replace(
            random_call(random.Random(1), "c", state=State.PREPARED)  # noqa: S311, revision=1
        )
        result = Result(Outcome.OK, None, "", "done", "sha256:" + "ab" * 32)
        committed = dataclasses.replace(
            started, state=State.COMMITTED, revision=2, result=result
        )
        asyncio.run(store.save_call(CallWrite(None, started)))
        asyncio.run(store.save_call(CallWrite(started, committed)))
        assert store.read(lambda v: v.get(Table.CALLS, call_key(committed.ref)))
        assert (
            store.read(lambda v: v.get(Table.PLAN_ROWS, call_key(committed.ref)))
            is None
        )
    finally:
        store.close()
