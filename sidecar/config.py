"""The daemon's configuration: one frozen value, built by the CLI (see
`sidecar.settings`), and `ConfigError`, which names the setting at fault by
its key and, once the settings layers know it, by where its value came from.
"""

from __future__ import annotations

import enum
import ipaddress
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.ledger.quota import Quotas
from sidecar.ledger.validation import Limits
from sidecar.storage import backends

# sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107
DEFAULT_MAP_SIZE = 8 << 30
DEFAULT_GRACE_SECONDS = 5.0
DEFAULT_RETENTION_INTERVAL_SECONDS = 600.0
DEFAULT_SETTLE_INTERVAL_SECONDS = 10.0
DEFAULT_REGISTRATION_TTL_SECONDS = 15.0
# The server's concurrency limit over this is one caller's default share.
PER_CALLER_SHARE = 4


class Layer(enum.Enum):
    """Where a setting's value came from."""

    FLAG = "flag"
    ENV = "env"
    FILE = "file"
    DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class Source:
    """Which layer gave a setting its value, and how that layer spells it."""

    layer: Layer
    # "--listen", "EFFECTD_LISTEN", "listen in effectd.toml", or, for a
    # default, the flag (or variable) that would change it.
    label: str


# A setting only the environment holds is named by its variable, also before
# the layers label an error (the settings table marks it `env_only`).
ENV_ONLY = {"tokens": "EFFECTD_TOKENS"}


