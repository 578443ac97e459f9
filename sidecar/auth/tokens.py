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

MIN_SECRET_CHARS = 16
_KEYS = {"name", "secret", "sha256", "roles", "namespaces"}


def load_file(path: Path) -> Credentials:
    """Reads a tokens file, refusing one others may read or write."""
    setting = f"tokens-file {path}"
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"{setting}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{setting}: is not a regular file")
    if mode & 0o077:
        raise ConfigError(
            f"{setting}: mode {stat.S_IMODE(mode):04o} lets others read it; "
            "chmod 600 it"
        )
    if path.stat().st_uid != os.geteuid():
        raise ConfigError(f"{setting}: is not owned by the daemon's user")
    return parse(path.read_text(encoding="utf-8"), setting)


def parse(text: str, setting: str = "EFFECTD_TOKENS") -> Credentials:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The message quotes no input: it may be a token.
        raise ConfigError(f"{setting}: not valid TOML ({_where(exc)})") from None
    unknown = set(doc) - {"token"}
    if unknown:
        raise ConfigError(f"{setting}: unknown key {sorted(unknown)[0]!r}")
    tables = doc.get("token", [])
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f"{setting}: needs at least one [[token]] table")
    credentials = [
        _credential(t, f"{setting}: token[{i}]") for i, t in enumerate(tables)
    ]
    names = [c.principal.name for c in credentials]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"{setting}: the name {name!r} is used twice")
    digests = [c.digest for c in credentials]
    if len(set(digests)) != len(digests):
        raise ConfigError(f"{setting}: two tokens have the same secret")
    return Credentials(credentials)


def _where(exc: tomllib.TOMLDecodeError) -> str:
    """Where the error is, from tomllib's message "... (at line N, column M)";
    the rest of the message may quote the text, which may hold a token."""
    found = re.search(r"\((at [a-z0-9 ,]+)\)$", str(exc))
    return found.group(1) if found else "position unknown"


def _credential(table: Any, where: str) -> Credential:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: must be a table")
    unknown = set(table) - _KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    name = table.get("name")
    if not isinstance(name, str) or not name or len(name) > 128:
        raise ConfigError(f"{where}.name: is required, 1..128 characters")
    where = f"{where} ({name})"
    return Credential(_digest(table, where), _principal(table, name, where))


def _digest(table: Mapping[str, Any], where: str) -> bytes:
    secret, hashed = table.get("secret"), table.get("sha256")
    if (secret is None) == (hashed is None):
        raise ConfigError(f"{where}: set exactly one of secret and sha256")
    if secret is not None:
        if not isinstance(secret, str) or len(secret) < MIN_SECRET_CHARS:
            raise ConfigError(
                f"{where}.secret: must be at least {MIN_SECRET_CHARS} characters "
                "(e.g. `openssl rand -base64 32`)"
            )
        if any(c.isspace() or not c.isprintable() for c in secret):
            raise ConfigError(f"{where}.secret: must not hold spaces or controls")
        return sha256(secret.encode()).digest()
    try:
        digest = bytes.fromhex(hashed) if isinstance(hashed, str) else b""
    except ValueError:
        digest = b""
    if len(digest) != 32:
        raise ConfigError(f"{where}.sha256: must be 64 hex digits")
    return digest


def _principal(table: Mapping[str, Any], name: str, where: str) -> Principal:
    roles = table.get("roles")
    if not isinstance(roles, list) or not roles:
        raise ConfigError(f"{where}.roles: is required: agent, approver, operator")
    known = {r.value: r for r in Role}
    for role in roles:
        if role not in known:
            raise ConfigError(f"{where}.roles: unknown role {role!r}")
    namespaces = table.get("namespaces")
    if not isinstance(namespaces, list) or not namespaces:
        raise ConfigError(f'{where}.namespaces: is required (["*"] for every one)')
    for ns in namespaces:
        v = Violations()
        if isinstance(ns, str) and ns not in ("", ALL_NAMESPACES):
            v.namespace("", ns)
        if not isinstance(ns, str) or not ns or v.items:
            raise ConfigError(f"{where}.namespaces: {ns!r} is not a namespace")
    return Principal(name, frozenset(known[r] for r in roles), frozenset(namespaces))
