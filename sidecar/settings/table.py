"""The settings of `effectd serve`, each named once: its TOML key, from
which its flag (`--` + the key, `-` for `_`) and its variable (`EFFECTD_` +
the key in capitals) are derived, the field of `ServeConfig` it sets, and
its kind, which says how its text and its TOML value are read and written.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.config import ServeConfig

ENV_PREFIX = "EFFECTD_"
CONFIG_ENV = "EFFECTD_CONFIG"
# gRPC takes message sizes and stream counts as signed 32-bit channel args.
_INT32_MAX = (1 << 31) - 1
# A setting whose name says it holds a secret is never printed. A path is
# printed even then: it names where the secret is, and the file's mode, not
# the path's obscurity, protects it.
_SECRET_NAME = re.compile(r"secret|token|password|passwd|credential|key", re.I)


class Kind(enum.Enum):
    """How a setting's text is read, and how it is written back as TOML."""

    PATH = "a path"
    TEXT = "a string"
    SIZE = "a size (bytes, or e.g. 512k, 8MiB)"
    INT = "an integer"
    FLOAT = "a number"
    BOOL = "a boolean (true/false/1/0/yes/no)"


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: its TOML key, where it lands in `ServeConfig`, its type.

    The flag is `--` + the key with `-` for `_`; the variable is `EFFECTD_` +
    the key upper-cased.
    """

    key: str
    kind: Kind
    help: str
    # The field of ServeConfig ("server_limits.X", "quotas.X"); "": the key.
    into: str = ""
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    # A secret that must not sit in a file without a mode check, nor in argv
    # (other users see it in ps): the environment only.
    env_only: bool = False
    maximum: int | None = None
    # A URL printed with its password masked (`config.masked_url`).
    url: bool = False

    @property
    def field(self) -> str:
        return self.into or self.key

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def no_flag(self) -> str:
        """A boolean's flag that turns it off: `--no-sync`."""
        return "--no-" + self.flag.removeprefix("--")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def default(self) -> object:
        return value_of(DEFAULTS, self.field)

    @property
    def optional(self) -> bool:
        """None is a valid value: an empty string sets it, overriding lower
        layers (e.g. `--listen ""` turns off a listener the file sets)."""
        return self.default is None

    @property
    def secret(self) -> bool:
        return self.kind is not Kind.PATH and bool(_SECRET_NAME.search(self.field))


DEFAULTS = ServeConfig()


