"""Errors of `effectd serve`'s settings: each names the setting as the user
wrote it, in its message and in its fields."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sidecar import settings
from sidecar.cli import main
from sidecar.config import ENV_ONLY, ConfigError
from sidecar.settings import SETTINGS, Layer, Source
from tests.settings.support import FILE, error_of, layered

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
    (("--metrics-listen", "9464"), {}, None, "--metrics-listen", "HOST:PORT"),
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
    message = error_of(argv, env, toml)
    assert message.startswith(label)
    assert ": " in message
    assert fragment in message


# (flags, environment, file; the setting, its source, and the reason)
FIELDS = [
    # Read by the setting's kind.
    (
        ("--quota-burst", "many"),
        {"EFFECTD_QUOTA_BURST": "1"},
        None,
        "quota_burst",
        Source(Layer.FLAG, "--quota-burst"),
        "'many' is not an integer",
    ),
    (
        (),
        {"EFFECTD_QUOTA_BURST": "many"},
        "quota_burst = 1",
        "quota_burst",
        Source(Layer.ENV, "EFFECTD_QUOTA_BURST"),
        "'many' is not an integer",
    ),
    (
        (),
        {},
        "quota_burst = 'many'",
        "quota_burst",
        Source(Layer.FILE, f"quota_burst in {FILE}"),
        "must be an integer, not a string",
    ),
    # Validated once the layers are applied.
    (
        ("--max-message-size", "100"),
        {},
        None,
        "max_message_size",
        Source(Layer.FLAG, "--max-message-size"),
        "must be at least 1024",
    ),
    (
        (),
        {"EFFECTD_LISTEN": "127.0.0.1"},
        None,
        "listen",
        Source(Layer.ENV, "EFFECTD_LISTEN"),
        "'127.0.0.1' is not HOST:PORT",
    ),
    (
        (),
        {},
        "quota_burst = -1",
        "quota_burst",
        Source(Layer.FILE, f"quota_burst in {FILE}"),
        "must not be negative",
    ),
    # A key of the file that is no setting.
    (
        (),
        {},
        "quota_open_call = 1",
        "quota_open_call",
        Source(Layer.FILE, f"quota_open_call in {FILE}"),
        "not a setting; did you mean quota_open_calls?",
    ),
]


@pytest.mark.parametrize(("argv", "env", "toml", "key", "source", "why"), FIELDS)
def test_an_error_names_its_setting_and_source_in_fields(  # noqa: PLR0917 - columns
    argv: tuple[str, ...],
    env: dict[str, str],
    toml: str | None,
    key: str,
    source: Source,
    why: str,
) -> None:
    """A bad flag, variable or file key is a ConfigError whose fields name
    the setting and the layer it came from; its message is built from them
    (issue 11 item 5: fails before the change: the error had only a message,
    and the layers rewrote its text)."""
    with pytest.raises(ConfigError) as refused:
        layered(argv, env, toml)
    error = refused.value
    assert (error.setting, error.source, error.why) == (key, source, why)
    assert str(error) == f"{source.label}: {why}"


@pytest.mark.parametrize(
    "s", [s for s in SETTINGS if s.kind not in (settings.Kind.PATH, settings.Kind.TEXT)]
)
def test_garbage_in_any_typed_setting_is_refused_with_its_name(
    s: settings.Setting,
) -> None:
    """Every number, size and boolean refuses nonsense, in every layer (a
    boolean flag takes no value to get wrong)."""
    assert error_of((), {s.env: "garbage"}).startswith(f"{s.env}: ")
    if s.kind is not settings.Kind.BOOL:
        assert error_of((s.flag, "garbage")).startswith(f"{s.flag}: ")
    assert error_of((), {}, f"{s.key} = {{}}").startswith(f"{s.key} in {FILE}: must be")


def test_errors_raised_at_start_are_labelled() -> None:
    """The tokens file's errors (raised by the daemon when it loads it) name
    the variable or key that pointed at it, from the error's fields."""
    resolved = layered((), {"EFFECTD_TOKENS_FILE": "/t"})
    error = ConfigError("tokens_file", "mode 0644 lets others read it", detail="/t")
    assert str(error) == "tokens-file /t: mode 0644 lets others read it"
    labelled = settings.label(error, resolved.sources)
    assert str(labelled) == "EFFECTD_TOKENS_FILE /t: mode 0644 lets others read it"
    assert (labelled.setting, labelled.source, labelled.detail) == (
        "tokens_file",
        Source(Layer.ENV, "EFFECTD_TOKENS_FILE"),
        "/t",
    )
    both = ConfigError(("tls-cert", "tls_key"), "set both or neither")
    assert str(settings.label(both, resolved.sources)) == (
        "--tls-cert and --tls-key: set both or neither"
    )
    # About no setting of the table: left as it is.
    other = ConfigError("routes.x", "bad")
    assert settings.label(other, resolved.sources) is other
    assert str(ConfigError((), "no setting")) == "no setting"


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


def test_an_unlabelled_error_names_an_environment_only_setting_by_its_variable() -> (
    None
):
    """Before the layers label it (a daemon started in-process), an error
    names a setting by its key, dashed, or, for a setting only the
    environment holds, by its variable; `ENV_ONLY` agrees with the table."""
    assert {s.key: s.env for s in SETTINGS if s.env_only} == ENV_ONLY
    assert str(ConfigError(("tokens_file", "tokens"), "set one, not both")) == (
        "tokens-file and EFFECTD_TOKENS: set one, not both"
    )


def test_an_error_raised_at_start_is_named_as_the_user_wrote_it(
    short_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A tokens file others may read stops the daemon with exit 2, named by
    the flag, variable or file key that pointed at it (its error's fields,
    labelled by the layers)."""
    for name in list(os.environ):
        if name.startswith("EFFECTD_"):
            monkeypatch.delenv(name)
    tokens = short_tmp / "tokens.toml"
    tokens.write_text("")
    tokens.chmod(0o644)
    config = short_tmp / "effectd.toml"
    config.write_text(f"tokens_file = {str(tokens)!r}\n")
    data = str(short_tmp / "d")
    monkeypatch.setenv("EFFECTD_INIT", "true")
    why = f"{tokens}: mode 0644 lets others read it; chmod 600 it"
    umask = os.umask(0o077)
    try:
        assert main(["serve", "--data-dir", data, "--tokens-file", str(tokens)]) == 2
        assert (
            capsys.readouterr().err.splitlines()[-1] == f"effectd: --tokens-file {why}"
        )
        assert main(["serve", "--data-dir", data, "--config", str(config)]) == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"effectd: tokens_file in {config} {why}"
        )
        monkeypatch.setenv("EFFECTD_TOKENS_FILE", str(tokens))
        assert main(["serve", "--data-dir", data]) == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"effectd: EFFECTD_TOKENS_FILE {why}"
        )
    finally:
        os.umask(umask)
