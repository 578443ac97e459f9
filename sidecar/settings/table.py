"""Where each `effectd serve` setting comes from: flags win over `EFFECTD_*`
environment variables, which win over the TOML file named by `--config` (or
`EFFECTD_CONFIG`), which wins over the defaults of `ServeConfig`. One table,
`SETTINGS`, names every setting once; the flags, the variables, the file keys,
the error labels and `--print-config` are all derived from it, so no layer can
forget a setting. Everything here is a pure function of the parsed flags, an
environment mapping and the file's text, except `load`, which reads the file.

An error names the setting the way the user wrote it (`--quota-burst`,
`EFFECTD_QUOTA_BURST`, or `quota_burst in effectd.toml`): the person reading
it must find the line to fix without knowing the precedence rules.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import enum
import math
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.config import ConfigError, ServeConfig, ServerLimits
from sidecar.ledger.quota import Quotas

ENV_PREFIX = "EFFECTD_"
CONFIG_ENV = "EFFECTD_CONFIG"
MASK = "***"
# gRPC takes message sizes and stream counts as signed 32-bit channel args.
_INT32_MAX = (1 << 31) - 1
# Variables the clients and `effectd ctl` read, often from the same
# environment (a pod's); the daemon must not take them for misspelt settings.
_CLIENT_ENV = frozenset({"EFFECTD_TOKEN", "EFFECTD_TARGET"})
# A setting whose name says it holds a secret is never printed. A path is
# printed even then: it names where the secret is, and the file's mode, not
# the path's obscurity, protects it.
_SECRET_NAME = re.compile(r"secret|token|password|passwd|credential|key", re.I)
_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


class Kind(enum.Enum):
    """How a setting's text is read, and how it is written back as TOML."""

    PATH = "a path"
    TEXT = "a string"
    SIZE = "a size (bytes, or e.g. 512k, 8MiB)"
    INT = "an integer"
    FLOAT = "a number"
    BOOL = "a boolean (true/false/1/0/yes/no)"


class Layer(enum.Enum):
    FLAG = "flag"
    ENV = "env"
    FILE = "file"
    DEFAULT = "default"


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

    @property
    def field(self) -> str:
        return self.into or self.key

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def default(self) -> object:
        return _get(_DEFAULTS, self.field)

    @property
    def optional(self) -> bool:
        """None is a valid value: an empty string sets it, overriding lower
        layers (e.g. `--listen ""` turns off a listener the file sets)."""
        return self.default is None

    @property
    def secret(self) -> bool:
        return self.kind is not Kind.PATH and bool(_SECRET_NAME.search(self.field))


@dataclass(frozen=True, slots=True)
class Source:
    """Which layer gave a setting its value, and how that layer spells it."""

    layer: Layer
    # "--listen", "EFFECTD_LISTEN", "listen in effectd.toml", or, for a
    # default, the flag (or variable) that would change it.
    label: str

    @property
    def comment(self) -> str:
        if self.layer is Layer.ENV:
            return f"env {self.label}"
        return self.layer.name.lower()


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """The text of a TOML configuration file and how the user named it."""

    path: str
    text: str
    named_by: str = "--config"


@dataclass(frozen=True, slots=True)
class Resolved:
    """The effective configuration and where each setting came from."""

    config: ServeConfig
    # By setting key; every key of SETTINGS is present.
    sources: Mapping[str, Source]
    # Not errors: variables that look like misspelt settings, to be logged.
    warnings: tuple[str, ...] = ()


_DEFAULTS = ServeConfig()
# Reads one layer's raw value (a flag's text, a variable, a TOML value).
_Reader = Callable[["Setting", Any], object]


