"""Configuration layering of `effectd serve`: flags > EFFECTD_* environment >
TOML file > defaults, for every setting of the table."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sidecar import settings
from sidecar.cli import parser
from sidecar.config import ServeConfig, ServerLimits
from sidecar.ledger.quota import Quotas
from sidecar.settings import BY_KEY, SETTINGS, Layer
from tests.settings.support import FILE, error_of, get, layered

# (setting, flag text, env text, TOML value, and the value each one gives)
PRECEDENCE = [
    ("data_dir", "/f", "/e", '"/t"', (Path("/f"), Path("/e"), Path("/t"))),
    (
        "listen",
        "127.0.0.1:1",
        "[::1]:2",
        '"localhost:3"',
        ("127.0.0.1:1", "[::1]:2", "localhost:3"),
    ),
    ("max_message_size", "2MiB", "512k", "4096", (2 << 20, 512 << 10, 4096)),
    ("quota_open_calls", "1", "2", "3", (1, 2, 3)),
    ("log_format", "text", "json", '"text"', ("text", "json", "text")),
]


@pytest.mark.parametrize(("key", "flag", "env", "toml", "expected"), PRECEDENCE)
def test_each_layer_overrides_the_ones_below(
    key: str, flag: str, env: str, toml: str, expected: tuple[object, ...]
) -> None:
    """Flag beats variable beats file beats default, and the source says which."""
    s = BY_KEY[key]
    by_flag, by_env, by_file = expected
    file = f"{key} = {toml}\n"
    rows = [
        ((s.flag, flag), {s.env: env}, file, by_flag, Layer.FLAG),
        ((), {s.env: env}, file, by_env, Layer.ENV),
        ((), {}, file, by_file, Layer.FILE),
        ((), {}, None, s.default, Layer.DEFAULT),
    ]
    for argv, environ, text, value, layer in rows:
        resolved = layered(argv, environ, text)
        assert get(resolved.config, s.field) == value
        assert resolved.sources[key].layer is layer


def test_boolean_precedence_in_both_directions() -> None:
    """--sync can undo EFFECTD_SYNC=false, and --no-sync a file's sync = true."""
    assert layered(("--sync",), {"EFFECTD_SYNC": "false"}).config.sync is True
    assert layered(("--no-sync",), {}, "sync = true").config.sync is False
    assert layered((), {"EFFECTD_SYNC": "no"}, "sync = true").config.sync is False
    assert layered((), {}, "sync = false").config.sync is False
    assert layered().config.sync is True
    off = layered(("--no-reflection",), {"EFFECTD_REFLECTION": "yes"})
    assert off.config.reflection is False
    assert off.sources["reflection"].label == "--no-reflection"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("true", True),
        ("1", True),
        ("YES", True),
        ("false", False),
        ("0", False),
        ("no", False),
    ],
)
def test_boolean_words(text: str, value: bool) -> None:
    """Variables and file strings read true/false/1/0/yes/no."""
    assert layered((), {"EFFECTD_SYNC": text}).config.sync is value
    assert layered((), {}, f'sync = "{text}"').config.sync is value


@pytest.mark.parametrize(
    ("toml", "value"),
    [("true", True), ("false", False), ("1", True), ("0", False)],
)
def test_boolean_toml_values(toml: str, value: bool) -> None:
    assert layered((), {}, f"reflection = {toml}").config.reflection is value


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("8MiB", 8 << 20),
        ("8M", 8 << 20),
        ("512k", 512 << 10),
        ("512KB", 512 << 10),
        ("1.5g", 3 << 29),
        ("4096", 4096),
        (" 2 GiB ", 2 << 30),
    ],
)
def test_sizes(text: str, size: int) -> None:
    """A size is plain bytes or a number with a binary unit, in every layer."""
    env = {"EFFECTD_QUOTA_STORED_BYTES": text}
    assert layered(("--quota-stored-bytes", text)).config.quotas.stored_bytes == size
    assert layered((), env).config.quotas.stored_bytes == size
    toml = f'quota_stored_bytes = "{text}"'
    assert layered((), {}, toml).config.quotas.stored_bytes == size


@pytest.mark.parametrize("size", [0, 1, 1023, 1024, 3 << 20, 5 << 30, (1 << 40) + 1])
def test_format_size_reads_back(size: int) -> None:
    assert settings.parse_size(settings.format_size(size)) == size


def test_an_empty_value_unsets_an_optional_setting() -> None:
    """`--listen ""` turns off the listener the file configures."""
    toml = 'listen = "127.0.0.1:5"'
    assert layered(("--listen", ""), {}, toml).config.listen is None
    assert layered((), {"EFFECTD_LISTEN": ""}, toml).config.listen is None
    assert layered((), {}, toml).config.listen == "127.0.0.1:5"


