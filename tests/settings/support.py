"""Helpers of the settings tests: the layers resolved from flags, an
environment and a file's text, as `effectd serve` would."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Mapping

import pytest

from sidecar import settings
from sidecar.cli import parser
from sidecar.config import ConfigError, ServeConfig
from sidecar.settings import ConfigFile

FILE = "effectd.toml"
SECRET = "correct-horse-battery-staple"


@functools.cache
def cached_parser() -> argparse.ArgumentParser:
    return parser()


def flags(*argv: str) -> dict[str, object]:
    return vars(cached_parser().parse_args(["serve", *argv]))


def layered(
    argv: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
    toml: str | None = None,
) -> settings.Resolved:
    file = None if toml is None else ConfigFile(FILE, toml)
    return settings.resolve(flags(*argv), env or {}, file)


def error_of(
    argv: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
    toml: str | None = None,
) -> str:
    with pytest.raises(ConfigError) as refused:
        layered(argv, env, toml)
    return str(refused.value)


def get(config: ServeConfig, field: str) -> object:
    value: object = config
    for part in field.split("."):
        value = getattr(value, part)
    return value