class ConfigError(ValueError):
    """An invalid setting, named by fields, never by parsing the message.

    Attributes:
        settings: the keys of the settings at fault, as the settings table
            and the TOML file spell them (`tls_cert`); a flag's spelling
            (`tls-cert`) names the same key.
        why: what is wrong.
        detail: what the setting points at, said after its name (the tokens
            file's path); "" if nothing.
        sources: where each setting's value came from, once the settings
            layers have labelled the error (`sidecar.settings.label`); ()
            until then, and the settings are named by their keys, dashed
            (`tls-cert`), or by their variable if only the environment holds
            them (`EFFECTD_TOKENS`).
    """

    def __init__(
        self,
        settings: str | tuple[str, ...],
        why: str,
        *,
        detail: str = "",
        sources: tuple[Source, ...] = (),
    ) -> None:
        keys = (settings,) if isinstance(settings, str) else settings
        self.settings = tuple(key.replace("-", "_") for key in keys)
        self.why = why
        self.detail = detail
        self.sources = sources
        super().__init__(str(self))

    @property
    def setting(self) -> str:
        """The (first) setting at fault; "" for none."""
        return self.settings[0] if self.settings else ""

    @property
    def source(self) -> Source | None:
        """Where the (first) setting's value came from, once labelled."""
        return self.sources[0] if self.sources else None

    def labelled(self, sources: tuple[Source, ...]) -> ConfigError:
        """The same error, each setting named by its source."""
        return ConfigError(self.settings, self.why, detail=self.detail, sources=sources)

    def __str__(self) -> str:
        names = [s.label for s in self.sources] or [
            ENV_ONLY.get(key, key.replace("_", "-")) for key in self.settings
        ]
        head = " and ".join(names) + (f" {self.detail}" if self.detail else "")
        return f"{head}: {self.why}" if head else self.why


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Transport limits of the gRPC server (see docs/operations.md)."""

    # Both directions, server and shipped clients.
    max_message_bytes: int = 8 << 20
    # RPCs in flight over the whole server; more get RESOURCE_EXHAUSTED. Calls
    # that record work already done have as many more of their own.
    max_concurrent_rpcs: int = 256
    # RPCs in flight of one caller (its namespace, or its token); None: a
    # quarter of `max_concurrent_rpcs` (`per_caller`), so that lowering the
    # server's limit alone never lets one caller take every slot.
    max_concurrent_rpcs_per_caller: int | None = None
    # HTTP/2 streams per connection.
    max_concurrent_streams: int = 128
    # A TLS or HTTP/2 handshake that takes longer is dropped.
    handshake_timeout_seconds: float = 5.0
    # The deadline given to a call that brings none.
    default_deadline_seconds: float = 60.0
    # Client keepalive pings more frequent than this are answered with GOAWAY.
    min_ping_interval_seconds: float = 10.0
    # Idle connections are closed after this long.
    max_connection_idle_seconds: float = 300.0
    # Messages of one session stream served at once; past it the daemon
    # reads no more of the stream until one is answered. None: the
    # per-caller share of concurrency slots (`session_in_flight`): one
    # stream can use its caller's whole share, and a message read past it
    # could only be refused CONCURRENCY_LIMITED.
    session_max_in_flight: int | None = None

    @property
    def per_caller(self) -> int:
        """RPCs in flight of one caller: as set, else a quarter of the
        server's limit (64 of the default 256), at least 1."""
        if self.max_concurrent_rpcs_per_caller is not None:
            return self.max_concurrent_rpcs_per_caller
        return max(1, self.max_concurrent_rpcs // PER_CALLER_SHARE)

    @property
    def session_in_flight(self) -> int:
        """Messages of one session stream served at once: as set, else the
        per-caller share."""
        if self.session_max_in_flight is not None:
            return self.session_max_in_flight
        return min(self.per_caller, self.max_concurrent_rpcs)


_MASK = "***"


def masked_url(url: str) -> str:
    """`url` with its password (in the user part, or a `password` query
    parameter) replaced by ***, for printing and logging."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return _MASK
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        if ":" in user:
            user = user.split(":", 1)[0] + ":" + _MASK
        netloc = f"{user}@{host}"
    query = "&".join(
        f"{name}={_MASK}" if name.lower() == "password" else pair
        for pair in parts.query.split("&")
        if pair
        for name in (pair.split("=", 1)[0],)
    )
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))


def url_password(url: str) -> str | None:
    """The password `url` carries, if any (to mask it in logs)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return None
    if parts.password:
        return urllib.parse.unquote(parts.password)
    found = urllib.parse.parse_qs(parts.query).get("password")
    return found[0] if found else None


@dataclass(frozen=True, slots=True)
class ServeConfig:
    data_dir: Path = Path(".effectd")
    # Create a new, empty LMDB ledger if the data directory holds none
    # (`storage.ledger_files` says what counts); without it such a directory
    # is refused, so that a mistyped or unmounted one is not served as a new
    # memory. Harmless on an existing ledger; no effect with `store`.
    init: bool = False
    # The shared store: a postgresql:// URL; None: LMDB under data_dir.
    store: str | None = None
    # Default: effectd.sock in the data directory.
    socket: Path | None = None
    # "127.0.0.1:PORT" or "[::1]:PORT"; port 0 picks a free port.
    listen: str | None = None
    map_size: int = DEFAULT_MAP_SIZE
    # fsync on every commit; off survives a process crash but not a power
    # loss, after which an answered start can be lost and a side effect run
    # again (the daemon warns at start).
    sync: bool = True
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    reflection: bool = True
    # Also serve the session's messages as frames on a Unix socket beside
    # the gRPC one (`sidecar.rpc.frames`).
    local_frames: bool = True
    # Bearer tokens: a TOML file of [[token]] tables, mode 0600 (see
    # sidecar.auth), or the same text from the environment (EFFECTD_TOKENS).
    # Neither: authentication is off, and only the socket and loopback serve.
    tokens_file: Path | None = None
    tokens_text: str | None = None
    # TLS for the TCP listener: certificate chain and key (PEM); with
    # `tls_client_ca`, clients must present a certificate signed by it.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    # A plaintext TCP address serving only grpc.health.v1 (probes).
    health_listen: str | None = None
    # An HTTP address serving Prometheus metrics at /metrics, without
    # authentication: one other machines reach (a pod's network) is for a
    # NetworkPolicy or a firewall to restrict (the daemon warns).
    metrics_listen: str | None = None
    # "json" (one object per line) or "text".
    log_format: str = "json"
    log_level: str = "info"
    # One OpenTelemetry server span per RPC; needs the otel extra, and takes
    # its exporter and sampler from the SDK's OTEL_* variables.
    otel: bool = False
    server_limits: ServerLimits = field(default_factory=ServerLimits)
    quotas: Quotas = field(default_factory=Quotas)
    # A TOML policy file (see sidecar.policy_file); None: the default policy.
    policy_file: Path | None = None
    # A TOML file of provider routes (see sidecar.provider.routes); None: the
    # Provider service reaches no upstream.
    providers_file: Path | None = None
    # Seconds between compaction passes of the retention window (contract §4.7);
    # the first pass runs at start.
    retention_interval_seconds: float = DEFAULT_RETENTION_INTERVAL_SECONDS
    # Seconds between passes that turn STARTED calls whose lease ran out into
    # UNKNOWN, so listings and stats show them as waiting for a person.
    settle_interval_seconds: float = DEFAULT_SETTLE_INTERVAL_SECONDS
    # Names this daemon among those sharing its store, across its restarts
    # (`ledger.ownership`); None: this host's name and the socket path.
    daemon_id: str | None = None
    # Seconds a daemon's registration vouches for the leases it granted
    # without being renewed: how long after it died other daemons settle them.
    registration_ttl_seconds: float = DEFAULT_REGISTRATION_TTL_SECONDS
    limits: Limits = field(default_factory=Limits)

    @property
    def max_message_bytes(self) -> int:
        return self.server_limits.max_message_bytes

    @property
    def authenticated(self) -> bool:
        return self.tokens_file is not None or self.tokens_text is not None

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def socket_path(self) -> Path:
        return (
            self.socket if self.socket is not None else self.data_dir / "effectd.sock"
        )

    def validate(self) -> None:
        path = str(self.socket_path)
        if len(path.encode()) > MAX_SOCKET_PATH:
            raise ConfigError(
                "socket",
                f"the path {path!r} is longer than {MAX_SOCKET_PATH} bytes; "
                "choose a shorter --socket or --data-dir",
            )
        self._validate_listeners()
        if self.store is not None:
            validate_store_url(self.store)
        if self.map_size < 1 << 20:
            raise ConfigError("map_size", "must be at least 1 MiB")
        if self.grace_seconds < 0:
            raise ConfigError("grace", "must not be negative")
        if not self.retention_interval_seconds > 0:
            raise ConfigError(
                "retention_interval", "must be a positive number of seconds"
            )
        if not self.settle_interval_seconds > 0:
            raise ConfigError("settle_interval", "must be a positive number of seconds")
        if not self.registration_ttl_seconds > 0:
            raise ConfigError(
                "registration_ttl", "must be a positive number of seconds"
            )
        if self.daemon_id is not None and not self.daemon_id.strip():
            raise ConfigError("daemon_id", "must not be blank")
        if self.log_format not in ("json", "text"):
            raise ConfigError("log_format", "must be json or text")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError("log_level", "must be debug, info, warning or error")
        limits = self.server_limits
        _at_least("max_message_size", limits.max_message_bytes, 1 << 10)
        _at_least("max_concurrent_rpcs", limits.max_concurrent_rpcs, 1)
        _at_least("max_concurrent_rpcs_per_caller", limits.per_caller, 1)
        _at_least("max_concurrent_streams", limits.max_concurrent_streams, 1)
        _at_least("handshake_timeout", limits.handshake_timeout_seconds, 0.001)
        _at_least("default_deadline", limits.default_deadline_seconds, 0.001)
        _at_least("min_ping_interval", limits.min_ping_interval_seconds, 0.001)
        _at_least("max_connection_idle", limits.max_connection_idle_seconds, 0.001)
        _at_least("session_max_in_flight", limits.session_in_flight, 1)
        for name in ("open_calls", "stored_bytes", "requests_per_second", "burst"):
            if getattr(self.quotas, name) < 0:
                raise ConfigError(f"quota_{name}", "must not be negative")

    def _validate_listeners(self) -> None:
        if self.listen is not None:
            if not self.tls:
                loopback_host(self.listen)
            host, _ = split_host_port("listen", self.listen)
            if not is_loopback(host) and not self.authenticated:
                raise ConfigError(
                    "listen",
                    f"{host!r} is not loopback: other machines may reach it, so "
                    "it needs tokens (tokens-file or EFFECTD_TOKENS)",
                )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError(("tls_cert", "tls_key"), "set both or neither")
        if self.tls_client_ca is not None and not self.tls:
            raise ConfigError("tls_client_ca", "needs tls-cert and tls-key")
        if self.tls and self.listen is None:
            raise ConfigError("tls_cert", "TLS serves the TCP listener; set listen")
        if self.health_listen is not None:
            split_host_port("health_listen", self.health_listen)
        if self.metrics_listen is not None:
            split_host_port("metrics_listen", self.metrics_listen)


def validate_store_url(url: str, setting: str = "store") -> None:
    """Refuses a store URL that no store backend takes (`storage.backends`:
    postgresql://), naming `setting`."""
    if backends.of_url(url) is None:
        raise ConfigError(
            setting,
            f"{masked_url(url)!r} is not a postgresql:// URL (leave it unset "
            "for LMDB under data-dir)",
        )


def _at_least(setting: str, value: float, least: float) -> None:
    if value < least:
        raise ConfigError(setting, f"must be at least {least}")


def split_host_port(setting: str, listen: str) -> tuple[str, int]:
    """HOST and PORT of `listen`; ConfigError naming `setting` if it is not
    HOST:PORT."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(setting, f"{listen!r} is not HOST:PORT")
    return host, int(port)


def is_loopback(host: str) -> bool:
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return bare == "localhost" or ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def loopback_host(listen: str, setting: str = "listen") -> tuple[str, int]:
    """Splits HOST:PORT and refuses any host that is not loopback: without
    TLS the daemon must not be reachable from other machines."""
    host, port = split_host_port(setting, listen)
    if not is_loopback(host):
        raise ConfigError(
            setting,
            f"{host!r} is not a loopback address (127.0.0.1 or [::1]);"
            + (
                " other addresses need tls-cert and tls-key"
                if setting == "listen"
                else ""
            ),
        )
    return host, port
