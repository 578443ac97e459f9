"""Loading bearer tokens: a TOML file of mode 0600, or the same text from the
environment (`EFFECTD_TOKENS`).

    [[token]]
    name = "checkout-agent"        # the actor in logs and the audit log
    secret = "…"                   # the token itself (at least 16 characters)
    # or: sha256 = "hex digest of the token", to keep no token on disk
    roles = ["agent"]              # agent | approver | operator
    namespaces = ["checkout"]      # or ["*"]: every namespace

Only digests are kept in memory; a token is never logged.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Mapping
from hashlib import sha256
from pathlib import Path
from typing import Any

from sidecar.auth.access import ALL_NAMESPACES, Credential, Credentials, Principal, Role
from sidecar.config import ConfigError
from sidecar.ledger.validation import Violations
from sidecar.tomlfields import Field, FieldError, check, join, known, read

MIN_SECRET_CHARS = 16
_DOCUMENT = {"token": Field(list)}
_TOKEN = {
    "name": Field(str, required=True),
    "secret": Field(str),
    "sha256": Field(str),
    "roles": Field(list),
    "namespaces": Field(list),
}


def load_file(path: Path) -> Credentials:
    """Reads a tokens file, refusing one others may read or write."""
    named = str(path)
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError("tokens_file", str(exc.strerror), detail=named) from None
    if not stat.S_ISREG(mode):
        raise ConfigError("tokens_file", "is not a regular file", detail=named)
    if mode & 0o077:
        raise ConfigError(
            "tokens_file",
            f"mode {stat.S_IMODE(mode):04o} lets others read it; chmod 600 it",
            detail=named,
        )
    if path.stat().st_uid != os.geteuid():
        raise ConfigError(
            "tokens_file", "is not owned by the daemon's user", detail=named
        )
    return parse(path.read_text(encoding="utf-8"), "tokens_file", named)


def parse(text: str, setting: str = "tokens", path: str = "") -> Credentials:
    """The credentials of a tokens file's text.

    Args:
        text: the TOML text.
        setting: the setting that holds it: `tokens` (EFFECTD_TOKENS) or
            `tokens_file`, which errors name.
        path: the file's path, said after the setting's name.
    """
    try:
        return _parse(text)
    except FieldError as exc:
        raise ConfigError(setting, str(exc), detail=path) from None


def _parse(text: str) -> Credentials:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The message quotes no input: it may be a token.
        raise FieldError("", f"not valid TOML ({_where(exc)})") from None
    tables = read("", doc, _DOCUMENT, what="key").get("token", [])
    if not tables:
        raise FieldError("", "needs at least one [[token]] table")
    credentials = [_credential(t, f"token[{i}]") for i, t in enumerate(tables)]
    names = [c.principal.name for c in credentials]
    for name in names:
        if names.count(name) > 1:
            raise FieldError("", f"the name {name!r} is used twice")
    digests = [c.digest for c in credentials]
    if len(set(digests)) != len(digests):
        raise FieldError("", "two tokens have the same secret")
    return Credentials(credentials)


def _where(exc: tomllib.TOMLDecodeError) -> str:
    """Where the error is, from tomllib's message "... (at line N, column M)";
    the rest of the message may quote the text, which may hold a token."""
    found = re.search(r"\((at [a-z0-9 ,]+)\)$", str(exc))
    return found.group(1) if found else "position unknown"


def _credential(table: Any, where: str) -> Credential:
    known(where, table, _TOKEN, what="key")
    name = check(join(where, "name"), table["name"], _TOKEN["name"])
    if not name or len(name) > 128:
        raise FieldError(join(where, "name"), "is required, 1..128 characters")
    where = f"{where} ({name})"
    table = read(where, table, _TOKEN, what="key")
    return Credential(_digest(table, where), _principal(table, name, where))


def _digest(table: Mapping[str, Any], where: str) -> bytes:
    secret, hashed = table.get("secret"), table.get("sha256")
    if (secret is None) == (hashed is None):
        raise FieldError(where, "set exactly one of secret and sha256")
    if secret is not None:
        if len(secret) < MIN_SECRET_CHARS:
            raise FieldError(
                join(where, "secret"),
                f"must be at least {MIN_SECRET_CHARS} characters "
                "(e.g. `openssl rand -base64 32`)",
            )
        if any(c.isspace() or not c.isprintable() for c in secret):
            raise FieldError(join(where, "secret"), "must not hold spaces or controls")
        return sha256(secret.encode()).digest()
    assert isinstance(hashed, str)  # checked by its field
    try:
        digest = bytes.fromhex(hashed)
    except ValueError:
        digest = b""
    if len(digest) != 32:
        raise FieldError(join(where, "sha256"), "must be 64 hex digits")
    return digest


def _principal(table: Mapping[str, Any], name: str, where: str) -> Principal:
    roles = table.get("roles")
    if not roles:
        raise FieldError(join(where, "roles"), "is required: agent, approver, operator")
    known_roles = {r.value: r for r in Role}
    for role in roles:
        if not isinstance(role, str) or role not in known_roles:
            raise FieldError(join(where, "roles"), f"unknown role {role!r}")
    namespaces = table.get("namespaces")
    if not namespaces:
        raise FieldError(join(where, "namespaces"), 'is required (["*"] for every one)')
    for ns in namespaces:
        v = Violations()
        if isinstance(ns, str) and ns not in ("", ALL_NAMESPACES):
            v.namespace("", ns)
        if not isinstance(ns, str) or not ns or v.items:
            raise FieldError(join(where, "namespaces"), f"{ns!r} is not a namespace")
    return Principal(
        name, frozenset(known_roles[r] for r in roles), frozenset(namespaces)
    )
