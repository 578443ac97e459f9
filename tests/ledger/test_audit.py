"""The hash chain of the audit log (contract §10.5): sealing, encoding, verification.

A chain built by `seal` verifies; every kind of tampering (an edited,
inserted, reordered or removed entry, an edited head) is caught at the first
entry it breaks. The tampering cases are the negative controls: a verifier
that accepted any of them would prove nothing.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest

from sidecar.ledger import audit, operator_rules
from sidecar.ledger.audit import GENESIS, Action, Fact, Head
from sidecar.ledger.model import Effect, State
from sidecar.ledger.operator_rules import ReconcileOrder
from tests.ledger.builders import REF, moment, unknown

Stored = list[tuple[int, bytes]]
N = 5


def fact(i: int, namespace: str = "default") -> Fact:
    return Fact(
        # Beyond 2**53: RFC 8785 cannot hold it as a number.
        at_ns=1_700_000_000_000_000_000 + i,
        actor=f"operator-{i}",
        action=Action.RECONCILE_NOT_EXECUTED,
        namespace=namespace,
        run_id="run",
        call_id=f"call-{i}",
        revision_before=3,
        revision_after=4,
        state_before=State.UNKNOWN,
        state_after=State.PREPARED,
        reason="checked the provider",
        evidence=f"no charge {i} — none at all",
        details={"attempt": "1"},
    )


def chain(n: int = N) -> tuple[Stored, Head | None]:
    head: Head | None = None
    stored: Stored = []
    for i in range(1, n + 1):
        entry = audit.seal(fact(i), head)
        stored.append((entry.sequence, audit.encode(entry)))
        head = Head(entry.sequence, entry.hash)
    return stored, head


def _edit(raw: bytes, **changes: object) -> bytes:
    doc = json.loads(raw)
    doc.update(changes)
    return json.dumps(doc).encode()


def _rehash(raw: bytes, **changes: object) -> bytes:
    """An edit by someone who also recomputes the entry's own hash."""
    entry = audit.decode(_edit(raw, **changes))
    previous = (
        None if entry.sequence == 1 else Head(entry.sequence - 1, entry.previous_hash)
    )
    return audit.encode(audit.seal(entry.fact, previous))


def test_a_sealed_chain_verifies() -> None:
    """A chain of sealed entries with its head verifies, every entry checked."""
    stored, head = chain()
    assert audit.verify(stored, head) == audit.Verdict(True, N)


def test_the_empty_chain_verifies() -> None:
    """No entries and no head is an intact (empty) chain."""
    assert audit.verify([], None) == audit.Verdict(True, 0)


def test_entries_link_to_their_predecessor() -> None:
    """The first entry links to GENESIS, each later one to the hash before it."""
    stored, _ = chain(3)
    entries = [audit.decode(raw) for _, raw in stored]
    assert entries[0].previous_hash == GENESIS
    assert [e.previous_hash for e in entries[1:]] == [e.hash for e in entries[:-1]]
    assert [e.sequence for e in entries] == [1, 2, 3]


def test_encoding_round_trips() -> None:
    """decode(encode(entry)) is the entry, nanosecond time and text included."""
    entry = audit.seal(fact(1), None)
    assert audit.decode(audit.encode(entry)) == entry


def test_the_hash_is_over_the_canonical_form() -> None:
    """The same content with other key order and spacing has the same hash
    (RFC 8785), so the stored bytes' layout is not part of the chain."""
    stored, head = chain(2)
    doc = json.loads(stored[0][1])
    relaid = json.dumps(dict(reversed(list(doc.items()))), indent=2).encode()
    assert audit.verify([(1, relaid), stored[1]], head).ok


def test_the_hash_covers_every_field() -> None:
    """Changing any single field of a fact changes the entry's hash."""
    base = audit.seal(fact(1), None).hash
    changes: list[tuple[str, Any]] = [
        ("at_ns", 1),
        ("actor", "mallory"),
        ("action", Action.APPROVE),
        ("namespace", "other"),
        ("run_id", "r2"),
        ("call_id", "c2"),
        ("revision_before", 9),
        ("revision_after", 9),
        ("state_before", State.STARTED),
        ("state_after", None),
        ("reason", "x"),
        ("evidence", "y"),
        ("details", {"attempt": "2"}),
    ]
    variants = [dataclasses.replace(fact(1), **{k: v}) for k, v in changes]
    assert len(variants) == len(dataclasses.fields(Fact))
    hashes = {audit.seal(v, None).hash for v in variants}
    assert base not in hashes
    assert len(hashes) == len(variants)


# -- tampering: each must be caught at the right entry ---------------------------


def _swap(s: Stored) -> Stored:
    return [s[0], (2, s[2][1]), (3, s[1][1]), *s[3:]]


def _replace(s: Stored, sequence: int, raw: bytes) -> Stored:
    return [(seq, raw if seq == sequence else old) for seq, old in s]


def _forged_third(s: Stored) -> bytes:
    return audit.encode(audit.seal(fact(99), Head(2, audit.decode(s[1][1]).hash)))


