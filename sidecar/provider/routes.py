"""The provider routes: the only upstreams a provider call can reach.

    [routes.openai]
    base_url = "https://api.openai.com"  # http(s), no query, no credentials
    credential_env = "OPENAI_API_KEY"    # or credential_file = "/run/keys/openai"
    credential_header = "Authorization"  # default; "Bearer " prefixed for it
    credential_prefix = "Bearer "        # default: "Bearer " for Authorization
    idempotency_key = true               # the upstream honours Idempotency-Key
    effect = "inference"                 # or "side-effect": no ambiguous retry
    max_retries = 2                      # the cap a request may lower (0..4)
    paths = ["/v1/"]                     # allowed path prefixes (default "/")
    read_timeout_seconds = 600           # per attempt, bounded by the deadline
    [routes.openai.headers]              # injected into every request
    "OpenAI-Organization" = "org-..."

The file is validated as a whole; an error names the setting and never
shows a credential. What becomes a header (the credential, its prefix,
the injected headers) must be one line of visible ASCII, spaces and tabs.
`resolve` (or `locate`, for a route already looked up) turns a request's
path into a URL below the route's base and refuses anything else
(ROUTE_NOT_ALLOWED); `Locations` remembers the URLs of the paths it
allowed, so a path that comes again is not checked and parsed again.
"""

from __future__ import annotations

import enum
import hashlib
import os
import re
import tomllib
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx

from sidecar.errors import RouteNotAllowed
from sidecar.provider.policy import DEFAULT_MAX_RETRIES, MAX_ATTEMPTS_CEILING
from sidecar.tomlfields import Field, FieldError, join, read


class ProvidersError(ValueError):
    """The providers file is unreadable or invalid.

    Attributes:
        where: the setting (`routes.openai.base_url`), or the file for an
            error about the whole file.
        why: what is wrong; never a credential.
    """

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.where = where
        self.why = why


_DOCUMENT = {"routes": Field(dict)}
_ROUTE = {
    "base_url": Field(str, required=True),
    "credential_env": Field(str),
    "credential_file": Field(str),
    "credential_header": Field(str),
    "credential_prefix": Field(str),
    "idempotency_key": Field(bool),
    "effect": Field(str),
    "max_retries": Field(int, bounds=(0, MAX_ATTEMPTS_CEILING - 1)),
    "paths": Field(list),
    "read_timeout_seconds": Field((int, float)),
    "headers": Field(dict),
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
# A header value as HTTP carries it and the HTTP client encodes it: visible
# ASCII, spaces and tabs (RFC 9110 §5.5, without obs-text, which the client
# cannot encode from text).
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e]*")
# RFC 3986 path and query characters; anything else is refused, not encoded.
# A percent that does not start an escape: some servers read `%u002e`.
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
MAX_DECODINGS = 3
_PATH = re.compile(
    r"^/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*(\?[A-Za-z0-9._~!$&'()*+,;=:@%/?-]*)?$"
)


def is_field_value(text: str) -> bool:
    """Whether `text` can be sent as an HTTP header's value."""
    return _FIELD_VALUE.fullmatch(text) is not None


class RouteEffect(enum.Enum):
    """What a route's requests do upstream, for the retry policy.

    INFERENCE (the default): model inference, whose replay costs money but
    repeats no business effect, so an attempt that may have executed is
    retried (ADR-010 D4). SIDE_EFFECT: a replay could repeat an effect (an
    upload, a batch, a fine-tune), so only an attempt the upstream provably
    did not process is retried (ADR-010 D1, D2).
    """

    INFERENCE = "inference"
    SIDE_EFFECT = "side-effect"


