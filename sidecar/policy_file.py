"""The policy file: TOML, validated as a whole, reloaded atomically.

    [retry]
    retry_safe = true      # the kill switch of ADR-010 R2: false stops every retry
    max_attempts = 3       # attempts a call may use, the first one included
    require_idempotency_proof = false  # true: an IDEMPOTENT_WRITE counts as a
                           # SIDE_EFFECT unless its tool is proven (below)

    [leases]
    default_ms = 30000     # lease of an attempt that asks for none

    [retention]
    days = 7               # committed, acknowledged records become tombstones after
    unacknowledged_days = 30  # committed records never acknowledged, after (>= days)
    tombstone_days = 30    # tombstones are deleted after

    [reconcile]
    quarantine_leases = 3  # an UNKNOWN call may be reconciled "never executed"
                           # only after this many of its leases (or with the
                           # operator's confirmation that its attempt is dead)

    [tools.send_payment]
    effect = "side-effect" # forced, whatever callers declare (R2)

    [tools.upsert_contact]
    idempotency_proven = true  # its target's de-duplication on the key is
                           # proven by its owner's tests (effectd_client.testing)

    [inputs]               # every call keeps its exact input until settled
    keep_all = false       # true: a settled call keeps it too, until
                           # retention compacts the record ...
    max_bytes = 65536      # ... when it is at most this big

A file with an unknown key, a wrong type or a value out of range is refused
with a message that names the setting; the policy in force stays.
"""

from __future__ import annotations

import threading
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sidecar.ledger.model import Effect
from sidecar.ledger.policy import Policy
from sidecar.tomlfields import Field, FieldError, check, join, read


class PolicyError(ValueError):
    """The policy file is unreadable or invalid.

    Attributes:
        where: the setting (`retry.max_attempts`), or the file for an error
            about the whole file.
        why: what is wrong.
    """

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.where = where
        self.why = why


_SECTIONS: Mapping[str, Mapping[str, Field]] = {
    "retry": {
        "retry_safe": Field(bool),
        "max_attempts": Field(int, bounds=(1, 100)),
        "require_idempotency_proof": Field(bool),
    },
    "leases": {"default_ms": Field(int, bounds=(1, 3_600_000))},
    "retention": {
        "days": Field(int, bounds=(1, 3650)),
        "unacknowledged_days": Field(int, bounds=(1, 3650)),
        "tombstone_days": Field(int, bounds=(1, 3650)),
    },
    "reconcile": {"quarantine_leases": Field(int, bounds=(1, 1000))},
    "inputs": {
        "keep_all": Field(bool),
        "max_bytes": Field(int, bounds=(1, 1 << 20)),
    },
}
_DOCUMENT: Mapping[str, Field] = {
    **{section: Field(dict) for section in _SECTIONS},
    "tools": Field(dict),
}
_TOOL = {"effect": Field(str), "idempotency_proven": Field(bool)}


def parse_policy(text: str, source: str = "policy") -> Policy:
    """The policy a TOML text describes; omitted settings keep their defaults.

    Raises:
        PolicyError: naming the setting (or `source`, for text that is not
            TOML).
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(source, f"not valid TOML: {exc}") from None
    try:
        return _policy(doc)
    except FieldError as exc:
        raise PolicyError(exc.where, exc.why) from None


def _policy(doc: dict[str, Any]) -> Policy:
    read("", doc, _DOCUMENT, what="section")
    values: dict[str, Any] = {
        join(section, key): value
        for section, fields in _SECTIONS.items()
        for key, value in read(section, doc.get(section, {}), fields).items()
    }
    overrides, proven = _tools(doc.get("tools", {}))
    default = Policy()
    days = values.get("retention.days", default.retention_seconds // 86400)
    unacknowledged_days = values.get(
        "retention.unacknowledged_days",
        max(days, default.unacknowledged_retention_seconds // 86400),
    )
    if unacknowledged_days < days:
        raise FieldError(
            "retention.unacknowledged_days",
            "must be at least retention.days: a result never delivered is kept "
            "no shorter than a delivered one",
        )
    return Policy(
        retry_safe_enabled=values.get("retry.retry_safe", default.retry_safe_enabled),
        max_attempts=values.get("retry.max_attempts", default.max_attempts),
        default_lease_ms=values.get("leases.default_ms", default.default_lease_ms),
        retention_seconds=days * 86400,
        unacknowledged_retention_seconds=unacknowledged_days * 86400,
        tombstone_seconds=values.get(
            "retention.tombstone_days", default.tombstone_seconds // 86400
        )
        * 86400,
        effect_overrides=MappingProxyType(overrides),
        reconcile_quarantine_leases=values.get(
            "reconcile.quarantine_leases", default.reconcile_quarantine_leases
        ),
        idempotency_proof_required=values.get(
            "retry.require_idempotency_proof", default.idempotency_proof_required
        ),
        proven_idempotent_tools=frozenset(proven),
        keep_inputs=values.get("inputs.keep_all", default.keep_inputs),
        max_kept_input_bytes=values.get(
            "inputs.max_bytes", default.max_kept_input_bytes
        ),
    )


def _tools(tools: dict[str, Any]) -> tuple[dict[str, Effect], set[str]]:
    """The [tools.NAME] sections: forced effects, and tools proven idempotent."""
    overrides: dict[str, Effect] = {}
    proven: set[str] = set()
    for name, table in tools.items():
        where = join("tools", name)
        if not isinstance(table, dict) or not table or not set(table) <= set(_TOOL):
            raise FieldError(
                where, "must set `effect` or `idempotency_proven`, nothing else"
            )
        if "effect" in table:
            if table["effect"] != Effect.SIDE_EFFECT.value:
                raise FieldError(
                    join(where, "effect"),
                    'only "side-effect" can be forced; a policy never makes a '
                    "tool less conservative than its callers declare",
                )
            overrides[name] = Effect.SIDE_EFFECT
        if "idempotency_proven" in table:
            key = join(where, "idempotency_proven")
            if check(key, table["idempotency_proven"], _TOOL["idempotency_proven"]):
                proven.add(name)
            if name in overrides and name in proven:
                raise FieldError(
                    where,
                    "forced to side-effect and proven idempotent at once; remove one",
                )
    return overrides, proven


class PolicyFile:
    """A `PolicySource` backed by a file; `reload` swaps the whole value or
    nothing."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._policy = self._read()

    def _read(self) -> Policy:
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyError(str(self.path), f"cannot be read: {exc}") from None
        return parse_policy(text, str(self.path))

    def current(self) -> Policy:
        return self._policy

    def reload(
        self, commit: Callable[[Policy, Policy], None] | None = None
    ) -> tuple[Policy, Policy]:
        """Reads the file again; returns (old, new). On error the old policy
        stays in force and PolicyError says why.

        `commit(old, new)`, when given, runs after the file is validated and
        before the new policy takes effect (to write the change durably to
        the audit log); if it raises, the old policy stays in force.
        """
        with self._lock:
            new = self._read()
            old = self._policy
            if commit is not None:
                commit(old, new)
            self._policy = new
            return old, new