SETTINGS: tuple[Setting, ...] = (
    Setting("data_dir", Kind.PATH, "LMDB data directory", metavar="DIR"),
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
        "a loopback address serving Prometheus metrics at /metrics",
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
        "RPCs in flight of one namespace or token; more get RESOURCE_EXHAUSTED",
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
# The names ServeConfig.validate puts before its ": " (the key or the field,
# dashed), mapped back to the setting.
_BY_ALIAS: Mapping[str, Setting] = {
    alias: s
    for s in SETTINGS
    for alias in (s.key.replace("_", "-"), s.field.rpartition(".")[2].replace("_", "-"))
}

EPILOG = (
    "Every flag can also be set in the environment as EFFECTD_<FLAG> (e.g. "
    "EFFECTD_QUOTA_OPEN_CALLS=100, EFFECTD_SYNC=false) and in the --config TOML "
    "file as <flag> with '_' for '-' (e.g. quota_open_calls = 100, sync = false; "
    "relative paths are taken from the working directory, as on the command "
    "line). Flags win over the environment, which wins over the file. An empty "
    'value (--listen "") unsets an optional setting. EFFECTD_TOKENS '
    "holds the tokens file's text (environment only). --print-config shows the "
    "result and where each value came from."
)


class _Invalid(Exception):
    """A value that cannot be read; the caller adds the setting's label."""


def parse_size(text: str) -> int:
    """Bytes from `8MiB`, `8M`, `512k`, `1.5g` or a plain number of bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    bare = text.strip().lower().removesuffix("ib").removesuffix("b").strip()
    try:
        if bare and bare[-1] in units:
            return int(float(bare[:-1]) * units[bare[-1]])
        return int(bare)
    except (ValueError, OverflowError):
        raise ValueError(
            f"{text!r} is not a size (bytes, or e.g. 512k, 8MiB)"
        ) from None


def format_size(size: int) -> str:
    """`8GiB` for a whole number of a unit, else the bytes; `parse_size`
    reads either back to the same number."""
    for suffix, unit in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if size and size % unit == 0:
            return f"{size // unit}{suffix}"
    if size and size % (1 << 10) == 0:
        return f"{size >> 10}KiB"
    return str(size)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Adds `--config`, `--print-config` and one flag per setting to `serve`.

    Flags are read as text and converted here, not by argparse, so a bad flag
    fails like a bad variable or file key: `effectd: --flag: why`, exit 2.
    """
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help=f"TOML file of settings (env {CONFIG_ENV})",
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective configuration as TOML, each value's source "
        "in a comment, secrets masked; then exit",
    )
    for s in SETTINGS:
        if s.env_only:
            continue
        shown = _shown_default(s)
        help_text = (s.help + (f" (default {shown})" if shown else "")).replace(
            "%", "%%"
        )
        if s.kind is Kind.BOOL:
            p.add_argument(
                s.flag,
                dest=s.key,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        else:
            p.add_argument(
                s.flag,
                dest=s.key,
                default=None,
                metavar=s.metavar or ("|".join(s.choices) if s.choices else None),
                help=help_text,
            )


def load(args: argparse.Namespace, environ: Mapping[str, str]) -> Resolved:
    """The configuration of `effectd serve` from its parsed flags, the
    environment and the file they name (`--config` wins over EFFECTD_CONFIG).

    Raises:
        ConfigError: a setting is invalid; the message starts with its label.
    """
    flags = vars(args)
    named = flags.get("config")
    named_by = "--config"
    if named is None:
        named, named_by = environ.get(CONFIG_ENV), CONFIG_ENV
    file = None
    if named:
        try:
            text = Path(named).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"{named_by}: cannot read {named}: {exc.strerror}"
            ) from None
        except UnicodeDecodeError:
            raise ConfigError(f"{named_by}: {named} is not UTF-8 text") from None
        file = ConfigFile(named, text, named_by)
    return resolve(flags, environ, file)


def resolve(
    flags: Mapping[str, object],
    environ: Mapping[str, str],
    file: ConfigFile | None = None,
) -> Resolved:
    """Applies the layers setting by setting and validates the result.

    Args:
        flags: by setting key; None (or absent) means the flag was not given.
            Values are the flags' text, or a bool for boolean flags.
        environ: the process environment, or any mapping standing in for it.
        file: the TOML configuration file, if one is named.

    Raises:
        ConfigError: the first invalid setting, named as the user wrote it.
    """
    in_file = _read_file(file) if file is not None else {}
    values: dict[str, object] = {}
    sources: dict[str, Source] = {}
    for s in SETTINGS:
        flag = None if s.env_only else flags.get(s.key)
        if flag is not None:
            # A boolean flag is named as written: --sync or --no-sync.
            source = Source(Layer.FLAG, s.flag if flag is not False else _no(s))
            values[s.field] = _labelled(source, _from_flag, s, flag)
        elif environ.get(s.env) is not None:
            source = Source(Layer.ENV, s.env)
            values[s.field] = _labelled(source, _from_text, s, environ[s.env])
        elif s.key in in_file:
            assert file is not None
            source = Source(Layer.FILE, f"{s.key} in {file.path}")
            values[s.field] = _labelled(source, _from_toml, s, in_file[s.key])
        else:
            source = Source(Layer.DEFAULT, s.env if s.env_only else s.flag)
            values[s.field] = s.default
        sources[s.key] = source
    config = _build(values)
    try:
        config.validate()
    except ConfigError as exc:
        raise ConfigError(relabel(str(exc), sources)) from None
    return Resolved(config, sources, _env_warnings(environ))


