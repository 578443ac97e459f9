"""The typed TOML fields that the policy file, the provider routes, the
tokens file and the settings file share: a boolean is not a number, a value
of the wrong type, a missing required key and an unknown key are refused the
same way in all four, named by their place and never quoted."""

from __future__ import annotations

import datetime
from collections.abc import Callable

import pytest

from sidecar.auth import tokens
from sidecar.config import ConfigError
from sidecar.policy_file import PolicyError, parse_policy
from sidecar.provider.routes import ProvidersError, parse_providers
from sidecar.settings import ConfigFile, resolve
from sidecar.tomlfields import Field, FieldError, check, known, read, type_name

ROUTE = '[routes.a]\nbase_url = "https://x"\n'
TOKEN = (
    '[[token]]\nname = "t"\nsecret = "long-enough-secret-1"\n'
    'roles = ["agent"]\nnamespaces = ["a"]\n'
)
NAMELESS = (
    '[[token]]\nsecret = "long-enough-secret-1"\nroles = ["agent"]\n'
    'namespaces = ["a"]\n'
)


def _policy(text: str) -> str:
    with pytest.raises(PolicyError) as refused:
        parse_policy(text)
    return f"{refused.value.where}: {refused.value.why}"


def _routes(text: str) -> str:
    with pytest.raises(ProvidersError) as refused:
        parse_providers(text, environ={})
    return f"{refused.value.where}: {refused.value.why}"


def _tokens(text: str) -> str:
    with pytest.raises(ConfigError) as refused:
        tokens.parse(text)
    assert refused.value.setting == "tokens"
    return refused.value.why


def _settings(text: str) -> str:
    with pytest.raises(ConfigError) as refused:
        resolve({}, {}, ConfigFile("effectd.toml", text))
    assert refused.value.source is not None
    return f"{refused.value.source.label}: {refused.value.why}"


FILES: dict[str, Callable[[str], str]] = {
    "policy": _policy,
    "routes": _routes,
    "tokens": _tokens,
    "settings": _settings,
}

# (file, text, the message: where the value is, then why)
MISTAKES = [
    # A boolean is not a number, nor a number a boolean.
    (
        "policy",
        "[retry]\nmax_attempts = true",
        "retry.max_attempts: must be an integer, not a boolean",
    ),
    (
        "policy",
        "[retry]\nretry_safe = 1",
        "retry.retry_safe: must be a boolean, not an integer",
    ),
    (
        "routes",
        ROUTE + "max_retries = true",
        "routes.a.max_retries: must be an integer, not a boolean",
    ),
    (
        "routes",
        ROUTE + "idempotency_key = 1",
        "routes.a.idempotency_key: must be a boolean, not an integer",
    ),
    (
        "tokens",
        TOKEN.replace('name = "t"', "name = true"),
        "token[0].name: must be a string, not a boolean",
    ),
    (
        "settings",
        "quota_burst = true",
        "quota_burst in effectd.toml: must be an integer, not a boolean",
    ),
    # A value of another type.
    (
        "policy",
        "[leases]\ndefault_ms = '5'",
        "leases.default_ms: must be an integer, not a string",
    ),
    (
        "routes",
        ROUTE + 'paths = "/v1/"',
        "routes.a.paths: must be an array, not a string",
    ),
    (
        "tokens",
        TOKEN.replace('roles = ["agent"]', 'roles = "agent"'),
        "token[0] (t).roles: must be an array, not a string",
    ),
    (
        "settings",
        "max_concurrent_rpcs = 1.5",
        "max_concurrent_rpcs in effectd.toml: must be an integer, not a float",
    ),
    ("policy", "retry = 3", "retry: must be a table, not an integer"),
    ("routes", "routes = []", "routes: must be a table, not an array"),
    ("tokens", "token = 1", "token: must be an array, not an integer"),
    (
        "settings",
        "data_dir = 2026-12-02",
        "data_dir in effectd.toml: must be a path, not a date or time",
    ),
    # A required key that is missing (the policy and the settings file have
    # none: every setting has a default).
    ("routes", "[routes.a]\nmax_retries = 1", "routes.a.base_url: is required"),
    ("tokens", NAMELESS, "token[0].name: is required"),
    # A key nobody reads.
    (
        "policy",
        "[retry]\nmax_attemps = 1",
        "retry.max_attemps: unknown setting (known: retry_safe, max_attempts, "
        "require_idempotency_proof)",
    ),
    (
        "policy",
        "[retries]\n",
        "retries: unknown section (known: retry, leases, retention, reconcile, "
        "inputs, tools)",
    ),
    (
        "routes",
        ROUTE + "color = 1",
        "routes.a.color: unknown setting (known: base_url, credential_env, "
        "credential_file, credential_header, credential_prefix, idempotency_key, "
        "effect, max_retries, paths, read_timeout_seconds, headers)",
    ),
    (
        "tokens",
        TOKEN + "extra = 1",
        "token[0].extra: unknown key (known: name, secret, sha256, roles, namespaces)",
    ),
    ("tokens", "tokens = 1", "tokens: unknown key (known: token)"),
    (
        "settings",
        "quota_open_call = 1",
        "quota_open_call in effectd.toml: not a setting; did you mean "
        "quota_open_calls?",
    ),
]


