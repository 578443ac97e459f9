"""How the PostgreSQL store reaches its database: the store URL read once,
and the connection pooler (PgBouncer) that may stand between them.

The URL is libpq's, with parameters of effectd's own removed before libpq
sees them: the pool sizes (`POOLS`: `writers`, `readers`, `max_batch`, each
a whole number in its range, overriding `PostgresOptions`), and `pooler`:

- `pooler=none` (the default): the daemon talks to PostgreSQL itself.
  Settings are made once per connection; psycopg prepares statements a
  connection runs often.
- `pooler=session`: the same, through a pooler in session mode (said, so
  that the daemon does not refuse it: see below).
- `pooler=transaction`: a pooler in transaction mode (PgBouncer's
  `pool_mode = transaction`) lends a server connection for one transaction
  only, so nothing may outlive a transaction: psycopg's server-side
  prepared statements are off (PgBouncer 1.18 does not carry them across
  server connections), no startup `options` are sent (PgBouncer refuses
  them), and every setting (the store's own, and each `-c name=value` of
  the URL's `options`, such as `search_path`) is made at the start of each
  transaction, in the round trip of its BEGIN.

A daemon given `pooler=none` that finds itself behind a pooler (the backend
the server names is not the one the connection was told of) refuses to
start, naming the parameter: a transaction pooler would hand its prepared
statements and settings to other clients.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, LiteralString

from sidecar.storage.api import FormatError

if TYPE_CHECKING:
    import psycopg

POOLER = "pooler"
POOLERS = ("none", "session", "transaction")
# The pool sizes a URL may set, and the range of each.
POOLS = {"writers": (1, 16), "readers": (1, 64), "max_batch": (1, 1024)}
# psycopg's default: a statement run this often on a connection is prepared.
PREPARE_THRESHOLD = 5

Setting = tuple[str, str]


class PoolerError(FormatError):
    """The store URL's `pooler` does not fit the way the database is reached."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where the store connects (`conninfo`, for libpq) and how."""

    conninfo: str
    pooler: str = "none"
    # The URL's `-c name=value` options, made per transaction behind a
    # transaction pooler (sent at connection start otherwise, in `conninfo`).
    settings: tuple[Setting, ...] = ()
    # psycopg's `prepare_threshold`: None (never prepare) behind a
    # transaction pooler.
    prepare_threshold: int | None = PREPARE_THRESHOLD
    # The URL's pool sizes (`POOLS`); None: not in the URL.
    writers: int | None = None
    readers: int | None = None
    max_batch: int | None = None

    @property
    def per_transaction(self) -> bool:
        """Nothing may outlive a transaction: settings are made in each."""
        return self.pooler == "transaction"


def _options(options: str) -> tuple[Setting, ...]:
    """The `-c name=value` (or `--name=value`) settings of libpq's
    `options`; anything else is refused."""
    settings: list[Setting] = []
    words = options.split()
    index = 0
    while index < len(words):
        word = words[index]
        if word == "-c" and index + 1 < len(words):
            index += 1
            word = words[index]
        elif word.startswith("-c") or word.startswith("--"):
            word = word[2:]
        else:
            word = ""
        name, equals, value = word.partition("=")
        if not name or not equals:
            raise PoolerError(
                f"the store URL's options {options!r} cannot be made per "
                "transaction: only `-c name=value` settings can (pooler=transaction)"
            )
        settings.append((name.replace("-", "_"), value))
        index += 1
    return tuple(settings)


def _pools(query: Sequence[tuple[str, str]]) -> dict[str, int]:
    """The pool sizes of the URL's query (the last of a repeated one)."""
    pools: dict[str, int] = {}
    for key, value in query:
        if key not in POOLS:
            continue
        low, high = POOLS[key]
        if not (value.isascii() and value.isdigit() and low <= int(value) <= high):
            raise PoolerError(
                f"the store URL's {key}={value!r} is not a whole number from "
                f"{low} to {high}"
            )
        pools[key] = int(value)
    return pools


def parse(url: str) -> Target:
    """The `Target` of a store URL.

    Raises:
        PoolerError: `pooler` is not one of `POOLERS`, a pool size is out of
            its range (`POOLS`), or the URL's `options` cannot be made per
            transaction.
    """
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    poolers = [value for key, value in query if key == POOLER]
    pooler = poolers[-1] if poolers else "none"
    if pooler not in POOLERS:
        raise PoolerError(
            f"the store URL's {POOLER}={pooler!r} is not one of " + ", ".join(POOLERS)
        )
    pools = _pools(query)
    kept = [(key, value) for key, value in query if key != POOLER and key not in POOLS]
    settings: tuple[Setting, ...] = ()
    if pooler == "transaction":
        for key, value in kept:
            if key == "options":
                settings += _options(value)
        kept = [(key, value) for key, value in kept if key != "options"]
    conninfo = urllib.parse.urlunsplit(
        parts._replace(query=urllib.parse.urlencode(kept))
    )
    return Target(
        conninfo=conninfo,
        pooler=pooler,
        settings=settings,
        prepare_threshold=None if pooler == "transaction" else PREPARE_THRESHOLD,
        writers=pools.get("writers"),
        readers=pools.get("readers"),
        max_batch=pools.get("max_batch"),
    )


def setting_statement(
    settings: Sequence[Setting],
) -> tuple[LiteralString, tuple[object, ...]] | None:
    """The statement that makes `settings` for the transaction it runs in
    alone (`set_config(..., true)`); None: no settings."""
    if not settings:
        return None
    calls: LiteralString = ", ".join("set_config(%s, %s, true)" for _ in settings)
    params = tuple(part for setting in settings for part in setting)
    return "SELECT " + calls, params


def begin(
    conn: psycopg.Connection[tuple[object, ...]], settings: Sequence[Setting]
) -> None:
    """Starts a transaction on `conn` (not in autocommit mode) with
    `settings` made for it alone."""
    made = setting_statement(settings)
    if made is not None:
        conn.execute(*made)


def check_direct(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Refuses a connection made with `pooler=none` that a pooler serves:
    the server's backend is not the one the connection was told of at its
    start (a pooler answers the start itself).

    Raises:
        PoolerError: a pooler stands between the store and its database.
    """
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    if row is None or int(str(row[0])) == conn.info.backend_pid:
        return
    raise PoolerError(
        "the store is reached through a connection pooler (the server's "
        f"backend {row[0]} is not the connection's {conn.info.backend_pid}): "
        f"behind PgBouncer in transaction mode add `{POOLER}=transaction` to the "
        "store URL (server-side prepared statements off, settings made per "
        f"transaction), in session mode `{POOLER}=session`; see docs/operations.md"
    )
