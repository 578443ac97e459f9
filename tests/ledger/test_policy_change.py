"""A policy change as an audit fact (ADR-010 R2, contract §10.5), and the reload
that writes it: the new policy takes effect only once its audit entry is
durable."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType

import pytest

from sidecar.clock import ManualClock
from sidecar.errors import EffectdError, NoPolicyFile, PolicyInvalid
from sidecar.ledger import audit, policy_change
from sidecar.ledger.model import Effect
from sidecar.ledger.policy import FixedPolicy, Policy
from sidecar.policy_file import PolicyFile
from sidecar.services.policy import PolicyService
from sidecar.storage import records
from sidecar.storage.lmdb.store import LmdbStore

BASE = Policy()


def _forcing(*names: str) -> Policy:
    return Policy(
        effect_overrides=MappingProxyType(dict.fromkeys(names, Effect.SIDE_EFFECT))
    )


CHANGES = [
    ("nothing", BASE, BASE, []),
    # ADR-010 R2: the kill switch and a forced effect are named as in the file.
    ("kill switch", BASE, Policy(retry_safe_enabled=False), ["retry.retry_safe"]),
    ("forced tool", BASE, _forcing("pay"), ["tools.pay.effect"]),
    ("unforced tool", _forcing("pay"), BASE, ["tools.pay.effect"]),
    ("same forced tools", _forcing("a", "b"), _forcing("b", "a"), []),
    # ADR-010 R1: the attempt budget; contract §4.7: the retention window.
    ("budget", BASE, Policy(max_attempts=1), ["retry.max_attempts"]),
    ("lease", BASE, Policy(default_lease_ms=5), ["leases.default_ms"]),
    ("retention", BASE, Policy(retention_seconds=86_400), ["retention.days"]),
    # ADR-010 D1, R3: the reconcile quarantine.
    (
        "quarantine",
        BASE,
        Policy(reconcile_quarantine_leases=9),
        ["reconcile.quarantine_leases"],
    ),
    # ADR-010 "compatibility": proof of de-duplication.
    (
        "proof",
        BASE,
        Policy(idempotency_proof_required=True),
        ["retry.require_idempotency_proof"],
    ),
    (
        "proven tool",
        BASE,
        Policy(proven_idempotent_tools=frozenset({"crm"})),
        ["tools.crm.idempotency_proven"],
    ),
    # What the daemon keeps of each call's input for a person to read.
    ("keep inputs", BASE, Policy(keep_inputs=True), ["inputs.keep_all"]),
    ("input cap", BASE, Policy(max_kept_input_bytes=1), ["inputs.max_bytes"]),
]


@pytest.mark.parametrize(
    ("old", "new", "changed"),
    [row[1:] for row in CHANGES],
    ids=[row[0] for row in CHANGES],
)
def test_changes_name_the_settings(
    old: Policy, new: Policy, changed: list[str]
) -> None:
    """`changes` lists the settings that differ by their policy-file names."""
    assert policy_change.changes(old, new) == changed


def test_the_canonical_form_does_not_depend_on_order() -> None:
    """Two equal policies have one canonical JSON, whatever the order their
    overrides were read in, and it parses back to the document."""
    one, two = _forcing("a", "b"), _forcing("b", "a")
    assert policy_change.canonical(one) == policy_change.canonical(two)
    assert json.loads(policy_change.canonical(one)) == policy_change.document(one)
    assert " " not in policy_change.canonical(one)


def test_the_fact_keeps_both_policies_whole() -> None:
    """contract §10.5: who, when, why, the file, and the old and new policy."""
    new = _forcing("pay")
    fact = policy_change.fact(
        BASE, new, at_ns=7, actor="sighup", reason="SIGHUP", source="/p.toml"
    )
    assert (fact.at_ns, fact.actor, fact.reason) == (7, "sighup", "SIGHUP")
    assert fact.action is audit.Action.POLICY_RELOAD
    assert (fact.namespace, fact.run_id, fact.call_id) == ("", "", "")
    assert json.loads(fact.details["old"]) == policy_change.document(BASE)
    assert json.loads(fact.details["new"])["effect_overrides"] == {"pay": "side-effect"}
    assert fact.details["changed"] == "tools.pay.effect"
    assert fact.details["file"] == "/p.toml"


# -- the reload and its audit entry ---------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LmdbStore]:
    s = LmdbStore(tmp_path / "data")
    yield s
    s.close()


def test_a_reload_is_durable_in_the_audit_log_before_it_decides(
    tmp_path: Path, store: LmdbStore
) -> None:
    """The entry is in the chain, sealed, when the new policy is in force."""
    path = tmp_path / "policy.toml"
    path.write_text("")
    source = PolicyFile(path)
    service = PolicyService(store, ManualClock(), source)
    path.write_text("[retry]\nretry_safe = false\n")
    done = asyncio.run(service.reload(actor="operator", reason="r"))
    assert source.current().retry_safe_enabled is False
    assert done.changed == ("retry.retry_safe",)
    head = store.read(records.load_audit_head)
    assert head is not None
    assert (head.sequence, head.hash) == (done.entry.sequence, done.entry.hash)


def test_a_failed_audit_write_keeps_the_old_policy(
    tmp_path: Path, store: LmdbStore
) -> None:
    """No audit entry, no change: when the write fails the old policy stays."""
    path = tmp_path / "policy.toml"
    path.write_text("")
    source = PolicyFile(path)
    service = PolicyService(store, ManualClock(), source)
    path.write_text("[retry]\nretry_safe = false\n")
    store.close()
    with pytest.raises(EffectdError):
        asyncio.run(service.reload(actor="operator"))
    assert source.current() == Policy()


def test_an_invalid_file_is_policy_invalid(tmp_path: Path, store: LmdbStore) -> None:
    """The PolicyError becomes POLICY_INVALID with the setting named; nothing
    is written."""
    path = tmp_path / "policy.toml"
    path.write_text("")
    service = PolicyService(store, ManualClock(), PolicyFile(path))
    path.write_text("[leases]\ndefault_ms = 0\n")
    with pytest.raises(PolicyInvalid, match=r"leases\.default_ms"):
        asyncio.run(service.reload(actor="operator"))
    assert store.read(records.load_audit_head) is None


def test_a_fixed_policy_cannot_be_reloaded(store: LmdbStore) -> None:
    """Without a policy file there is nothing to reload: NO_POLICY_FILE."""
    service = PolicyService(store, ManualClock(), FixedPolicy())
    with pytest.raises(NoPolicyFile):
        asyncio.run(service.reload(actor="operator"))
