"""The providers file and the route check: nothing but a configured route
below its base URL can be reached (contract §9, no open proxy)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from sidecar.errors import RouteNotAllowed
from sidecar.provider.routes import (
    Locations,
    ProvidersError,
    Route,
    RouteEffect,
    load_providers,
    parse_providers,
    resolve,
)

ENV = {"OPENAI_API_KEY": "sk-live-123"}
GOOD = """
[routes.openai]
base_url = "https://api.openai.com/"
credential_env = "OPENAI_API_KEY"
idempotency_key = true
max_retries = 3
paths = ["/v1/"]
[routes.openai.headers]
"OpenAI-Beta" = "assistants=v2"
"""


def test_a_route_is_read_with_its_defaults() -> None:
    """A full route: base without trailing slash, Bearer credential, headers."""
    [route] = parse_providers(GOOD, environ=ENV).values()
    assert route.base_url == "https://api.openai.com"
    assert (route.credential_header, route.credential) == (
        "Authorization",
        "Bearer sk-live-123",
    )
    assert route.honours_idempotency_key
    assert route.max_retries == 3
    assert dict(route.headers) == {"OpenAI-Beta": "assistants=v2"}
    assert route.own_headers == {"authorization", "openai-beta"}


def test_a_route_serves_inference_unless_marked_side_effect() -> None:
    """`effect` defaults to inference; "side-effect" marks a route whose
    ambiguous failures are never retried."""
    # ADR-010 D4; provider-retries §12.3
    [route] = parse_providers(GOOD, environ=ENV).values()
    assert route.effect is RouteEffect.INFERENCE
    text = '[routes.files]\nbase_url = "https://x"\neffect = "side-effect"\n'
    [marked] = parse_providers(text, environ={}).values()
    assert marked.effect is RouteEffect.SIDE_EFFECT


def test_the_credential_never_shows() -> None:
    """Neither the route's repr nor its budget key contains the credential."""
    [route] = parse_providers(GOOD, environ=ENV).values()
    assert "sk-live-123" not in repr(route)
    assert "sk-live-123" not in route.budget_key


def test_a_credential_file_is_read(tmp_path: Path) -> None:
    """credential_file is read and stripped; a custom header has no prefix."""
    key = tmp_path / "key"
    key.write_text("abc\n")
    text = (
        f'[routes.ant]\nbase_url = "https://api.anthropic.com"\n'
        f'credential_file = "{key}"\ncredential_header = "x-api-key"\n'
    )
    [route] = parse_providers(text, environ={}).values()
    assert (route.credential_header, route.credential) == ("x-api-key", "abc")


def test_load_names_an_unreadable_file(tmp_path: Path) -> None:
    """A missing providers file is a ProvidersError naming the path."""
    with pytest.raises(ProvidersError, match="cannot be read"):
        load_providers(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("text", "setting"),
    [
        ("[other]\n", "other: unknown section"),
        ("[routes.a]\n", "routes.a.base_url: is required"),
        ('[routes.a]\nbase_url = "ftp://x"\n', "routes.a.base_url"),
        ('[routes.a]\nbase_url = "https://u:p@x"\n', "routes.a.base_url"),
        ('[routes.a]\nbase_url = "https://x?q=1"\n', "routes.a.base_url"),
        # Unparseable: a clean error at load, not a failure of each request.
        ('[routes.a]\nbase_url = "https://[::1"\n', "routes.a.base_url"),
        ('[routes.a]\nbase_url = "https://xn--.com"\n', "routes.a.base_url"),
        ('[routes.a]\nbase_url = "https://x"\ncolor = 1\n', "routes.a.color: unknown"),
        (
            '[routes.a]\nbase_url = "https://x"\nmax_retries = 5\n',
            "routes.a.max_retries",
        ),
        (
            '[routes.a]\nbase_url = "https://x"\nmax_retries = true\n',
            "routes.a.max_retries",
        ),
        ('[routes.a]\nbase_url = "https://x"\npaths = ["v1"]\n', "routes.a.paths"),
        (
            '[routes.a]\nbase_url = "https://x"\ncredential_env = "NOPE"\n',
            "NOPE is not set",
        ),
        (
            '[routes.a]\nbase_url = "https://x"\ncredential_env = "K"\n'
            'credential_file = "/k"\n',
            "not both",
        ),
        ('[routes."a b"]\nbase_url = "https://x"\n', "a route name"),
        (
            '[routes.a]\nbase_url = "https://x"\n[routes.a.headers]\n"x" = 1\n',
            "headers.x",
        ),
        ("routes = 1\n", "routes: must be"),
        # What HTTP cannot carry in a header: refused at load, not answered
        # INTERNAL on every request (issue 25 item 18).
        (
            '[routes.a]\nbase_url = "https://x"\n[routes.a.headers]\n"x" = "café"\n',
            "routes.a.headers.x",
        ),
        (
            '[routes.a]\nbase_url = "https://x"\ncredential_env = "E"\n',
            "the credential is empty or not one line of visible ASCII",
        ),
        (
            '[routes.a]\nbase_url = "https://x"\ncredential_env = "K"\n'
            'credential_prefix = "Clé "\n',
            "routes.a.credential_prefix",
        ),
        (
            '[routes.a]\nbase_url = "https://x"\neffect = "write"\n',
            "routes.a.effect",
        ),
        (
            '[routes.a]\nbase_url = "https://x"\neffect = true\n',
            "routes.a.effect",
        ),
        ("not toml [", "not valid TOML"),
    ],
)
def test_invalid_files_name_the_setting(text: str, setting: str) -> None:
    """Every invalid providers file is refused with a message naming the
    setting (like the policy file)."""
    with pytest.raises(ProvidersError, match=re.escape(setting)):
        parse_providers(text, environ={"K": "v", "E": "clé"})


