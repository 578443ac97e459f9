"""`--print-config`: it reads back to the same configuration, says where each
value came from, and masks secrets."""

from __future__ import annotations

import dataclasses
import random
import secrets

import pytest

from sidecar import settings
from sidecar.config import ConfigError
from sidecar.settings import BY_KEY, SETTINGS, Layer, printing
from tests.settings.support import SECRET, get, layered


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
    return layered(argv, env, toml)


def test_print_config_reads_back_to_the_same_configuration() -> None:
    """--print-config's output, given to --config, rebuilds the configuration
    (all but the environment-only secret, which it never writes)."""
    resolved = _many_layers()
    text = settings.render(resolved)
    again = layered((), {}, text)
    assert again.config == dataclasses.replace(resolved.config, tokens_text=None)
    assert resolved.config.tokens_text is not None
    for s in SETTINGS:
        unset = s.env_only or get(again.config, s.field) is None
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
        resolved = layered(*_random_layers(rng))
        again = layered((), {}, settings.render(resolved))
        assert again.config == dataclasses.replace(resolved.config, tokens_text=None)


def test_the_round_trip_catches_a_broken_writer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Negative control: a writer that forgets to escape strings is caught by
    the same round trip within the same random draws."""
    monkeypatch.setattr(printing, "toml_string", lambda text: f'"{text}"')
    rng = random.Random(1)  # noqa: S311 - reproducible draws
    failures = 0
    for _ in range(50):
        resolved = layered(*_random_layers(rng))
        try:
            again = layered((), {}, settings.render(resolved))
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
