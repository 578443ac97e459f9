"""`effectd console`: the people's side of effectd, a small web application
for approvers and on-call operators (issue 16, docs/console.md).

A client of the daemon's gRPC API only, like `effectd ctl`: a person signs in
with their effectd token, every page is read through the same RPCs, and
every decision is the same RPC `effectd ctl` sends, with the same revision
compare-and-swap. It serves on a loopback address; any other address needs
TLS (`--tls-cert`, `--tls-key`), the same rule as the daemon's TCP listener,
and then only sessions signed in with a token.
"""

from __future__ import annotations

import argparse
import signal
import ssl
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from effectd_client import Connection
from sidecar.config import ConfigError, is_loopback, loopback_host, split_host_port
from sidecar.ctl.parser import default_target
from sidecar.web.app import Handler
from sidecar.web.listener import Listener
from sidecar.web.plumbing import Settings
from sidecar.web.sessions import Sessions

if TYPE_CHECKING:
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

DEFAULT_LISTEN = "127.0.0.1:8470"
DEFAULT_TIMEOUT_SECONDS = 10.0
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_IDLE_TIMEOUT_SECONDS = 10.0
DEFAULT_MAX_SESSIONS = 256


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    """What `effectd console` serves, and the daemon it talks to."""

    target: str
    listen: str = DEFAULT_LISTEN
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # Host names the console is also reached by (a reverse proxy's).
    hosts: tuple[str, ...] = ()
    daemon_tls_ca: Path | None = None
    timeout: float = DEFAULT_TIMEOUT_SECONDS
    # Connections served at once (each a thread), and how long each may
    # take for any one read or write; signed-in sessions kept at once.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT_SECONDS
    max_sessions: int = DEFAULT_MAX_SESSIONS

    def address(self) -> tuple[str, int]:
        """HOST and PORT to bind; a host other than loopback needs TLS."""
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError(("tls_cert", "tls_key"), "set both or neither")
        if self.tls_cert is None:
            return loopback_host(self.listen)
        return split_host_port("listen", self.listen)


class ConsoleServer:
    """The console serving in a thread of its own (`start`, `stop`)."""

    def __init__(self, config: ConsoleConfig) -> None:
        host, port = config.address()
        bare = host.strip("[]")
        roots = config.daemon_tls_ca.read_bytes() if config.daemon_tls_ca else None
        self.sessions = Sessions(max_sessions=config.max_sessions)

        class ConsoleHandler(Handler):
            pass

        handler = ConsoleHandler
        context = None
        if config.tls_cert is not None and config.tls_key is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(config.tls_cert, config.tls_key)
        self.httpd = Listener(
            (bare, port),
            handler,
            max_connections=config.max_connections,
            idle_timeout=config.idle_timeout,
            tls=context,
        )
        bound = self.httpd.server_address[1]
        hosts = {f"{host}:{bound}", *config.hosts}
        if is_loopback(host):
            hosts |= {f"localhost:{bound}", f"127.0.0.1:{bound}", f"[::1]:{bound}"}
        tls = context is not None

        def connect(token: str) -> Connection:
            return Connection(config.target, token=token, root_certificates=roots)

        handler.settings = Settings(
            connection=connect,
            timeout=config.timeout,
            hosts=frozenset(hosts),
            tls=tls,
            token_required=not is_loopback(host),
        )
        handler.sessions = self.sessions
        self.url = f"{'https' if tls else 'http'}://{host}:{bound}"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="effectd-console", daemon=True
        )

    def start(self) -> ConsoleServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=10)
        self.sessions.close_all()


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
