"""The flags of `effectd serve`: `--config`, `--print-config` and one flag
per setting of the table, with the help text that explains the layers.
"""

from __future__ import annotations

import argparse

from sidecar.settings.table import CONFIG_ENV, SETTINGS, Kind, Setting
from sidecar.settings.values import format_size

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


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Adds `--config`, `--print-config` and one flag per setting to `serve`.

    Flags are read as text and converted by `sidecar.settings.values`, not by
    argparse, so a bad flag fails like a bad variable or file key:
    `effectd: --flag: why`, exit 2.
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