def _insert(s: Stored) -> Stored:
    """A forged entry slipped in as 3, the later ones moved up unchanged."""
    return [*s[:2], (3, _forged_third(s)), *((seq + 1, raw) for seq, raw in s[2:])]


def _insert_and_rehash(s: Stored) -> Stored:
    """A forged entry slipped in as 3, every later entry re-sealed after it."""
    out = [*s[:2], (3, _forged_third(s))]
    for _, raw in s[2:]:
        previous = audit.decode(out[-1][1])
        entry = audit.seal(
            audit.decode(raw).fact, Head(previous.sequence, previous.hash)
        )
        out.append((entry.sequence, audit.encode(entry)))
    return out


# (case, tampering, first bad sequence, entries checked before it, why)
TAMPERING: list[tuple[str, Callable[[Stored], Stored], int, int, str]] = [
    ("edited", lambda s: _replace(s, 2, _edit(s[1][1], reason="x")), 2, 1, "edited"),
    ("edited time", lambda s: _replace(s, 3, _edit(s[2][1], at_ns="1")), 3, 2, "edit"),
    (
        "edited, rehashed",
        lambda s: _replace(s, 2, _rehash(s[1][1], reason="x")),
        3,
        2,
        "link",
    ),
    (
        "first rehashed",
        lambda s: _replace(s, 1, _rehash(s[0][1], actor="m")),
        2,
        1,
        "link",
    ),
    ("swapped", _swap, 2, 1, "says it is"),
    ("inserted", _insert, 4, 3, "says it is"),
    ("inserted, rehashed", _insert_and_rehash, N + 1, N, "beyond the chain head"),
    ("removed middle", lambda s: [*s[:2], *s[3:]], 4, 2, "expected entry 3"),
    ("removed first", lambda s: s[1:], 2, 0, "expected entry 1"),
    ("garbage", lambda s: _replace(s, 2, b"\xff not json"), 2, 1, "cannot be read"),
    ("version", lambda s: _replace(s, 2, _edit(s[1][1], v=2)), 2, 1, "cannot be read"),
    (
        "renumbered",
        lambda s: _replace(s, 2, _rehash(s[1][1], seq=7)),
        2,
        1,
        "says it is",
    ),
]


@pytest.mark.parametrize(
    ("tamper", "bad", "checked", "why"),
    [pytest.param(t, b, c, w, id=name) for name, t, b, c, w in TAMPERING],
)
def test_tampering_is_caught(
    tamper: Callable[[Stored], Stored], bad: int, checked: int, why: str
) -> None:
    """Any edited, inserted, reordered or removed entry fails verification at
    the first sequence it breaks, with a reason."""
    stored, head = chain()
    verdict = audit.verify(tamper(stored), head)
    assert (verdict.ok, verdict.bad_sequence, verdict.checked) == (False, bad, checked)
    assert why in verdict.problem


def test_removing_the_newest_entry_is_caught_by_the_head() -> None:
    """Removing the last entries leaves a chain that links, but it ends before
    the head kept apart from it."""
    stored, head = chain()
    verdict = audit.verify(stored[:-1], head)
    assert (verdict.ok, verdict.bad_sequence, verdict.checked) == (False, N, N - 1)
    assert "newest entries removed" in verdict.problem
    assert not audit.verify([], head).ok


def test_replacing_the_newest_entry_is_caught_by_the_head() -> None:
    """A rehashed newest entry links to its predecessor but not to the head."""
    stored, head = chain()
    forged = [*stored[:-1], (N, _rehash(stored[-1][1], reason="x"))]
    verdict = audit.verify(forged, head)
    assert (verdict.ok, verdict.bad_sequence) == (False, N)
    assert "differs from the head" in verdict.problem


def test_entries_beyond_the_head_are_caught() -> None:
    """An entry appended without moving the head, or entries without a head,
    fail verification."""
    stored, head = chain()
    assert head is not None
    behind = Head(N - 1, audit.decode(stored[-2][1]).hash)
    verdict = audit.verify(stored, behind)
    assert (verdict.ok, verdict.bad_sequence) == (False, N)
    headless = audit.verify(stored, None)
    assert (headless.ok, headless.bad_sequence) == (False, 1)


def test_call_fact_describes_the_change() -> None:
    """call_fact takes identity, revisions and states from the two records."""
    old = unknown(Effect.SIDE_EFFECT)
    order = ReconcileOrder(old.revision, None, "olga", "why", "what", 1)
    new = operator_rules.reconcile(old, moment(), order).call
    got = audit.call_fact(
        Action.RECONCILE_NOT_EXECUTED,
        old,
        new,
        at_ns=5,
        actor="olga",
        reason="why",
        evidence="what",
        details={"attempt": "1"},
    )
    assert (got.namespace, got.run_id, got.call_id) == (
        REF.namespace,
        REF.run_id,
        REF.call_id,
    )
    assert (got.revision_before, got.revision_after) == (old.revision, new.revision)
    assert (got.state_before, got.state_after) == (State.UNKNOWN, State.PREPARED)
    assert (got.evidence, dict(got.details)) == ("what", {"attempt": "1"})
