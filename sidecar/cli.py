"""The command line: `effectd serve` runs the daemon; `effectd ctl` talks to it."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from sidecar import __version__, ctl
from sidecar.config import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_MAP_SIZE,
    DEFAULT_RETENTION_INTERVAL_SECONDS,
    ConfigError,
    ServeConfig,
)
from sidecar.errors import EffectdError
from sidecar.ledger import policy_change
from sidecar.locking import AlreadyLocked
from sidecar.policy_file import PolicyError
from sidecar.provider.routes import ProvidersError
from sidecar.server import Daemon
from sidecar.storage.lmdb_store import StoreFormatError

log = logging.getLogger("effectd")


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="effectd", description="The effectd sidecar daemon."
    )
    p.add_argument("--version", action="version", version=f"effectd {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the daemon")
    s.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("EFFECTD_DATA_DIR", ".effectd")),
        help="LMDB data directory (default .effectd, env EFFECTD_DATA_DIR)",
    )
    s.add_argument(
        "--socket",
        type=Path,
        default=None,
        help="Unix socket path (default DATA_DIR/effectd.sock)",
    )
    s.add_argument(
        "--listen",
        default=None,
        metavar="HOST:PORT",
        help="also listen on a loopback TCP address, e.g. 127.0.0.1:50051",
    )
    s.add_argument(
        "--map-size",
        type=_size,
        default=DEFAULT_MAP_SIZE,
        help="LMDB map size, e.g. 8GiB (address space; the file grows as needed)",
    )
    s.add_argument(
        "--no-sync",
        action="store_true",
        help="skip fsync: survives a process crash, not a power loss",
    )
    s.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE_SECONDS,
        help="seconds in-flight calls may take to finish at shutdown",
    )
    s.add_argument(
        "--no-reflection", action="store_true", help="do not serve gRPC reflection"
    )
    s.add_argument(
        "--policy",
        type=Path,
        default=None,
        metavar="FILE",
        help="TOML policy file (retries, leases, retention, forced effects); "
        "reloaded on SIGHUP",
    )
    s.add_argument(
        "--providers",
        type=Path,
        default=None,
        metavar="FILE",
        help="TOML file of provider routes (base URL, credential, headers) that "
        "ProviderCall / ProviderStream may reach; none: no route",
    )
    s.add_argument(
        "--retention-interval",
        type=float,
        default=DEFAULT_RETENTION_INTERVAL_SECONDS,
        metavar="SECONDS",
        help="seconds between passes that compact acknowledged calls older than "
        "the retention window to tombstones (default %(default)s)",
    )
    ctl.add_parser(sub)
    return p


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


async def _serve(config: ServeConfig, daemon_class: type[Daemon]) -> None:
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
    print(
        f"effectd {__version__} ready on {endpoints.unix}"
        + (f" and {endpoints.tcp}" if endpoints.tcp else ""),
        file=sys.stderr,
        flush=True,
    )
    await stop.wait()
    log.info("shutting down")
    await daemon.stop()


def main(
    argv: Sequence[str] | None = None, *, daemon_class: type[Daemon] = Daemon
) -> int:
    args = parser().parse_args(argv)
    if args.command == "ctl":
        return ctl.run(args)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Everything the daemon creates (data files, socket, locks) is private.
    os.umask(0o077)
    config = ServeConfig(
        data_dir=args.data_dir,
        socket=args.socket,
        listen=args.listen,
        map_size=args.map_size,
        sync=not args.no_sync,
        grace_seconds=args.grace,
        reflection=not args.no_reflection,
        policy_file=args.policy,
        providers_file=args.providers,
        retention_interval_seconds=args.retention_interval,
    )
    try:
        asyncio.run(_serve(config, daemon_class))
    except (
        ConfigError,
        PolicyError,
        ProvidersError,
        AlreadyLocked,
        StoreFormatError,
    ) as exc:
        print(f"effectd: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