# One valid, non-default value of every setting, as text and as its value.
SAMPLES: dict[str, tuple[str, object]] = {
    "data_dir": ("/srv/effectd", Path("/srv/effectd")),
    "init": ("true", True),
    "socket": ("/run/effectd/e.sock", Path("/run/effectd/e.sock")),
    "store": ("postgresql://db/ledger", "postgresql://db/ledger"),
    "listen": ("[::1]:7000", "[::1]:7000"),
    "map_size": ("2GiB", 2 << 30),
    "sync": ("false", False),
    "grace": ("2.5", 2.5),
    "reflection": ("no", False),
    "local_frames": ("no", False),
    "policy": ("policy.toml", Path("policy.toml")),
    "providers": ("providers.toml", Path("providers.toml")),
    "retention_interval": ("30", 30.0),
    "settle_interval": ("2.5", 2.5),
    "daemon_id": ("agent-7", "agent-7"),
    "registration_ttl": ("20", 20.0),
    "tokens_file": ("tokens.toml", Path("tokens.toml")),
    "tokens": ("[[token]]\n", "[[token]]\n"),
    "tls_cert": ("cert.pem", Path("cert.pem")),
    "tls_key": ("key.pem", Path("key.pem")),
    "tls_client_ca": ("ca.pem", Path("ca.pem")),
    "health_listen": ("0.0.0.0:8081", "0.0.0.0:8081"),
    "metrics_listen": ("127.0.0.1:9090", "127.0.0.1:9090"),
    "log_format": ("text", "text"),
    "log_level": ("WARNING", "warning"),
    "otel": ("true", True),
    "max_message_size": ("16MiB", 16 << 20),
    "max_concurrent_rpcs": ("64", 64),
    "max_concurrent_rpcs_per_caller": ("16", 16),
    "max_concurrent_streams": ("16", 16),
    "session_max_in_flight": ("8", 8),
    "handshake_timeout": ("1.5", 1.5),
    "default_deadline": ("20", 20.0),
    "min_ping_interval": ("8", 8.0),
    "max_connection_idle": ("180", 180.0),
    "quota_open_calls": ("50", 50),
    "quota_stored_bytes": ("64MiB", 64 << 20),
    "quota_requests_per_second": ("12.5", 12.5),
    "quota_burst": ("25", 25),
}
# TLS needs a key, a certificate and a TCP listener together.
COMPANIONS = {
    "EFFECTD_TLS_CERT": "c.pem",
    "EFFECTD_TLS_KEY": "k.pem",
    "EFFECTD_LISTEN": "127.0.0.1:0",
}


def test_the_table_covers_every_field_of_the_configuration() -> None:
    """Each field of ServeConfig (but the ledger's input limits) is a setting,
    so no field can be added without a flag, a variable and a file key."""
    fields = {f.name for f in dataclasses.fields(ServeConfig)} - {
        "server_limits",
        "quotas",
        "limits",
    }
    fields |= {f"server_limits.{f.name}" for f in dataclasses.fields(ServerLimits)}
    fields |= {f"quotas.{f.name}" for f in dataclasses.fields(Quotas)}
    assert {s.field for s in SETTINGS} == fields
    assert set(SAMPLES) == set(BY_KEY)


@pytest.mark.parametrize("key", list(BY_KEY))
@pytest.mark.parametrize("layer", [Layer.FLAG, Layer.ENV, Layer.FILE])
def test_every_setting_is_read_from_every_layer(key: str, layer: Layer) -> None:
    """Every setting has its flag, variable and file key (EFFECTD_TOKENS only
    the variable: a secret belongs neither in argv nor in a file)."""
    s = BY_KEY[key]
    text, value = SAMPLES[key]
    env = {k: v for k, v in COMPANIONS.items() if k != s.env}
    argv: tuple[str, ...] = ()
    toml = None
    if s.env_only and layer is not Layer.ENV:
        if layer is Layer.FLAG:
            with pytest.raises(SystemExit):
                parser().parse_args(["serve", s.flag, text])
        else:
            assert error_of((), env, f"{key} = {text!r}").startswith(
                f"{key} in {FILE}:"
            )
        return
    if layer is Layer.FLAG:
        if s.kind is not settings.Kind.BOOL:
            argv = (s.flag, text)
        else:
            argv = (s.flag,) if value else (f"--no-{s.flag.removeprefix('--')}",)
    elif layer is Layer.ENV:
        env[s.env] = text
    else:
        toml = f"{key} = {_toml_literal(s, text)}"
    resolved = layered(argv, env, toml)
    assert get(resolved.config, s.field) == value
    assert resolved.sources[key].layer is layer


def _toml_literal(s: settings.Setting, text: str) -> str:
    if s.kind in (settings.Kind.INT, settings.Kind.FLOAT):
        return text
    return json.dumps(text)


# (flags, environment, file; the label the message starts with, and a fragment)
def test_a_tls_listener_may_be_any_address() -> None:
    """With TLS and tokens, the TCP listener may face other machines."""
    resolved = layered(
        ("--listen", "0.0.0.0:443", "--tls-cert", "c", "--tls-key", "k"),
        {"EFFECTD_TOKENS_FILE": "tokens.toml"},
    )
    assert resolved.config.listen == "0.0.0.0:443"


def test_misspelt_variables_are_warned_about() -> None:
    """A near-miss of a setting's variable is reported; a client's own
    variables (EFFECTD_TOKEN) and unrelated ones are not."""
    resolved = layered(
        (),
        {
            "EFFECTD_QUOTA_OPEN_CALL": "5",
            "EFFECTD_NO_SYNC": "1",
            "EFFECTD_TOKEN": "client-side",
            "EFFECTD_PYTHON": "python3",
            "HOME": "/root",
        },
    )
    assert resolved.warnings == (
        "EFFECTD_NO_SYNC is not a setting and is ignored; use EFFECTD_SYNC=false",
        "EFFECTD_QUOTA_OPEN_CALL is not a setting and is ignored; "
        "did you mean EFFECTD_QUOTA_OPEN_CALLS?",
    )