@dataclass(frozen=True, slots=True)
class Route:
    """One configured upstream. `credential` never leaves this value except
    into the upstream request; its repr hides it."""

    name: str
    base_url: str
    credential_header: str = ""
    credential: str = field(default="", repr=False)
    honours_idempotency_key: bool = False
    effect: RouteEffect = RouteEffect.INFERENCE
    max_retries: int = DEFAULT_MAX_RETRIES
    paths: tuple[str, ...] = ("/",)
    read_timeout: float = 600.0
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Derived once: every request reads them.
    _budget_key: str = field(init=False, repr=False, compare=False)
    _own_headers: frozenset[str] = field(init=False, repr=False, compare=False)
    _origin: tuple[str, str, int | None] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha256(self.credential.encode()).hexdigest()[:12]
        names = {n.lower() for n in self.headers}
        if self.credential_header:
            names.add(self.credential_header.lower())
        base = httpx.URL(self.base_url)
        object.__setattr__(self, "_budget_key", f"{self.base_url}#{digest}")
        object.__setattr__(self, "_own_headers", frozenset(names))
        object.__setattr__(self, "_origin", (base.scheme, base.host, base.port))

    @property
    def budget_key(self) -> str:
        """The upstream key of the retry budget: base URL + credential
        fingerprint (§10.1), never the credential itself."""
        return self._budget_key

    @property
    def own_headers(self) -> frozenset[str]:
        """Lower-case names the route sets itself; requests may not."""
        return self._own_headers