def relabel(message: str, sources: Mapping[str, Source]) -> str:
    """Rewrites the setting names before a ConfigError's first ": " (as
    `ServeConfig.validate` and the loaders spell them: `quota-open-calls`,
    `tls-cert and tls-key`, `tokens-file PATH`) into the user's spelling.
    A message about something else is returned unchanged."""
    head, sep, why = message.partition(": ")
    if not sep:
        return message
    labels = []
    for part in head.split(" and "):
        name, space, rest = part.partition(" ")
        setting = _BY_ALIAS.get(name)
        if setting is None:
            return message
        labels.append(sources[setting.key].label + space + rest)
    return " and ".join(labels) + ": " + why


def render(resolved: Resolved) -> str:
    """The configuration as TOML that `--config` reads back to the same
    `ServeConfig`, each line commented with its source. Secrets and unset
    values are written as comments, so reading it back leaves them unset."""
    lines = [
        "# effectd serve: the effective configuration.",
        "# Flags win over EFFECTD_* variables, which win over this file; then the",
        "# defaults. Read it back with: effectd serve --config FILE",
    ]
    for s in SETTINGS:
        value = _get(resolved.config, s.field)
        comment = resolved.sources[s.key].comment
        if value is None:
            entry = f"# {s.key}: not set"
        elif s.secret:
            entry = f"# {s.key} = {_toml_string(MASK)}"
            comment += ", masked" + (" (environment only)" if s.env_only else "")
        elif s.env_only:
            entry = f"# {s.key} = {_toml(s, value)}"
            comment += " (environment only)"
        else:
            entry = f"{s.key} = {_toml(s, value)}"
        lines.append(f"{entry:<40}  # {comment}")
    return "\n".join(lines) + "\n"


def _labelled(source: Source, read: _Reader, s: Setting, raw: object) -> object:
    try:
        value = read(s, raw)
    except _Invalid as exc:
        raise ConfigError(f"{source.label}: {exc}") from None
    if isinstance(value, int) and s.maximum is not None and value > s.maximum:
        raise ConfigError(f"{source.label}: must be at most {s.maximum}")
    return value


def _no(s: Setting) -> str:
    return "--no-" + s.flag.removeprefix("--")


def _from_flag(s: Setting, raw: object) -> object:
    if isinstance(raw, bool):
        return raw
    return _from_text(s, str(raw))


def _from_text(s: Setting, text: str) -> object:
    """A flag's or variable's text as the setting's value."""
    if not text.strip():
        if s.optional:
            return None
        raise _Invalid("must not be empty")
    try:
        return _TEXT_READERS[s.kind](s, text)
    except ValueError as exc:
        if s.kind is Kind.SIZE:
            raise _Invalid(str(exc)) from None
        raise _Invalid(f"{text!r} is not {s.kind.value}") from None


def _choice(s: Setting, text: str) -> str:
    if not s.choices:
        return text
    word = text.strip().lower()
    if word not in s.choices:
        raise _Invalid(f"{text!r} is not one of {', '.join(s.choices)}")
    return word


def _finite(s: Setting, text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise _Invalid(f"{text!r} is not a finite number")
    return number


def _boolean(s: Setting, text: str) -> bool:
    word = text.strip().lower()
    if word not in _TRUE | _FALSE:
        raise _Invalid(f"{text!r} is not {s.kind.value}")
    return word in _TRUE


_TEXT_READERS: Mapping[Kind, Callable[[Setting, str], object]] = {
    Kind.PATH: lambda s, text: Path(text),
    Kind.TEXT: _choice,
    Kind.SIZE: lambda s, text: parse_size(text),
    Kind.INT: lambda s, text: int(text),
    Kind.FLOAT: _finite,
    Kind.BOOL: _boolean,
}


def _from_toml(s: Setting, value: object) -> object:
    """A TOML value as the setting's value; strings are read like a
    variable's text where the kind has a text form (sizes, booleans)."""
    if isinstance(value, str) and s.kind in (Kind.PATH, Kind.TEXT, Kind.SIZE):
        return _from_text(s, value)
    if s.kind is Kind.BOOL:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) or (isinstance(value, int) and value in (0, 1)):
            return _from_text(s, str(value))
    elif isinstance(value, bool):
        pass  # a TOML boolean is never a number here
    elif isinstance(value, int) and s.kind in (Kind.INT, Kind.SIZE, Kind.FLOAT):
        return float(value) if s.kind is Kind.FLOAT else value
    elif isinstance(value, float) and s.kind is Kind.FLOAT:
        if not math.isfinite(value):
            raise _Invalid(f"{value!r} is not a finite number")
        return value
    raise _Invalid(f"must be {s.kind.value}, not {_toml_type(value)}")