def value_of(config: ServeConfig, field: str) -> object:
    """The value of a dotted field of the configuration (`quotas.burst`)."""
    value: object = config
    for part in field.split("."):
        value = getattr(value, part)
    return value


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "data_dir",
        Kind.PATH,
        "LMDB data directory (with --store: where the socket and its lock are)",
        metavar="DIR",
    ),
    Setting(
        "init",
        Kind.BOOL,
        "create a new, empty ledger in data-dir if it holds none (without it, "
        "such a data-dir is refused); harmless on an existing ledger",
    ),
    Setting(
        "store",
        Kind.TEXT,
        "the shared store, postgresql://USER@HOST/DB (create its schema with "
        "`effectd migrate`); unset: LMDB under data-dir",
        metavar="URL",
        url=True,
    ),
    Setting(
        "socket",
        Kind.PATH,
        "Unix socket path (default DATA_DIR/effectd.sock)",
        metavar="PATH",
    ),
    Setting(
        "listen",
        Kind.TEXT,
        "also listen on TCP, e.g. 127.0.0.1:50051; loopback only unless TLS is set",
        metavar="HOST:PORT",
    ),
    Setting(
        "map_size",
        Kind.SIZE,
        "LMDB map size, e.g. 8GiB (address space; the file grows as needed)",
        metavar="SIZE",
    ),
    Setting(
        "sync",
        Kind.BOOL,
        "fsync every commit; --no-sync survives a process crash, not a power "
        "loss, after which a side effect can be executed again",
    ),
    Setting(
        "grace",
        Kind.FLOAT,
        "seconds in-flight calls may take to finish at shutdown",
        into="grace_seconds",
        metavar="SECONDS",
    ),
    Setting("reflection", Kind.BOOL, "serve gRPC reflection (--no-reflection: do not)"),
    Setting(
        "local_frames",
        Kind.BOOL,
        "also serve the session's messages as frames on a Unix socket beside "
        "the gRPC one (effectd.frames.sock), which clients on this host use "
        "(--no-local-frames: do not)",
    ),
    Setting(
        "policy",
        Kind.PATH,
        "TOML policy file (retries, leases, retention, forced effects); "
        "reloaded on SIGHUP",
        into="policy_file",
        metavar="FILE",
    ),
    Setting(
        "providers",
        Kind.PATH,
        "TOML file of provider routes (base URL, credential, headers) that "
        "ProviderCall / ProviderStream may reach; none: no route",
        into="providers_file",
        metavar="FILE",
    ),
    Setting(
        "retention_interval",
        Kind.FLOAT,
        "seconds between passes that compact acknowledged calls older than the "
        "retention window to tombstones",
        into="retention_interval_seconds",
        metavar="SECONDS",
    ),
    Setting(
        "settle_interval",
        Kind.FLOAT,
        "seconds between passes that turn STARTED calls whose lease ran out "
        "into UNKNOWN",
        into="settle_interval_seconds",
        metavar="SECONDS",
    ),
    Setting(
        "daemon_id",
        Kind.TEXT,
        "names this daemon, across its restarts, among the daemons sharing its "
        "store; default: the host name and the socket path",
        metavar="ID",
    ),
    Setting(
        "registration_ttl",
        Kind.FLOAT,
        "seconds a daemon's registration vouches for the calls it started "
        "without being renewed (renewed every third of it): how long after a "
        "daemon died the others settle its calls",
        into="registration_ttl_seconds",
        metavar="SECONDS",
    ),
    Setting(
        "tokens_file",
        Kind.PATH,
        "bearer tokens: a TOML file of [[token]] tables, mode 0600; without "
        "tokens, authentication is off and only the socket and loopback serve",
        metavar="FILE",
    ),
    Setting(
        "tokens",
        Kind.TEXT,
        "the tokens file's text itself (environment only)",
        into="tokens_text",
        env_only=True,
    ),
    Setting("tls_cert", Kind.PATH, "TLS certificate chain (PEM)", metavar="FILE"),
    Setting("tls_key", Kind.PATH, "TLS private key (PEM)", metavar="FILE"),
    Setting(
        "tls_client_ca",
        Kind.PATH,
        "CA (PEM) whose client certificates are required (mutual TLS)",
        metavar="FILE",
    ),
    Setting(
        "health_listen",
        Kind.TEXT,
        "a plaintext TCP address serving only grpc.health.v1 (probes)",
        metavar="HOST:PORT",
    ),
    Setting(
        "metrics_listen",
        Kind.TEXT,
        "an address serving Prometheus metrics at /metrics, without "
        "authentication (restrict any address but loopback with a firewall or "
        "a NetworkPolicy)",
        metavar="HOST:PORT",
    ),
    Setting(
        "log_format",
        Kind.TEXT,
        "log lines: one JSON object each, or text",
        choices=("json", "text"),
    ),
    Setting(
        "log_level",
        Kind.TEXT,
        "least severe level logged",
        choices=("debug", "info", "warning", "error"),
    ),
    Setting(
        "otel",
        Kind.BOOL,
        "record an OpenTelemetry span per RPC (needs effectd[otel]; exporter "
        "and sampler from the OTEL_* variables)",
    ),
    Setting(
        "max_message_size",
        Kind.SIZE,
        "largest gRPC message, both directions",
        into="server_limits.max_message_bytes",
        metavar="SIZE",
        maximum=_INT32_MAX,
    ),
    Setting(
        "max_concurrent_rpcs",
        Kind.INT,
        "RPCs in flight over the whole server; more get RESOURCE_EXHAUSTED",
        into="server_limits.max_concurrent_rpcs",
        metavar="N",
        maximum=_INT32_MAX,
    ),
    Setting(
        "max_concurrent_rpcs_per_caller",
        Kind.INT,
        "RPCs in flight of one namespace or token; more get RESOURCE_EXHAUSTED "
        "(default: a quarter of max-concurrent-rpcs)",
        into="server_limits.max_concurrent_rpcs_per_caller",
        metavar="N",
        maximum=_INT32_MAX,
    ),
    Setting(
        "max_concurrent_streams",
        Kind.INT,
        "HTTP/2 streams per connection",
        into="server_limits.max_concurrent_streams",
        metavar="N",
        maximum=_INT32_MAX,
    ),
    Setting(
        "session_max_in_flight",
        Kind.INT,
        "messages of one session stream served at once; past it the daemon "
        "reads no more of the stream until one is answered (default: the "
        "per-caller share of max-concurrent-rpcs)",
        into="server_limits.session_max_in_flight",
        metavar="N",
        maximum=_INT32_MAX,
    ),
    Setting(
        "handshake_timeout",
        Kind.FLOAT,
        "seconds a TLS or HTTP/2 handshake may take",
        into="server_limits.handshake_timeout_seconds",
        metavar="SECONDS",
    ),
    Setting(
        "default_deadline",
        Kind.FLOAT,
        "deadline, in seconds, of a call that brings none",
        into="server_limits.default_deadline_seconds",
        metavar="SECONDS",
    ),
    Setting(
        "min_ping_interval",
        Kind.FLOAT,
        "seconds; clients pinging more often are sent GOAWAY",
        into="server_limits.min_ping_interval_seconds",
        metavar="SECONDS",
    ),
    Setting(
        "max_connection_idle",
        Kind.FLOAT,
        "seconds after which an idle connection is closed",
        into="server_limits.max_connection_idle_seconds",
        metavar="SECONDS",
    ),
    Setting(
        "quota_open_calls",
        Kind.INT,
        "calls not yet committed, per namespace (0: unlimited)",
        into="quotas.open_calls",
        metavar="N",
    ),
    Setting(
        "quota_stored_bytes",
        Kind.SIZE,
        "bytes of records stored, per namespace (0: unlimited)",
        into="quotas.stored_bytes",
        metavar="SIZE",
    ),
    Setting(
        "quota_requests_per_second",
        Kind.FLOAT,
        "sustained requests per second, per caller (0: unlimited)",
        into="quotas.requests_per_second",
        metavar="R",
    ),
    Setting(
        "quota_burst",
        Kind.INT,
        "requests of headroom above the sustained rate, per caller",
        into="quotas.burst",
        metavar="N",
    ),
)

BY_KEY: Mapping[str, Setting] = {s.key: s for s in SETTINGS}