def _base_url(where: str, raw: str) -> str:
    try:
        # Read as requests read it too: the route's origin comes from it.
        parts, url = urllib.parse.urlsplit(raw), httpx.URL(raw)
        _ = (url.host, url.port)
    except (ValueError, httpx.InvalidURL) as exc:
        raise FieldError(where, f"is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FieldError(where, "must be an http(s) URL with a host")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise FieldError(where, "must not carry credentials, a query or a fragment")
    return raw.rstrip("/")


def _credential(where: str, table: dict[str, Any], environ: Mapping[str, str]) -> str:
    env, file = table.get("credential_env"), table.get("credential_file")
    if env is not None and file is not None:
        raise FieldError(where, "set credential_env or credential_file, not both")
    if env is not None:
        if env not in environ or not environ[env]:
            raise FieldError(
                join(where, "credential_env"),
                f"the environment variable {env} is not set",
            )
        secret = environ[env]
    elif file is not None:
        try:
            secret = Path(file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise FieldError(
                join(where, "credential_file"),
                f"cannot be read ({type(exc).__name__})",
            ) from None
    else:
        return ""
    if not secret or not is_field_value(secret):
        raise FieldError(
            where, "the credential is empty or not one line of visible ASCII"
        )
    return secret


def _effect(where: str, table: dict[str, Any]) -> RouteEffect:
    value = table.get("effect", RouteEffect.INFERENCE.value)
    for effect in RouteEffect:
        if effect.value == value:
            return effect
    raise FieldError(join(where, "effect"), 'must be "inference" or "side-effect"')


def _route(name: str, table: Any, environ: Mapping[str, str]) -> Route:
    where = join("routes", name)
    if not _NAME.match(name):
        raise FieldError(where, "a route name is 1-64 of A-Z a-z 0-9 . _ -")
    table = read(where, table, _ROUTE)
    base = _base_url(join(where, "base_url"), table["base_url"])
    credential = _credential(where, table, environ)
    header = table.get("credential_header", "Authorization" if credential else "")
    if header and not _HEADER_NAME.match(header):
        raise FieldError(join(where, "credential_header"), "not a header name")
    default_prefix = "Bearer " if header.lower() == "authorization" else ""
    prefix = table.get("credential_prefix", default_prefix)
    if not is_field_value(prefix):
        raise FieldError(
            join(where, "credential_prefix"), "must be visible ASCII, spaces and tabs"
        )
    paths = tuple(table.get("paths", ["/"]))
    if not paths or not all(isinstance(p, str) and _PATH.match(p) for p in paths):
        raise FieldError(
            join(where, "paths"), "must be a list of paths starting with /"
        )
    timeout = float(table.get("read_timeout_seconds", 600.0))
    if not 0 < timeout <= 3600:
        raise FieldError(join(where, "read_timeout_seconds"), "must be in (0, 3600]")
    headers: dict[str, str] = {}
    for key, value in table.get("headers", {}).items():
        at = join(join(where, "headers"), key)
        if not _HEADER_NAME.match(key) or not isinstance(value, str):
            raise FieldError(at, "must be a header = string")
        if not is_field_value(value):
            raise FieldError(at, "must be one line of visible ASCII, spaces and tabs")
        headers[key] = value
    return Route(
        name=name,
        base_url=base,
        credential_header=header,
        credential=f"{prefix}{credential}" if credential else "",
        honours_idempotency_key=table.get("idempotency_key", False),
        effect=_effect(where, table),
        max_retries=table.get("max_retries", DEFAULT_MAX_RETRIES),
        paths=paths,
        read_timeout=timeout,
        headers=MappingProxyType(headers),
    )


def parse_providers(
    text: str, source: str = "providers", environ: Mapping[str, str] | None = None
) -> dict[str, Route]:
    """The routes a TOML text describes.

    Raises:
        ProvidersError: naming the setting (or `source`, for text that is not
            TOML).
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProvidersError(source, f"not valid TOML: {exc}") from None
    env = os.environ if environ is None else environ
    try:
        routes = read("", doc, _DOCUMENT, what="section").get("routes", {})
        return {name: _route(name, table, env) for name, table in routes.items()}
    except FieldError as exc:
        raise ProvidersError(exc.where, exc.why) from None


def load_providers(path: Path) -> dict[str, Route]:
    """The routes of a providers file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProvidersError(str(path), f"cannot be read: {exc}") from None
    return parse_providers(text, str(path))


def _leaves_the_base(bare: str) -> bool:
    """Whether the path, as sent or as any further percent-decoding reads it
    (an upstream, or a proxy in front of it, may decode more than once),
    could climb out of the route's base."""
    form = bare
    for _ in range(MAX_DECODINGS + 1):
        if not _stays_below(form):
            return True
        decoded = urllib.parse.unquote(form)
        if decoded == form:
            return False
        form = decoded
    return True  # still encoded after that many decodings: nobody means that


def _stays_below(form: str) -> bool:
    """No `.` or `..` segment, even behind path parameters (`..;x`, which
    servlet containers read as `..`), no `//`, no backslash, no control."""
    if "\\" in form or "//" in form:
        return False
    if any(ord(c) < 0x20 or c == "\x7f" for c in form):
        return False
    return all(s.split(";", 1)[0] not in (".", "..") for s in form.split("/"))


def resolve(
    routes: Mapping[str, Route], name: str, path: str
) -> tuple[Route, httpx.URL]:
    """The route and absolute URL of a request; ROUTE_NOT_ALLOWED for an
    unknown route or any path that could leave the route's base."""
    route = routes.get(name)
    return locate(route, name, path)


def locate(route: Route | None, name: str, path: str) -> tuple[Route, httpx.URL]:
    """`resolve` for a route already looked up (None: no route `name`); the
    URL parsed once, as it is sent."""
    if route is None:
        raise RouteNotAllowed(
            f"no provider route {name!r} is configured", {"route": name}
        )
    meta = {"route": name}
    if not _PATH.match(path) or path.startswith("//"):
        raise RouteNotAllowed("the path must be a relative path starting with /", meta)
    bare = path.split("?", 1)[0]
    if _BAD_ESCAPE.search(path):
        raise RouteNotAllowed("the path has a % not followed by two hex digits", meta)
    if _leaves_the_base(bare):
        raise RouteNotAllowed("the path must not contain . or .. segments or //", meta)
    if not any(bare.startswith(prefix) for prefix in route.paths):
        raise RouteNotAllowed("the path is outside the route's allowed paths", meta)
    url = httpx.URL(route.base_url + path)
    if (url.scheme, url.host, url.port) != route._origin:
        raise RouteNotAllowed("the path leaves the route's host", meta)
    return route, url


class Locations:
    """`locate`, remembering the URL of each path it allowed: agents send a
    few paths per route, over and over, and a URL parse costs tens of
    microseconds. Refusals are not remembered. Bounded: everything is
    forgotten at once when `size` paths are remembered."""

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._urls: dict[tuple[str, str], tuple[Route, httpx.URL]] = {}

    def __len__(self) -> int:
        return len(self._urls)

    def locate(
        self, route: Route | None, name: str, path: str
    ) -> tuple[Route, httpx.URL]:
        """`locate(route, name, path)`."""
        known = self._urls.get((name, path))
        if route is not None and known is not None and known[0] is route:
            return known
        found = locate(route, name, path)
        if len(self._urls) >= self._size:
            self._urls.clear()
        self._urls[name, path] = found
        return found
