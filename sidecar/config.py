"""The daemon's configuration: one frozen value, built by the CLI."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.ledger.validation import Limits

# sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107
DEFAULT_MAP_SIZE = 8 << 30
DEFAULT_GRACE_SECONDS = 5.0
DEFAULT_RETENTION_INTERVAL_SECONDS = 600.0


class ConfigError(ValueError):
    """An invalid setting; the message names it."""


@dataclass(frozen=True, slots=True)
class ServeConfig:
    data_dir: Path = Path(".effectd")
    # Default: effectd.sock in the data directory.
    socket: Path | None = None
    # "127.0.0.1:PORT" or "[::1]:PORT"; port 0 picks a free port.
    listen: str | None = None
    map_size: int = DEFAULT_MAP_SIZE
    # fsync on every commit; off survives a process crash but not power loss.
    sync: bool = True
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    max_message_bytes: int = 8 << 20
    reflection: bool = True
    # A TOML policy file (see sidecar.policy_file); None: the default policy.
    policy_file: Path | None = None
    # A TOML file of provider routes (see sidecar.provider.routes); None: the
    # Provider service reaches no upstream.
    providers_file: Path | None = None
    # Seconds between compaction passes of the retention window (DESIGN §4);
    # the first pass runs at start.
    retention_interval_seconds: float = DEFAULT_RETENTION_INTERVAL_SECONDS
    limits: Limits = field(default_factory=Limits)

    @property
    def socket_path(self) -> Path:
        return (
            self.socket if self.socket is not None else self.data_dir / "effectd.sock"
        )

    def validate(self) -> None:
        path = str(self.socket_path)
        if len(path.encode()) > MAX_SOCKET_PATH:
            raise ConfigError(
                f"socket: the path {path!r} is longer than {MAX_SOCKET_PATH} bytes; "
                "choose a shorter --socket or --data-dir"
            )
        if self.listen is not None:
            loopback_host(self.listen)
        if self.map_size < 1 << 20:
            raise ConfigError("map-size: must be at least 1 MiB")
        if self.grace_seconds < 0:
            raise ConfigError("grace: must not be negative")
        if not self.retention_interval_seconds > 0:
            raise ConfigError(
                "retention-interval: must be a positive number of seconds"
            )


def loopback_host(listen: str) -> tuple[str, int]:
    """Splits HOST:PORT and refuses any host that is not loopback: without
    authentication the daemon must not be reachable from other machines."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"listen: {listen!r} is not HOST:PORT")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        loopback = bare == "localhost" or ipaddress.ip_address(bare).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(
            f"listen: {host!r} is not a loopback address (127.0.0.1 or [::1])"
        )
    return host, int(port)