@pytest.mark.parametrize(("file", "text", "message"), MISTAKES)
def test_each_file_refuses_a_mistyped_missing_or_unknown_key_by_its_place(
    file: str, text: str, message: str
) -> None:
    """The four files name a value's table and key, and say the same words
    for the same mistake, because one checker reads them all."""
    assert FILES[file](text) == message


def test_every_file_is_covered() -> None:
    """Each of the four files has a row of each kind of mistake it can make."""
    assert {row[0] for row in MISTAKES} == set(FILES)


# -- the helper itself ---------------------------------------------------------

FIELDS = {
    "count": Field(int, required=True, bounds=(1, 10)),
    "on": Field(bool),
    "ratio": Field((int, float)),
    "size": Field((int, str), expected="a size"),
}


@pytest.mark.parametrize(
    ("value", "field", "why"),
    [
        (True, Field(int), "must be an integer, not a boolean"),
        (1, Field(bool), "must be a boolean, not an integer"),
        (False, Field((int, float)), "must be an integer or a float, not a boolean"),
        ("1", Field(int), "must be an integer, not a string"),
        (1.0, Field(int), "must be an integer, not a float"),
        ({}, Field(str), "must be a string, not a table"),
        ([], Field(dict), "must be a table, not an array"),
        (datetime.date(2026, 1, 1), Field(str), "must be a string, not a date or time"),
        (0.5, Field((int, str), expected="a size"), "must be a size, not a float"),
        (0, Field(int, bounds=(1, 10)), "must be between 1 and 10"),
        (11, Field(int, bounds=(1, 10)), "must be between 1 and 10"),
    ],
)
def test_a_value_of_the_wrong_type_or_range_is_refused(
    value: object, field: Field, why: str
) -> None:
    """A boolean is never an integer (Python's bool is an int; TOML's is
    not), an integer never a boolean, and the value is never quoted."""
    with pytest.raises(FieldError) as refused:
        check("t.k", value, field)
    assert (refused.value.where, refused.value.why) == ("t.k", why)
    assert str(refused.value) == f"t.k: {why}"


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (1, Field(int)),
        (True, Field(bool)),
        (True, Field((bool, str, int))),
        (1, Field((bool, str, int))),
        ("yes", Field((bool, str, int))),
        (1, Field((int, float))),
        (1.5, Field((int, float))),
        (10, Field(int, bounds=(1, 10))),
    ],
)
def test_a_value_of_a_type_the_field_takes_passes(value: object, field: Field) -> None:
    assert check("k", value, field) == value


def test_a_table_is_read_whole() -> None:
    """`read` checks the keys, the required ones and every value; `known`
    only the keys."""
    assert read("t", {"count": 3, "on": True}, FIELDS) == {"count": 3, "on": True}
    with pytest.raises(FieldError, match=r"^t\.count: is required$"):
        read("t", {"on": True}, FIELDS)
    with pytest.raises(FieldError, match=r"^t\.colour: unknown setting \(known: "):
        read("t", {"count": 1, "colour": 1}, FIELDS)
    with pytest.raises(FieldError, match=r"^t: must be a table$"):
        read("t", [1], FIELDS)
    with pytest.raises(FieldError, match=r"^count: must be between 1 and 10$"):
        read("", {"count": 0}, FIELDS)
    assert known("", {"count": "many"}, FIELDS) == {"count": "many"}
    with pytest.raises(FieldError, match=r"^x: try y$"):
        known("", {"count": 1, "x": 1}, FIELDS, unknown=lambda key: "try y")


def test_type_names_cover_every_toml_type() -> None:
    values: tuple[object, ...] = (True, 1, 1.0, "s", {}, [], datetime.time(1, 2))
    names = {type_name(v) for v in values}
    assert names == {
        "a boolean",
        "an integer",
        "a float",
        "a string",
        "a table",
        "an array",
        "a date or time",
    }
