"""`--print-config`: the effective configuration as TOML that `--config`
reads back to the same `ServeConfig`, each line commented with its source.
Secrets and unset values are written as comments, so reading the output back
leaves them unset.
"""

from __future__ import annotations

from sidecar.config import Layer, Source, masked_url
from sidecar.settings.layers import Resolved
from sidecar.settings.table import SETTINGS, Kind, Setting, value_of
from sidecar.settings.values import format_size

MASK = "***"


def render(resolved: Resolved) -> str:
    """The configuration as TOML, each value's source in a comment (`flag`,
    `env EFFECTD_X`, `file`, `default`), secrets masked."""
    lines = [
        "# effectd serve: the effective configuration.",
        "# Flags win over EFFECTD_* variables, which win over this file; then the",
        "# defaults. Read it back with: effectd serve --config FILE",
    ]
    for s in SETTINGS:
        value = value_of(resolved.config, s.field)
        comment = _comment(resolved.sources[s.key])
        if value is None:
            entry = f"# {s.key}: not set"
        elif s.secret:
            entry = f"# {s.key} = {toml_string(MASK)}"
            comment += ", masked" + (" (environment only)" if s.env_only else "")
        elif s.url and isinstance(value, str) and masked_url(value) != value:
            entry = f"# {s.key} = {toml_string(masked_url(value))}"
            comment += ", password masked"
        elif s.env_only:
            entry = f"# {s.key} = {_toml(s, value)}"
            comment += " (environment only)"
        else:
            entry = f"{s.key} = {_toml(s, value)}"
        lines.append(f"{entry:<40}  # {comment}")
    return "\n".join(lines) + "\n"


def toml_string(text: str) -> str:
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


def _comment(source: Source) -> str:
    if source.layer is Layer.ENV:
        return f"env {source.label}"
    return source.layer.name.lower()


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
        return str(value) if shown.isdigit() else toml_string(shown)
    if s.kind is Kind.INT:
        assert isinstance(value, int)
        return str(value)
    return toml_string(str(value))
