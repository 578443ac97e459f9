"""Databases of a benchmark's own on a PostgreSQL server, dropped after."""

from __future__ import annotations

import secrets
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


def url_of(server: str, database: str) -> str:
    """The URL of `database` on the server of `server` (a URL)."""
    parts = urllib.parse.urlsplit(server)
    return urllib.parse.urlunsplit(parts._replace(path="/" + database))


@contextmanager
def scratch(server: str, prefix: str) -> Iterator[str]:
    """A new database on `server` named `prefix` and a random suffix,
    dropped at exit with its sessions ended; yields its name."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
