"""The audit log of operator actions (contract §10.5): entries and their hash chain.

An entry states one fact (who did what to which record, when, why, with what
evidence) and is sealed with its sequence number and the hash of the entry
before it. Its hash is the SHA-256 of the RFC 8785 form of its document
without the hash itself, so editing, inserting, reordering or removing any
entry breaks the chain; the chain head (last sequence and hash) is kept
apart, so removing the newest entries is detected too. Everything here is
pure: storage passes stored entries in, `verify` tells what it found.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import rfc8785

from sidecar.ledger.model import State, ToolCall

ENTRY_VERSION = 1
# The `previous_hash` of the first entry.
GENESIS = "sha256:" + "0" * 64


class Action(enum.Enum):
    """What an audited operator action did; new actions are only added."""

    APPROVE = "approve"
    REJECT = "reject"
    RECONCILE_COMMITTED = "reconcile_committed"
    RECONCILE_NOT_EXECUTED = "reconcile_not_executed"
    # The policy file was reloaded (ADR-010 R2); the entry names no record.
    POLICY_RELOAD = "policy_reload"
    # An operator put the open calls of a tool into reconciliation (ADR-010
    # R2): one entry per call made a SIDE_EFFECT for good.
    ENTER_RECONCILIATION = "enter_reconciliation"
    # The store was restored from a backup (`ledger.restore`); no record.
    RESTORE = "restore"


def _no_details() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Fact:
    """What happened, before it is sealed into the chain."""

    at_ns: int
    actor: str
    action: Action
    namespace: str
    run_id: str
    call_id: str
    revision_before: int
    revision_after: int
    state_before: State | None
    state_after: State | None
    reason: str
    evidence: str
    details: Mapping[str, str] = field(default_factory=_no_details)


@dataclass(frozen=True, slots=True)
class Entry:
    sequence: int
    fact: Fact
    previous_hash: str
    hash: str


@dataclass(frozen=True, slots=True)
class Head:
    """The newest entry of the chain, kept apart from the entries."""

    sequence: int
    hash: str


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    checked: int
    # 0 when ok.
    bad_sequence: int = 0
    problem: str = ""


class MalformedEntry(ValueError):
    """A stored entry that is not an audit entry document."""


def call_fact(
    action: Action,
    old: ToolCall,
    new: ToolCall,
    *,
    at_ns: int,
    actor: str,
    reason: str,
    evidence: str = "",
    details: Mapping[str, str] | None = None,
) -> Fact:
    """The fact of an operator action that changed record `old` into `new`."""
    return Fact(
        at_ns=at_ns,
        actor=actor,
        action=action,
        namespace=old.ref.namespace,
        run_id=old.ref.run_id,
        call_id=old.ref.call_id,
        revision_before=old.revision,
        revision_after=new.revision,
        state_before=old.state,
        state_after=new.state,
        reason=reason,
        evidence=evidence,
        details=MappingProxyType(dict(details or {})),
    )


# -- the document and its hash ----------------------------------------------


def _state_doc(state: State | None) -> str | None:
    return None if state is None else state.value


def _document(sequence: int, fact: Fact, previous_hash: str) -> dict[str, Any]:
    # Nanosecond times exceed the exact integer range of RFC 8785 (2**53):
    # they are decimal strings.
    return {
        "v": ENTRY_VERSION,
        "seq": sequence,
        "at_ns": str(fact.at_ns),
        "actor": fact.actor,
        "action": fact.action.value,
        "ref": [fact.namespace, fact.run_id, fact.call_id],
        "revision": [fact.revision_before, fact.revision_after],
        "state": [_state_doc(fact.state_before), _state_doc(fact.state_after)],
        "reason": fact.reason,
        "evidence": fact.evidence,
        "details": dict(fact.details),
        "prev": previous_hash,
    }


def _digest(document: Mapping[str, Any]) -> str:
    body = {k: v for k, v in document.items() if k != "hash"}
    return "sha256:" + hashlib.sha256(rfc8785.dumps(body)).hexdigest()


def seal(fact: Fact, previous: Head | None) -> Entry:
    """`fact` as the entry after `previous` (None: the first entry)."""
    sequence = 1 if previous is None else previous.sequence + 1
    prev_hash = GENESIS if previous is None else previous.hash
    digest = _digest(_document(sequence, fact, prev_hash))
    return Entry(sequence, fact, prev_hash, digest)


def encode(entry: Entry) -> bytes:
    """The stored form: the canonical document, hash included."""
    document = _document(entry.sequence, entry.fact, entry.previous_hash)
    document["hash"] = entry.hash
    return bytes(rfc8785.dumps(document))


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise MalformedEntry(f"not JSON: {exc}") from exc
    if not isinstance(document, dict) or document.get("v") != ENTRY_VERSION:
        raise MalformedEntry("not an audit entry of version 1")
    return document


def decode(raw: bytes) -> Entry:
    """The entry stored as `raw` (its hash is not checked here; see `verify`).

    Raises:
        MalformedEntry: `raw` is not an entry document.
    """
    d = _parse(raw)
    try:
        namespace, run_id, call_id = d["ref"]
        before, after = d["revision"]
        state_before, state_after = d["state"]
        fact = Fact(
            at_ns=int(d["at_ns"]),
            actor=str(d["actor"]),
            action=Action(d["action"]),
            namespace=str(namespace),
            run_id=str(run_id),
            call_id=str(call_id),
            revision_before=int(before),
            revision_after=int(after),
            state_before=None if state_before is None else State(state_before),
            state_after=None if state_after is None else State(state_after),
            reason=str(d["reason"]),
            evidence=str(d["evidence"]),
            details=MappingProxyType(
                {str(k): str(v) for k, v in dict(d["details"]).items()}
            ),
        )
        return Entry(int(d["seq"]), fact, str(d["prev"]), str(d["hash"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedEntry(f"missing or invalid field: {exc}") from exc


# -- verification ------------------------------------------------------------


def _check(sequence: int, raw: bytes, expected: Head | None) -> str:
    """Why the entry stored under `sequence` does not continue the chain
    after `expected`, or "" when it does."""
    try:
        document = _parse(raw)
        entry = decode(raw)
    except MalformedEntry as exc:
        return f"the entry cannot be read: {exc}"
    want_sequence = 1 if expected is None else expected.sequence + 1
    want_prev = GENESIS if expected is None else expected.hash
    if _digest(document) != entry.hash:
        return "the entry's hash does not match its content (edited)"
    if entry.sequence != sequence:
        return f"the entry stored under {sequence} says it is {entry.sequence}"
    if sequence != want_sequence:
        return f"expected entry {want_sequence} here (entries missing or inserted)"
    if entry.previous_hash != want_prev:
        return "the entry does not link to the entry before it"
    return ""


def verify(stored: Iterable[tuple[int, bytes]], head: Head | None) -> Verdict:
    """Walks the chain, oldest first, and names the first entry that breaks it.

    Args:
        stored: (sequence it is stored under, stored bytes), in sequence order.
        head: the chain head as kept apart from the entries; None if absent.
    """
    previous: Head | None = None
    checked = 0
    for sequence, raw in stored:
        problem = _check(sequence, raw, previous)
        if problem:
            return Verdict(False, checked, sequence, problem)
        if head is None or sequence > head.sequence:
            return Verdict(
                False, checked, sequence, "the entry lies beyond the chain head"
            )
        previous = Head(sequence, decode(raw).hash)
        checked += 1
    if head is None:
        return Verdict(True, checked)
    if previous is None or previous.sequence < head.sequence:
        last = 0 if previous is None else previous.sequence
        return Verdict(
            False,
            checked,
            last + 1,
            f"the chain ends at entry {last} but its head is entry {head.sequence} "
            "(newest entries removed)",
        )
    if previous.hash != head.hash:
        return Verdict(
            False, checked, head.sequence, "the newest entry differs from the head"
        )
    return Verdict(True, checked)
