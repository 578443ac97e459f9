"""The command line: `effectd serve` runs the daemon; `effectd ctl` talks to it."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from sidecar import __version__, ctl, failpoints, settings, web
from sidecar.config import (
    ConfigError,
    ServeConfig,
    masked_url,
    url_password,
    validate_store_url,
)
from sidecar.ctl import restore as offline_restore
from sidecar.errors import EffectdError, StorageUnavailable
from sidecar.ledger import policy_change
from sidecar.locking import AlreadyLocked
from sidecar.observability import logs
from sidecar.policy_file import PolicyError
from sidecar.provider.routes import ProvidersError
from sidecar.server import Daemon
from sidecar.storage import backends
from sidecar.storage.api import FormatError
from sidecar.storage.marking import UnfinishedRestore

log = logging.getLogger("effectd")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="effectd", description="The effectd sidecar daemon."
    )
    p.add_argument("--version", action="version", version=f"effectd {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    # No abbreviated flags: `--tokens` must not silently mean --tokens-file,
    # and a new flag must not change what an old abbreviation meant.
    s = sub.add_parser(
        "serve", help="run the daemon", epilog=settings.EPILOG, allow_abbrev=False
    )
    settings.add_arguments(s)
    m = sub.add_parser(
        "migrate",
        help="create or upgrade the schema of a shared (PostgreSQL) store",
        allow_abbrev=False,
    )
    m.add_argument(
        "--store",
        metavar="URL",
        help="postgresql://USER@HOST/DB (default: $EFFECTD_STORE)",
    )
    ctl.add_parser(sub)
    web.add_parser(sub)
    return p


def _migrate(url: str | None) -> int:
    """`effectd migrate`: the schema created or upgraded, or why not."""
    url = url or os.environ.get("EFFECTD_STORE")
    if not url:
        print("effectd migrate: set --store or EFFECTD_STORE", file=sys.stderr)
        return 2
    try:
        validate_store_url(url)
        backend = backends.of_url(url)
        assert backend is not None  # validated
        found, now = backend.entry().migrate(url)
    except (ConfigError, FormatError) as exc:
        print(f"effectd migrate: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the driver's errors: unreachable, refused
        print(f"effectd migrate: {masked_url(url)}: {exc}", file=sys.stderr)
        return 1
    if found == now:
        print(f"effectd migrate: {masked_url(url)} is at schema version {now}")
    else:
        print(
            f"effectd migrate: {masked_url(url)} upgraded from schema version "
            f"{found} to {now}"
        )
    return 0


async def _reload_on_sighup(daemon: Daemon) -> None:
    try:
        done = await daemon.reload_policy(policy_change.SIGHUP, "SIGHUP")
    except EffectdError as exc:
        log.error("policy reload refused (%s): %s", exc.reason, exc.message)
        return
    except Exception:
        # A signal handler has no caller to answer: log, keep serving.
        log.exception("policy reload failed; the policy in force stays")
        return
    log.info(
        "policy reloaded from %s (audit entry %d); changed: %s",
        done.source,
        done.entry.sequence,
        ", ".join(done.changed) or "nothing",
    )


async def _serve(
    config: ServeConfig, daemon_class: type[Daemon], *, freeze: bool = False
) -> None:
    daemon = daemon_class(config)
    loop = asyncio.get_running_loop()
    reloads: set[asyncio.Task[None]] = set()

    def reload() -> None:
        task = loop.create_task(_reload_on_sighup(daemon))
        # The loop keeps only a weak reference to a task.
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    # Before start: SIGHUP's default action would end the daemon.
    loop.add_signal_handler(signal.SIGHUP, reload)
    endpoints = await daemon.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if freeze:
        _freeze_startup_objects()
    print(
        f"effectd {__version__} ready on {endpoints.unix}"
        + (f" and {endpoints.tcp}" if endpoints.tcp else ""),
        file=sys.stderr,
        flush=True,
    )
    await stop.wait()
    log.info("shutting down")
    await daemon.stop()


def _ctl(args: argparse.Namespace) -> int:
    # `ctl restore --store` works on the database, offline; the others talk
    # to a daemon (or, `ctl restore --data-dir`, to its files).
    if getattr(args, "store", None) is not None:
        return _mark_restored(args)
    return ctl.run(args)


def _mark_restored(args: argparse.Namespace) -> int:
    """`effectd ctl restore NAME --store URL`: the URL checked and masked by
    the configuration's rules, as `effectd migrate` does, before the marking
    (`sidecar.ctl.restore`)."""
    url = args.store
    try:
        validate_store_url(url)
    except ConfigError as exc:
        print(f"effectd ctl restore: {exc}", file=sys.stderr)
        return 2
    return offline_restore.run_database(
        args, shown=masked_url(url), password=url_password(url)
    )


def main(
    argv: Sequence[str] | None = None,
    *,
    daemon_class: type[Daemon] = Daemon,
    test_build: bool = False,
) -> int:
    """The program; `test_build`: a test build's daemon, which may arm
    failpoints (`sidecar.failpoints`); the shipped program is not one."""
    args = parser().parse_args(argv)
    # The daemon's clients: `effectd ctl` and `effectd console`.
    client = {"ctl": _ctl, "console": web.run}.get(args.command)
    if client is not None:
        return client(args)
    if args.command == "migrate":
        return _migrate(args.store)
    if os.environ.get(failpoints.ENV) and not test_build:
        print(
            f"effectd: {failpoints.ENV} is set, but failpoints crash the daemon "
            "on purpose and only a test build arms them; unset it",
            file=sys.stderr,
        )
        return 2
    try:
        resolved = settings.load(args, os.environ)
    except ConfigError as exc:
        print(f"effectd: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        for warning in resolved.warnings:
            print(f"effectd: warning: {warning}", file=sys.stderr)
        sys.stdout.write(settings.render(resolved))
        return 0
    # As the program (not called in-process with arguments, as tests do),
    # the daemon owns the process's stderr, native writes included.
    with _logging(resolved.config, native_stderr=argv is None):
        for warning in resolved.warnings:
            log.warning("%s", warning)
        return _run(resolved, daemon_class, freeze=argv is None)


@contextmanager
def _logging(config: ServeConfig, *, native_stderr: bool) -> Iterator[None]:
    """The daemon's log output while it runs. Undone on return, because
    tests call `main` in-process: a handler left on the root logger would
    keep writing to a captured stream that is closed after the test.
    `native_stderr`: also log what native code (gRPC's C core) writes to
    descriptor 2, and Python warnings, as the daemon's own lines."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    native = logs.NativeStderr() if native_stderr else None
    stream = native.start() if native is not None else None
    logs.configure(config.log_format, config.log_level, stream)
    logging.captureWarnings(native_stderr)
    try:
        yield
    finally:
        if native is not None:
            # Before the handler goes: the last native lines still log.
            native.stop()
        logging.captureWarnings(False)
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
            handler.close()
        root.setLevel(level)
        if native is not None:
            native.close()


def _freeze_startup_objects() -> None:
    """Keeps what start-up made (modules, the servicers, gRPC's and
    Prometheus' objects: some 45,000) out of the cyclic garbage collector's
    full passes. A full pass walked them all, 20-120 ms with the event loop
    stopped, the worst latency a message saw under load; after the freeze
    it walks only what the daemon made since. Only as the program: tests
    that run daemons in their own process keep their collector as it is."""
    gc.collect()
    gc.freeze()


def _run(
    resolved: settings.Resolved, daemon_class: type[Daemon], *, freeze: bool = False
) -> int:
    # Everything the daemon creates (data files, socket, locks) is private.
    os.umask(0o077)
    try:
        asyncio.run(_serve(resolved.config, daemon_class, freeze=freeze))
    except ConfigError as exc:
        # Raised while starting (a tokens file, a certificate): named as the
        # user wrote the setting that points at it.
        print(f"effectd: {settings.label(exc, resolved.sources)}", file=sys.stderr)
        return 2
    except (
        PolicyError,
        ProvidersError,
        AlreadyLocked,
        FormatError,
        StorageUnavailable,
        UnfinishedRestore,
    ) as exc:
        print(f"effectd: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
