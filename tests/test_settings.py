"""Configuration layering of `effectd serve`: flags > EFFECTD_* environment >
TOML file > defaults; errors that name the setting as the user wrote it;
`--print-config` that reads back to the same configuration, secrets masked."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
import secrets
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path

import pytest

from sidecar import settings
from sidecar.cli import main, parser
from sidecar.config import ConfigError, ServeConfig, ServerLimits
from sidecar.ledger.quota import Quotas
from sidecar.settings import BY_KEY, SETTINGS, ConfigFile, Layer

FILE = "effectd.toml"
SECRET = "correct-horse-battery-staple"


@functools.cache
def _parser() -> argparse.ArgumentParser:
    return parser()


def _flags(*argv: str) -> dict[str, object]:
    return vars(_parser().parse_args(["serve", *argv]))


def _resolve(
    argv: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
    toml: str | None = None,
) -> settings.Resolved:
    file = None if toml is None else ConfigFile(FILE, toml)
    return settings.resolve(_flags(*argv), env or {}, file)


def _error(
    argv: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
    toml: str | None = None,
) -> str:
    with pytest.raises(ConfigError) as refused:
        _resolve(argv, env, toml)
    return str(refused.value)


def _get(config: ServeConfig, field: str) -> object:
    value: object = config
    for part in field.split("."):
        value = getattr(value, part)
    return value


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
        resolved = _resolve(argv, environ, text)
        assert _get(resolved.config, s.field) == value
        assert resolved.sources[key].layer is layer


def test_boolean_precedence_in_both_directions() -> None:
    """--sync can undo EFFECTD_SYNC=false, and --no-sync a file's sync = true."""
    assert _resolve(("--sync",), {"EFFECTD_SYNC": "false"}).config.sync is True
    assert _resolve(("--no-sync",), {}, "sync = true").config.sync is False
    assert _resolve((), {"EFFECTD_SYNC": "no"}, "sync = true").config.sync is False
    assert _resolve((), {}, "sync = false").config.sync is False
    assert _resolve().config.sync is True
    off = _resolve(("--no-reflection",), {"EFFECTD_REFLECTION": "yes"})
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
    assert _resolve((), {"EFFECTD_SYNC": text}).config.sync is value
    assert _resolve((), {}, f'sync = "{text}"').config.sync is value


@pytest.mark.parametrize(
    ("toml", "value"),
    [("true", True), ("false", False), ("1", True), ("0", False)],
)
def test_boolean_toml_values(toml: str, value: bool) -> None:
    assert _resolve((), {}, f"reflection = {toml}").config.reflection is value


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
    assert _resolve(("--quota-stored-bytes", text)).config.quotas.stored_bytes == size
    assert _resolve((), env).config.quotas.stored_bytes == size
    toml = f'quota_stored_bytes = "{text}"'
    assert _resolve((), {}, toml).config.quotas.stored_bytes == size


@pytest.mark.parametrize("size", [0, 1, 1023, 1024, 3 << 20, 5 << 30, (1 << 40) + 1])
def test_format_size_reads_back(size: int) -> None:
    assert settings.parse_size(settings.format_size(size)) == size


def test_an_empty_value_unsets_an_optional_setting() -> None:
    """`--listen ""` turns off the listener the file configures."""
    toml = 'listen = "127.0.0.1:5"'
    assert _resolve(("--listen", ""), {}, toml).config.listen is None
    assert _resolve((), {"EFFECTD_LISTEN": ""}, toml).config.listen is None
    assert _resolve((), {}, toml).config.listen == "127.0.0.1:5"


