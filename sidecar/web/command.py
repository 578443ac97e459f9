"""`effectd console` on the command line: its arguments (`add_parser`) and
the command that serves until SIGTERM or SIGINT (`run`)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from sidecar.config import ConfigError
from sidecar.ctl.parser import default_target
from sidecar.web.server import (
    DEFAULT_IDLE_TIMEOUT_SECONDS,
    DEFAULT_LISTEN,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_TIMEOUT_SECONDS,
    ConsoleConfig,
    ConsoleServer,
)

if TYPE_CHECKING:
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """Adds `console` to the `effectd` subparsers."""
    p = sub.add_parser(
        "console",
        help="serve the web console for approvers and operators",
        description="Serves a web page where a person signs in with their "
        "effectd token to approve or reject calls, reconcile unknown outcomes, "
        "see a run's recovery plan and the audit log. A client of the daemon "
        "like `effectd ctl`: it never opens the store. Loopback only, unless "
        "--tls-cert and --tls-key are given.",
        allow_abbrev=False,
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--socket",
        type=Path,
        default=None,
        metavar="PATH",
        help="the daemon's Unix socket (default as `effectd ctl`)",
    )
    where.add_argument(
        "--target", default=None, help="a gRPC target instead: unix:PATH or HOST:PORT"
    )
    p.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help="where the console serves (default %(default)s; port 0 picks one)",
    )
    p.add_argument(
        "--tls-cert",
        type=Path,
        default=None,
        metavar="FILE",
        help="TLS: the console's PEM certificate chain",
    )
    p.add_argument(
        "--tls-key",
        type=Path,
        default=None,
        metavar="FILE",
        help="TLS: the PEM key of --tls-cert",
    )
    p.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="another Host the console is reached by, such as a "
        "reverse proxy's (repeatable)",
    )
    p.add_argument(
        "--daemon-tls-ca",
        type=Path,
        default=None,
        metavar="FILE",
        help="TLS to the daemon: PEM roots that verify its certificate",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="deadline of each RPC (default %(default)s)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help="connections served at once; more are answered 503 (default %(default)s)",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="a connection that sends or reads nothing this long is closed "
        "(default %(default)s)",
    )
    p.add_argument(
        "--max-sessions",
        type=int,
        default=DEFAULT_MAX_SESSIONS,
        metavar="N",
        help="people signed in at once; a new sign-in ends the session used "
        "least recently (default %(default)s)",
    )
    return p


def run(args: argparse.Namespace) -> int:
    """`effectd console`: serves until SIGTERM or SIGINT; exit 0, or 2 for
    an address it may not serve."""
    target = args.target or (
        f"unix:{args.socket}" if args.socket is not None else default_target()
    )
    config = ConsoleConfig(
        target=target,
        listen=args.listen,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        hosts=tuple(args.host),
        daemon_tls_ca=args.daemon_tls_ca,
        timeout=args.timeout,
        max_connections=args.max_connections,
        idle_timeout=args.idle_timeout,
        max_sessions=args.max_sessions,
    )
    try:
        server = ConsoleServer(config)
    except ConfigError as exc:
        print(f"effectd console: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"effectd console: {args.listen}: {exc.strerror}", file=sys.stderr)
        return 2
    print(
        f"effectd console serving on {server.url} for {target}",
        file=sys.stderr,
        flush=True,
    )

    def stop(*_: object) -> None:
        # shutdown() waits for serve_forever(), which runs in this thread.
        threading.Thread(target=server.httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
        server.sessions.close_all()
    return 0
