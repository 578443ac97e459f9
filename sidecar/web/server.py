"""The console's server: what `effectd console` serves and the daemon it
talks to (`ConsoleConfig`), and the HTTP listener serving it in a thread of
its own (`ConsoleServer`), each signed-in person's pages read through a
client of their own (`sidecar.web.sessions`).
"""

from __future__ import annotations

import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

from effectd_client import Connection
from sidecar.config import ConfigError, is_loopback, loopback_host, split_host_port
from sidecar.web.app import Handler
from sidecar.web.listener import Listener
from sidecar.web.plumbing import Settings
from sidecar.web.sessions import Sessions

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