# One valid, non-default value of every setting, as text and as its value.
SAMPLES: dict[str, tuple[str, object]] = {
    "data_dir": ("/srv/effectd", Path("/srv/effectd")),
    "socket": ("/run/effectd/e.sock", Path("/run/effectd/e.sock")),
    "listen": ("[::1]:7000", "[::1]:7000"),
    "map_size": ("2GiB", 2 << 30),
    "sync": ("false", False),
    "grace": ("2.5", 2.5),
    "reflection": ("no", False),
    "policy": ("policy.toml", Path("policy.toml")),
    "providers": ("providers.toml", Path("providers.toml")),
    "retention_interval": ("30", 30.0),
    "settle_interval": ("2.5", 2.5),
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
            assert _error((), env, f"{key} = {text!r}").startswith(f"{key} in {FILE}:")
        return
    if layer is Layer.FLAG:
        if s.kind is not settings.Kind.BOOL:
            argv = (s.flag, text)
        else:
            argv = (s.flag,) if value else (f"--no-{key}",)
    elif layer is Layer.ENV:
        env[s.env] = text
    else:
        toml = f"{key} = {_toml_literal(s, text)}"
    resolved = _resolve(argv, env, toml)
    assert _get(resolved.config, s.field) == value
    assert resolved.sources[key].layer is layer


def _toml_literal(s: settings.Setting, text: str) -> str:
    if s.kind in (settings.Kind.INT, settings.Kind.FLOAT):
        return text
    return json.dumps(text)


# (flags, environment, file; the label the message starts with, and a fragment)
ERRORS = [
    ((), {"EFFECTD_QUOTA_OPEN_CALLS": "abc"}, None, "EFFECTD_QUOTA_OPEN_CALLS", "abc"),
    (("--quota-open-calls", "-1"), {}, None, "--quota-open-calls", "negative"),
    ((), {}, "quota_open_calls = -1", f"quota_open_calls in {FILE}", "negative"),
    ((), {}, "quota_burst = -3", f"quota_burst in {FILE}", "negative"),
    ((), {"EFFECTD_QUOTA_REQUESTS_PER_SECOND": "-1"}, None, "EFFECTD_QUOTA_", "neg"),
    ((), {}, "quota_open_call = 1", f"quota_open_call in {FILE}", "quota_open_calls?"),
    ((), {}, "data-dir = 'd'", f"data-dir in {FILE}", "write data_dir"),
    ((), {}, "no_sync = true", f"no_sync in {FILE}", "sync = false"),
    ((), {}, "[server]\nlisten = 'x'", f"server in {FILE}", "not a setting"),
    ((), {}, "max_concurrent_rpcs = 'many'", "max_concurrent_rpcs in", "an integer"),
    ((), {}, "max_concurrent_rpcs = 0", "max_concurrent_rpcs in", "at least 1"),
    ((), {}, "max_concurrent_rpcs = 1.5", "max_concurrent_rpcs in", "not a float"),
    ((), {}, "quota_burst = true", "quota_burst in", "not a boolean"),
    ((), {}, "grace = '5'", f"grace in {FILE}", "a number, not a string"),
    ((), {}, "data_dir = 5", f"data_dir in {FILE}", "a path, not an integer"),
    ((), {}, "listen = [1]", f"listen in {FILE}", "not an array"),
    ((), {}, "policy = 2026-12-02", f"policy in {FILE}", "not a date or time"),
    ((), {}, "sync = 'maybe'", f"sync in {FILE}", "boolean"),
    ((), {}, "sync = 2", f"sync in {FILE}", "boolean"),
    ((), {}, "tokens = 'x'", f"tokens in {FILE}", "EFFECTD_TOKENS"),
    ((), {}, "sync = ", "--config", "not valid TOML"),
    ((), {"EFFECTD_SYNC": "maybe"}, None, "EFFECTD_SYNC", "'maybe'"),
    ((), {"EFFECTD_MAX_MESSAGE_SIZE": "lots"}, None, "EFFECTD_MAX_MESSAGE_SIZE", "siz"),
    (("--max-message-size", "4GiB"), {}, None, "--max-message-size", "at most"),
    (("--max-message-size", "100"), {}, None, "--max-message-size", "at least"),
    (("--map-size", "12"), {}, None, "--map-size", "at least 1 MiB"),
    ((), {"EFFECTD_MAP_SIZE": "inf k"}, None, "EFFECTD_MAP_SIZE", "not a size"),
    ((), {"EFFECTD_GRACE": "inf"}, None, "EFFECTD_GRACE", "finite"),
    ((), {}, "grace = nan", f"grace in {FILE}", "finite"),
    (("--grace", "-1"), {}, None, "--grace", "negative"),
    (("--handshake-timeout", "0"), {}, None, "--handshake-timeout", "at least"),
    ((), {}, "default_deadline = 0", "default_deadline in", "at least"),
    (("--retention-interval", "0"), {}, None, "--retention-interval", "positive"),
    ((), {}, "settle_interval = -1", "settle_interval in", "positive"),
    (("--log-format", "xml"), {}, None, "--log-format", "json, text"),
    ((), {"EFFECTD_LOG_LEVEL": "loud"}, None, "EFFECTD_LOG_LEVEL", "debug"),
    ((), {"EFFECTD_DATA_DIR": ""}, None, "EFFECTD_DATA_DIR", "empty"),
    ((), {"EFFECTD_LISTEN": "0.0.0.0:1"}, None, "EFFECTD_LISTEN", "loopback"),
    (("--listen", "10.0.0.1:1"), {}, None, "--listen", "tls-cert"),
    ((), {}, "listen = '127.0.0.1'", f"listen in {FILE}", "HOST:PORT"),
    ((), {}, "health_listen = 'x'", f"health_listen in {FILE}", "HOST:PORT"),
    (("--metrics-listen", "0.0.0.0:9"), {}, None, "--metrics-listen", "loopback"),
    ((), {}, "tls_cert = 'c'", f"tls_cert in {FILE} and --tls-key", "both"),
    (("--tls-client-ca", "ca"), {}, None, "--tls-client-ca", "needs"),
]


@pytest.mark.parametrize(("argv", "env", "toml", "label", "fragment"), ERRORS)
def test_errors_name_the_setting_as_the_user_wrote_it(
    argv: tuple[str, ...],
    env: dict[str, str],
    toml: str | None,
    label: str,
    fragment: str,
) -> None:
    """A flag is named as a flag, a variable as a variable, a key with its file."""
    message = _error(argv, env, toml)
    assert message.startswith(label)
    assert ": " in message
    assert fragment in message


@pytest.mark.parametrize(
    "s", [s for s in SETTINGS if s.kind not in (settings.Kind.PATH, settings.Kind.TEXT)]
)
def test_garbage_in_any_typed_setting_is_refused_with_its_name(
    s: settings.Setting,
) -> None:
    """Every number, size and boolean refuses nonsense, in every layer (a
    boolean flag takes no value to get wrong)."""
    assert _error((), {s.env: "garbage"}).startswith(f"{s.env}: ")
    if s.kind is not settings.Kind.BOOL:
        assert _error((s.flag, "garbage")).startswith(f"{s.flag}: ")
    assert _error((), {}, f"{s.key} = {{}}").startswith(f"{s.key} in {FILE}: must be")


def test_a_tls_listener_may_be_any_address() -> None:
    """With TLS and tokens, the TCP listener may face other machines."""
    resolved = _resolve(
        ("--listen", "0.0.0.0:443", "--tls-cert", "c", "--tls-key", "k"),
        {"EFFECTD_TOKENS_FILE": "tokens.toml"},
    )
    assert resolved.config.listen == "0.0.0.0:443"


def test_errors_raised_at_start_are_relabelled() -> None:
    """The tokens file's errors (raised by the daemon when it loads it) name
    the variable or key that pointed at it."""
    resolved = _resolve((), {"EFFECTD_TOKENS_FILE": "/t"})
    message = "tokens-file /t: mode 0644 lets others read it"
    assert settings.relabel(message, resolved.sources) == (
        "EFFECTD_TOKENS_FILE /t: mode 0644 lets others read it"
    )
    assert settings.relabel("routes.x: bad", resolved.sources) == "routes.x: bad"
    assert settings.relabel("no colon here", resolved.sources) == "no colon here"


def test_misspelt_variables_are_warned_about() -> None:
    """A near-miss of a setting's variable is reported; a client's own
    variables (EFFECTD_TOKEN) and unrelated ones are not."""
    resolved = _resolve(
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


def _many_layers() -> settings.Resolved:
    """A configuration with values from every layer."""
    argv = (
        *("--data-dir", '/srv/"quoted" \\ dir\tand\x7f é'),
        *("--listen", "127.0.0.1:7000", "--no-sync", "--quota-open-calls", "7"),
        *("--max-message-size", "1000000"),
    )
    env = {
        "EFFECTD_TOKENS": f"[[token]]\nsecret = '{SECRET}'\n",
        "EFFECTD_LOG_FORMAT": "text",
        "EFFECTD_GRACE": "1e-05",
        "EFFECTD_QUOTA_STORED_BYTES": "3GiB",
    }
    toml = (
        'tokens_file = "tok.toml"\nmetrics_listen = "127.0.0.1:9090"\n'
        "retention_interval = 30\nquota_requests_per_second = 2.5\n"
        "reflection = false\nmax_connection_idle = 1e16\n"
    )
    return _resolve(argv, env, toml)


def test_print_config_reads_back_to_the_same_configuration() -> None:
    """--print-config's output, given to --config, rebuilds the configuration
    (all but the environment-only secret, which it never writes)."""
    resolved = _many_layers()
    text = settings.render(resolved)
    again = _resolve((), {}, text)
    assert again.config == dataclasses.replace(resolved.config, tokens_text=None)
    assert resolved.config.tokens_text is not None
    for s in SETTINGS:
        unset = s.env_only or _get(again.config, s.field) is None
        assert again.sources[s.key].layer is (Layer.DEFAULT if unset else Layer.FILE)


def _lines(text: str) -> dict[str, str]:
    """Each setting's line of a --print-config output, by key (commented
    lines too: `# listen: not set`, `# tokens = "***"`)."""
    found = {}
    for line in text.splitlines():
        key = line.removeprefix("# ").split(" ")[0].rstrip(":")
        if key in BY_KEY:
            found[key] = line
    return found


def test_print_config_says_where_each_value_came_from() -> None:
    lines = _lines(settings.render(_many_layers()))
    assert set(lines) == set(BY_KEY)
    comment = {key: line.rpartition("  # ")[2] for key, line in lines.items()}
    assert comment["data_dir"] == "flag"
    assert comment["log_format"] == "env EFFECTD_LOG_FORMAT"
    assert comment["tokens_file"] == "file"
    assert comment["map_size"] == "default"
    assert comment["tokens"] == "env EFFECTD_TOKENS, masked (environment only)"
    assert lines["listen"].startswith('listen = "127.0.0.1:7000"')
    assert lines["socket"].startswith("# socket: not set")


def test_print_config_reads_back_random_values() -> None:
    """Paths and numbers drawn at random survive the round trip."""
    seed = secrets.randbits(32)
    print(f"seed={seed}")
    rng = random.Random(seed)  # noqa: S311 - reproducible draws
    for _ in range(50):
        resolved = _resolve(*_random_layers(rng))
        again = _resolve((), {}, settings.render(resolved))
        assert again.config == dataclasses.replace(resolved.config, tokens_text=None)


def test_the_round_trip_catches_a_broken_writer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Negative control: a writer that forgets to escape strings is caught by
    the same round trip within the same random draws."""
    monkeypatch.setattr(settings, "_toml_string", lambda text: f'"{text}"')
    rng = random.Random(1)  # noqa: S311 - reproducible draws
    failures = 0
    for _ in range(50):
        resolved = _resolve(*_random_layers(rng))
        try:
            again = _resolve((), {}, settings.render(resolved))
        except ConfigError:
            failures += 1
            continue
        failures += again.config != dataclasses.replace(
            resolved.config, tokens_text=None
        )
    assert failures > 0


def _random_layers(
    rng: random.Random,
) -> tuple[tuple[str, ...], dict[str, str], str | None]:
    alphabet = 'ab/ "\\\t\x01\x7fé\u2028.'
    path = "/" + "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 12)))
    argv: list[str] = ["--policy", path]
    env = {
        "EFFECTD_QUOTA_OPEN_CALLS": str(rng.randrange(0, 1 << 40)),
        "EFFECTD_GRACE": repr(rng.uniform(0, 1e6)),
        "EFFECTD_MAP_SIZE": str(rng.randrange(1 << 20, 1 << 44)),
    }
    toml = f"quota_requests_per_second = {rng.expovariate(1.0)!r}\n"
    if rng.random() < 0.5:
        argv += ["--no-sync"]
    return tuple(argv), env, toml


def _leaks(text: str, values: tuple[str, ...]) -> list[str]:
    return [v for v in values if v in text]


def test_print_config_masks_secrets() -> None:
    """The tokens text is shown as "***", never its content."""
    text = settings.render(_many_layers())
    assert _leaks(text, (SECRET,)) == []
    assert '# tokens = "***"' in text


def test_the_leak_check_catches_an_unmasked_print(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Negative control: with masking off, the same check finds the secret."""
    monkeypatch.setattr(settings.Setting, "secret", property(lambda self: False))
    assert _leaks(settings.render(_many_layers()), (SECRET,)) == [SECRET]


@pytest.mark.parametrize(
    ("key", "kind", "secret"),
    [
        ("tokens", settings.Kind.TEXT, True),
        ("api_key", settings.Kind.TEXT, True),
        ("client_secret", settings.Kind.TEXT, True),
        ("tls_key", settings.Kind.PATH, False),
        ("tokens_file", settings.Kind.PATH, False),
        ("listen", settings.Kind.TEXT, False),
    ],
)
def test_what_counts_as_a_secret(key: str, kind: settings.Kind, secret: bool) -> None:
    """Values named like a secret, token or key are masked; paths are not:
    they say where a secret is, and its file's mode protects it."""
    assert settings.Setting(key, kind, "").secret is secret


def test_main_prints_the_configuration_and_starts_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--print-config` exits 0; `EFFECTD_CONFIG` names the file when
    `--config` does not, and the flag wins over it."""
    for name in list(os.environ):
        if name.startswith("EFFECTD_"):
            monkeypatch.delenv(name)
    one, two = tmp_path / "one.toml", tmp_path / "two.toml"
    one.write_text("quota_burst = 1\n")
    two.write_text("quota_burst = 2\n")
    monkeypatch.setenv("EFFECTD_CONFIG", str(one))
    data = tmp_path / "never"
    assert main(["serve", "--data-dir", str(data), "--print-config"]) == 0
    assert tomllib.loads(capsys.readouterr().out)["quota_burst"] == 1
    assert main(["serve", "--config", str(two), "--print-config"]) == 0
    assert tomllib.loads(capsys.readouterr().out)["quota_burst"] == 2
    assert not data.exists()
    assert main(["serve", "--config", str(tmp_path / "none.toml")]) == 2
    assert capsys.readouterr().err.startswith("effectd: --config: cannot read")
    one.write_bytes(b"\xff")
    assert main(["serve"]) == 2
    assert "EFFECTD_CONFIG: " in capsys.readouterr().err


def _effectd(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECTD_")}
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "serve", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_command_prints_its_configuration_and_refuses_a_bad_one(
    tmp_path: Path,
) -> None:
    """As a process: --print-config exits 0 with TOML on stdout; an invalid
    setting exits 2 with `effectd: <setting>: <why>` on stderr."""
    shown = _effectd(tmp_path, "--print-config", "--quota-open-calls", "5")
    assert shown.returncode == 0, shown.stderr
    assert tomllib.loads(shown.stdout)["quota_open_calls"] == 5
    assert not (tmp_path / ".effectd").exists()
    refused = _effectd(tmp_path, "--quota-open-calls", "-1")
    assert refused.returncode == 2
    assert refused.stderr.startswith(
        "effectd: --quota-open-calls: must not be negative"
    )
