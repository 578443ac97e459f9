"""The store a daemon serves, opened from its configuration: the LMDB ledger
of its data directory, created only when the configuration asks for a new
one (`init`; `storage.lmdb.ledger_files` says what counts as one), or the shared
PostgreSQL store, whose schema only `effectd migrate` creates. Whatever about
the data directory keeps it from being opened is a `ConfigError` naming it.
"""

from __future__ import annotations

import logging

import lmdb

from sidecar.config import ConfigError, ServeConfig, masked_url, url_password
from sidecar.directories import refuse_unsafe_directory
from sidecar.failpoints import Failpoints
from sidecar.observability import logs
from sidecar.observability.metrics import Metrics
from sidecar.storage import backends, marking
from sidecar.storage.api import Store
from sidecar.storage.backends import Opening
from sidecar.storage.lmdb import ledger_files, restore
from sidecar.storage.lmdb.ledger_files import Found
from sidecar.storage.plan_rows import Summarize

log = logging.getLogger(__name__)


def open_store(
    cfg: ServeConfig,
    metrics: Metrics,
    failpoints: Failpoints | None = None,
    summarize: Summarize | None = None,
) -> Store:
    """The store of `cfg.data_dir`, or the shared store `cfg.store` names (its
    backend found in `storage.backends`), its commits counted by `metrics`,
    crashing at `failpoints` (a test build's), its plan rows made by
    `summarize` (`storage.plan_rows`); the caller holds the socket lock (the
    LMDB store takes the data directory's)."""
    opening = Opening(
        on_commit=metrics.commit_observed,
        failpoints=failpoints,
        summarize=summarize,
        sync=cfg.sync,
        map_size=cfg.map_size,
    )
    if cfg.store is not None:
        backend = backends.of_url(cfg.store)
        if backend is None:  # refused by the configuration before
            raise ConfigError("store", "no store backend takes this URL")
        password = url_password(cfg.store)
        if password:
            logs.add_secrets([password])
        log.info("opening the shared store %s", masked_url(cfg.store))
        return backend.entry().open(cfg.store, opening)
    refuse_unsafe_directory(cfg.data_dir, "data-dir", sticky_ok=False)
    creates = ledger_to_create(cfg)
    if not cfg.sync:
        log.warning(
            "sync is off (--no-sync): an answer can leave before its write "
            "is on disk, so after a power loss a call answered STARTED can "
            "be answered EXECUTE again and its side effect run twice"
        )
    try:
        store = backends.DEFAULT.entry().open(str(cfg.data_dir), opening)
    except (OSError, lmdb.Error) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(
            "data_dir", f"{cfg.data_dir} cannot be opened: {why}"
        ) from None
    if creates:
        log.warning("created a new, empty ledger at %s", cfg.data_dir.absolute())
    return store


def ledger_to_create(cfg: ServeConfig) -> bool:
    """Whether serving `cfg` creates a new LMDB ledger: it is asked to
    (`init`) and the data directory holds none. Creates nothing.

    Raises:
        ConfigError: the data directory holds no ledger and `init` is off, or
            cannot hold one, or a restore into it did not finish.
    """
    if cfg.store is not None:
        return False
    path = cfg.data_dir
    try:
        restore.refuse_unfinished(path)
        found = ledger_files.inspect(path)
    except marking.UnfinishedRestore as exc:
        raise ConfigError("data_dir", str(exc)) from None
    except OSError as exc:
        raise ConfigError("data_dir", f"{path}: {exc.strerror}") from None
    if found is Found.LEDGER:
        return False
    if found in ledger_files.CREATABLE and cfg.init:
        return True
    why = ledger_files.why_not(path, found)
    if found in ledger_files.CREATABLE:
        why += (
            ": pass --init to create a new, empty ledger there; to serve an "
            "existing ledger, name its directory"
        )
    raise ConfigError("data_dir", why)