def _read_file(file: ConfigFile) -> dict[str, object]:
    try:
        doc = tomllib.loads(file.text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"{file.named_by}: {file.path} is not valid TOML: {exc}"
        ) from None
    for key in doc:
        setting = BY_KEY.get(key)
        if setting is None:
            raise ConfigError(f"{key} in {file.path}: {_unknown_key(key)}")
        if setting.env_only:
            raise ConfigError(
                f"{key} in {file.path}: a secret; set it only in the environment "
                f"({setting.env}), or use tokens_file"
            )
    return doc


def _unknown_key(key: str) -> str:
    bare = key.removeprefix("no_").removeprefix("no-")
    if bare != key and BY_KEY.get(bare.replace("-", "_"), None) is not None:
        setting = BY_KEY[bare.replace("-", "_")]
        if setting.kind is Kind.BOOL:
            return f"not a setting; write {setting.key} = false"
    if key.replace("-", "_") in BY_KEY:
        return f"not a setting; write {key.replace('-', '_')} (with '_')"
    guess = difflib.get_close_matches(key, list(BY_KEY), n=1, cutoff=0.75)
    hint = f"; did you mean {guess[0]}?" if guess else ""
    return f"not a setting{hint}"


def _env_warnings(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Variables that look like misspelt settings. Warnings, not errors: the
    environment is shared with other programs, whose EFFECTD_* names the
    daemon cannot know."""
    known = {s.env for s in SETTINGS} | {CONFIG_ENV}
    found = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in known or name in _CLIENT_ENV:
            continue
        negated = ENV_PREFIX + name.removeprefix(ENV_PREFIX).removeprefix("NO_")
        if negated != name and negated in known:
            found.append(f"{name} is not a setting and is ignored; use {negated}=false")
            continue
        guess = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.85)
        if guess:
            found.append(
                f"{name} is not a setting and is ignored; did you mean {guess[0]}?"
            )
    return tuple(found)


def _build(values: Mapping[str, object]) -> ServeConfig:
    # Each value was read by its setting's kind, so it has its field's type.
    top: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    quotas: dict[str, Any] = {}
    for field, value in values.items():
        group, _, name = field.rpartition(".")
        {"": top, "server_limits": limits, "quotas": quotas}[group][name] = value
    return dataclasses.replace(
        _DEFAULTS,
        server_limits=dataclasses.replace(ServerLimits(), **limits),
        quotas=dataclasses.replace(Quotas(), **quotas),
        **top,
    )


def _get(config: ServeConfig, field: str) -> object:
    value: object = config
    for part in field.split("."):
        value = getattr(value, part)
    return value


def _shown_default(s: Setting) -> str:
    value = s.default
    if value is None:
        return ""
    if s.kind is Kind.BOOL:
        return "on" if value else "off"
    if s.kind is Kind.SIZE:
        assert isinstance(value, int)
        return format_size(value)
    return str(value)


def _toml(s: Setting, value: object) -> str:
    if s.kind is Kind.BOOL:
        return "true" if value else "false"
    if s.kind is Kind.FLOAT:
        assert isinstance(value, float | int)
        # repr is TOML for every finite float: "5.0", "1e-05", "1e+16".
        return repr(float(value))
    if s.kind is Kind.SIZE:
        assert isinstance(value, int)
        shown = format_size(value)
        return str(value) if shown.isdigit() else _toml_string(shown)
    if s.kind is Kind.INT:
        assert isinstance(value, int)
        return str(value)
    return _toml_string(str(value))


def _toml_string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters
    escaped (a raw newline or DEL would not read back)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_type(value: object) -> str:
    kinds = {bool: "a boolean", int: "an integer", float: "a float", str: "a string"}
    for python_type, name in kinds.items():
        if isinstance(value, python_type):
            return name
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return "a date or time"
