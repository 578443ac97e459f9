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

    [inputs]
    keep_all = false       # every call keeps its exact input until committed
    max_bytes = 65536      # ... when it is at most this big (calls awaiting
                           # approval always keep theirs)

A file with an unknown key, a wrong type or a value out of range is refused
with a message that names the setting; the policy in force stays.
"""

from __future__ import annotations

import threading
import tomllib
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sidecar.ledger.model import Effect
from sidecar.ledger.policy import Policy


class PolicyError(ValueError):
    """The policy file is unreadable or invalid; the message names the setting."""


_SECTIONS: dict[str, dict[str, type]] = {
    "retry": {
        "retry_safe": bool,
        "max_attempts": int,
        "require_idempotency_proof": bool,
    },
    "leases": {"default_ms": int},
    "retention": {"days": int, "unacknowledged_days": int, "tombstone_days": int},
    "reconcile": {"quarantine_leases": int},
    "inputs": {"keep_all": bool, "max_bytes": int},
}
_RANGES: dict[tuple[str, str], tuple[int, int]] = {
    ("retry", "max_attempts"): (1, 100),
    ("leases", "default_ms"): (1, 3_600_000),
    ("retention", "days"): (1, 3650),
    ("retention", "unacknowledged_days"): (1, 3650),
    ("retention", "tombstone_days"): (1, 3650),
    ("reconcile", "quarantine_leases"): (1, 1000),
    ("inputs", "max_bytes"): (1, 1 << 20),
}


def _check(section: str, key: str, value: Any, kind: type) -> Any:
    # bool is an int in Python: check it first, both ways.
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
        raise PolicyError(f"{section}.{key}: must be a {kind.__name__}, got {value!r}")
    bounds = _RANGES.get((section, key))
    number: Any = value
    if bounds is not None and not bounds[0] <= number <= bounds[1]:
        raise PolicyError(
            f"{section}.{key}: must be between {bounds[0]} and {bounds[1]}"
        )
    return value


def parse_policy(text: str, source: str = "policy") -> Policy:
    """The policy a TOML text describes; omitted settings keep their defaults."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{source}: not valid TOML: {exc}") from None
    values: dict[str, Any] = {}
    for section, table in doc.items():
        if section == "tools":
            continue
        if section not in _SECTIONS or not isinstance(table, dict):
            raise PolicyError(
                f"{section}: unknown section "
                "(known: retry, leases, retention, reconcile, inputs, tools)"
            )
        for key, value in table.items():
            if key not in _SECTIONS[section]:
                raise PolicyError(f"{section}.{key}: unknown setting")
            values[f"{section}.{key}"] = _check(
                section, key, value, _SECTIONS[section][key]
            )
    overrides, proven = _tools(doc.get("tools", {}))
    default = Policy()
    days = values.get("retention.days", default.retention_seconds // 86400)
    unacknowledged_days = values.get(
        "retention.unacknowledged_days",
        max(days, default.unacknowledged_retention_seconds // 86400),
    )
    if unacknowledged_days < days:
        raise PolicyError(
            "retention.unacknowledged_days: must be at least retention.days: a "
            "result never delivered is kept no shorter than a delivered one"
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


_TOOL_KEYS = frozenset({"effect", "idempotency_proven"})


def _tools(tools: Any) -> tuple[dict[str, Effect], set[str]]:
    """The [tools.NAME] sections: forced effects, and tools proven idempotent."""
    if not isinstance(tools, dict):
        raise PolicyError("tools: must be a table of [tools.NAME] sections")
    overrides: dict[str, Effect] = {}
    proven: set[str] = set()
    for name, table in tools.items():
        if not isinstance(table, dict) or not table or not set(table) <= _TOOL_KEYS:
            raise PolicyError(
                f"tools.{name}: must set `effect` or `idempotency_proven`, nothing else"
            )
        if "effect" in table:
            if table["effect"] != Effect.SIDE_EFFECT.value:
                raise PolicyError(
                    f'tools.{name}.effect: only "side-effect" can be forced; a policy '
                    "never makes a tool less conservative than its callers declare"
                )
            overrides[name] = Effect.SIDE_EFFECT
        if "idempotency_proven" in table:
            if _check(
                "tools", f"{name}.idempotency_proven", table["idempotency_proven"], bool
            ):
                proven.add(name)
            if name in overrides and name in proven:
                raise PolicyError(
                    f"tools.{name}: forced to side-effect and proven idempotent at "
                    "once; remove one"
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
            raise PolicyError(f"{self.path}: cannot be read: {exc}") from None
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
