"""The layers, setting by setting: a flag wins over its `EFFECTD_*`
variable, which wins over its key in the TOML file named by `--config` (or
`EFFECTD_CONFIG`), which wins over the default of `ServeConfig`. Each value
remembers its `Source`, so that an error names the setting the way the user
wrote it (`--quota-burst`, `EFFECTD_QUOTA_BURST`, or `quota_burst in
effectd.toml`): the person reading it must find the line to fix without
knowing the precedence rules. Everything here is a pure function of the
parsed flags, an environment mapping and the file's text, except `load`,
which reads the file.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.config import ConfigError, Layer, ServeConfig, ServerLimits, Source
from sidecar.ledger.quota import Quotas
from sidecar.settings.table import (
    BY_KEY,
    CONFIG_ENV,
    DEFAULTS,
    ENV_PREFIX,
    SETTINGS,
    Kind,
    Setting,
)
from sidecar.settings.values import Invalid, field, from_flag, from_text, from_toml
from sidecar.tomlfields import FieldError, known

# Variables the clients and `effectd ctl` read, often from the same
# environment (a pod's); the daemon must not take them for misspelt settings.
_CLIENT_ENV = frozenset({"EFFECTD_TOKEN", "EFFECTD_TARGET"})
# Every key the file may hold; an environment-only secret is refused by name.
_FILE_FIELDS = {s.key: field(s) for s in SETTINGS if not s.env_only}
# Reads one layer's raw value (a flag's text, a variable, a TOML value).
_Reader = Callable[[Setting, Any], object]


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


def load(args: argparse.Namespace, environ: Mapping[str, str]) -> Resolved:
    """The configuration of `effectd serve` from its parsed flags, the
    environment and the file they name (`--config` wins over EFFECTD_CONFIG).

    Raises:
        ConfigError: a setting is invalid, named by its source.
    """
    flags = vars(args)
    named = flags.get("config")
    source = Source(Layer.FLAG, "--config")
    if named is None:
        named, source = environ.get(CONFIG_ENV), Source(Layer.ENV, CONFIG_ENV)
    file = None
    if named:
        try:
            text = Path(named).read_text(encoding="utf-8")
        except OSError as exc:
            raise _about_the_file(
                source, f"cannot read {named}: {exc.strerror}"
            ) from None
        except UnicodeDecodeError:
            raise _about_the_file(source, f"{named} is not UTF-8 text") from None
        file = ConfigFile(named, text, source.label)
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
        ConfigError: the first invalid setting, named by its source.
    """
    in_file = _read_file(file) if file is not None else {}
    values: dict[str, object] = {}
    sources: dict[str, Source] = {}
    for s in SETTINGS:
        flag = None if s.env_only else flags.get(s.key)
        if flag is not None:
            # A boolean flag is named as written: --sync or --no-sync.
            source = Source(Layer.FLAG, s.flag if flag is not False else s.no_flag)
            values[s.field] = _value(s, source, from_flag, flag)
        elif environ.get(s.env) is not None:
            source = Source(Layer.ENV, s.env)
            values[s.field] = _value(s, source, from_text, environ[s.env])
        elif s.key in in_file:
            assert file is not None
            source = Source(Layer.FILE, f"{s.key} in {file.path}")
            values[s.field] = _value(s, source, from_toml, in_file[s.key])
        else:
            source = Source(Layer.DEFAULT, s.env if s.env_only else s.flag)
            values[s.field] = s.default
        sources[s.key] = source
    config = _build(values)
    try:
        config.validate()
    except ConfigError as exc:
        raise label(exc, sources) from None
    return Resolved(config, sources, _env_warnings(environ))


def label(error: ConfigError, sources: Mapping[str, Source]) -> ConfigError:
    """The error with each of its settings named by its source, as the user
    wrote it. An error already labelled, or about something that is no
    setting of the table, is returned as it is."""
    if error.sources or not error.settings:
        return error
    if any(key not in sources for key in error.settings):
        return error
    return error.labelled(tuple(sources[key] for key in error.settings))


def _value(s: Setting, source: Source, read: _Reader, raw: object) -> object:
    try:
        value = read(s, raw)
    except Invalid as exc:
        raise ConfigError(s.key, str(exc), sources=(source,)) from None
    if isinstance(value, int) and s.maximum is not None and value > s.maximum:
        raise ConfigError(s.key, f"must be at most {s.maximum}", sources=(source,))
    return value


def _about_the_file(source: Source, why: str) -> ConfigError:
    return ConfigError("config", why, sources=(source,))


def _read_file(file: ConfigFile) -> dict[str, object]:
    """The file's keys and their TOML values, each key a setting's; the
    values are read only for settings no higher layer sets."""
    try:
        doc = tomllib.loads(file.text)
    except tomllib.TOMLDecodeError as exc:
        layer = Layer.ENV if file.named_by == CONFIG_ENV else Layer.FLAG
        raise _about_the_file(
            Source(layer, file.named_by), f"{file.path} is not valid TOML: {exc}"
        ) from None
    try:
        return known("", doc, _FILE_FIELDS, unknown=_unknown_key)
    except FieldError as exc:
        raise ConfigError(
            exc.where,
            exc.why,
            sources=(Source(Layer.FILE, f"{exc.where} in {file.path}"),),
        ) from None


def _unknown_key(key: str) -> str:
    setting = BY_KEY.get(key)
    if setting is not None and setting.env_only:
        return (
            f"a secret; set it only in the environment ({setting.env}), or use "
            "tokens_file"
        )
    underscored = key.replace("-", "_")
    bare = underscored.removeprefix("no_")
    if bare != underscored and bare in BY_KEY and BY_KEY[bare].kind is Kind.BOOL:
        return f"not a setting; write {bare} = false"
    if underscored in BY_KEY:
        return f"not a setting; write {underscored} (with '_')"
    guess = difflib.get_close_matches(key, list(BY_KEY), n=1, cutoff=0.75)
    hint = f"; did you mean {guess[0]}?" if guess else ""
    return f"not a setting{hint}"


def _env_warnings(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Variables that look like misspelt settings. Warnings, not errors: the
    environment is shared with other programs, whose EFFECTD_* names the
    daemon cannot know."""
    known_names = {s.env for s in SETTINGS} | {CONFIG_ENV}
    found = []
    for name in sorted(environ):
        if (
            not name.startswith(ENV_PREFIX)
            or name in known_names
            or name in _CLIENT_ENV
        ):
            continue
        negated = ENV_PREFIX + name.removeprefix(ENV_PREFIX).removeprefix("NO_")
        if negated != name and negated in known_names:
            found.append(f"{name} is not a setting and is ignored; use {negated}=false")
            continue
        guess = difflib.get_close_matches(name, sorted(known_names), n=1, cutoff=0.85)
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
    for name, value in values.items():
        group, _, attribute = name.rpartition(".")
        {"": top, "server_limits": limits, "quotas": quotas}[group][attribute] = value
    return dataclasses.replace(
        DEFAULTS,
        server_limits=dataclasses.replace(ServerLimits(), **limits),
        quotas=dataclasses.replace(Quotas(), **quotas),
        **top,
    )