def test_a_missing_variable_error_does_not_leak_other_secrets() -> None:
    """The error about a credential names the variable, never a value."""
    text = '[routes.a]\nbase_url = "https://x"\ncredential_env = "EMPTY"\n'
    with pytest.raises(ProvidersError) as caught:
        parse_providers(text, environ={"EMPTY": "", "OTHER": "sk-secret"})
    assert "sk-secret" not in str(caught.value)


ROUTES = {
    "r": Route(name="r", base_url="https://api.example.com/base", paths=("/v1/",))
}


@pytest.mark.parametrize(
    "path",
    [
        "https://evil.example/v1/x",  # absolute URL
        "//evil.example/v1/x",  # scheme-relative
        "/v1/../admin",  # dot-dot
        "/v1/%2e%2e/admin",  # encoded dot-dot
        "/v1/./x",
        "/v1//x",
        "/v1/x\\y",
        "/v1/x y",
        "/v1/x#frag",
        "/v1/\r\nHost: evil",
        "v1/x",  # relative
        "/v2/x",  # outside the allowed prefixes
        "/v1@evil.example/x",
        "",
    ],
)
def test_paths_that_could_leave_the_route_are_refused(path: str) -> None:
    """Absolute URLs, `..`, `//`, odd characters and paths outside the prefixes
    are ROUTE_NOT_ALLOWED."""
    # contract §9 "Only configured routes ... can be reached (no open proxy"
    with pytest.raises(RouteNotAllowed):
        resolve(ROUTES, "r", path)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/..;/admin",  # a servlet container reads `..;` as `..`
        "/v1/..;jsessionid=1/admin",
        "/v1/%2e%2e;/admin",
        "/v1/%2e%2e%3b/admin",
        "/v1/.;/x",
        "/v1/%252e%252e/admin",  # decoded twice upstream
        "/v1/%252e%252e%253b/admin",
        "/v1/%25252e%25252e/admin",  # three times
        "/v1/%252f%252fevil.example",
        "/v1/%255c..%255cadmin",
        "/v1/%2525252e",  # still encoded after three decodings
        "/v1/%u002e%u002e/admin",  # not an escape: IIS reads it as one
        "/v1/%0d%0aHost:%20evil",
        "/v1/x%00",
    ],
)
def test_paths_that_leave_after_another_decoding_are_refused(path: str) -> None:
    """Dot segments behind path parameters, double-encoded dots and slashes,
    and malformed escapes are ROUTE_NOT_ALLOWED: an upstream that reads them
    differently could serve a path outside the route (issue 10 item 27:
    fails before the fix: they resolved to a URL on the route's host)."""
    # contract §9 "Only configured routes ... can be reached (no open proxy"
    with pytest.raises(RouteNotAllowed):
        resolve(ROUTES, "r", path)


def test_an_unknown_route_is_refused() -> None:
    """A route that is not configured is ROUTE_NOT_ALLOWED."""
    with pytest.raises(RouteNotAllowed, match="no provider route"):
        resolve(ROUTES, "nope", "/v1/x")


@pytest.mark.parametrize(
    ("path", "url"),
    [
        ("/v1/chat", "https://api.example.com/base/v1/chat"),
        ("/v1/models?limit=2", "https://api.example.com/base/v1/models?limit=2"),
        ("/v1/files/file-abc:1", "https://api.example.com/base/v1/files/file-abc:1"),
        ("/v1/a;b/c", "https://api.example.com/base/v1/a;b/c"),
        ("/v1/a%20b", "https://api.example.com/base/v1/a%20b"),
        ("/v1/..x/.y", "https://api.example.com/base/v1/..x/.y"),
    ],
)
def test_paths_below_the_base_are_resolved(path: str, url: str) -> None:
    """A good path is appended to the route's base URL."""
    assert resolve(ROUTES, "r", path)[1] == url


@pytest.mark.parametrize("path", ["/v1/../admin", "/v1/%252e%252e/admin", "/v2/x"])
def test_remembered_locations_refuse_what_locate_refuses(path: str) -> None:
    """`Locations` refuses a path `locate` refuses, every time it comes: a
    refusal is never remembered."""
    # contract §9 "Only configured routes ... can be reached (no open proxy"
    locations = Locations()
    for _ in range(3):
        with pytest.raises(RouteNotAllowed):
            locations.locate(ROUTES["r"], "r", path)
    assert len(locations) == 0


def test_remembered_locations_are_bounded_and_belong_to_their_route() -> None:
    """A remembered path answers the URL `locate` answers, for the route it
    was located on only; at most `size` paths are remembered."""
    locations = Locations(size=3)
    route = ROUTES["r"]
    for i in range(10):
        for _ in range(2):
            _, url = locations.locate(route, "r", f"/v1/p{i}")
            assert url == f"https://api.example.com/base/v1/p{i}"
        assert len(locations) <= 3
    moved = dataclasses.replace(route, base_url="https://other.example.com")
    assert (
        locations.locate(moved, "r", "/v1/p9")[1] == "https://other.example.com/v1/p9"
    )
    with pytest.raises(RouteNotAllowed, match="no provider route"):
        locations.locate(None, "r", "/v1/p9")
