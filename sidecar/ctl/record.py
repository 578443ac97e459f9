"""A call's record as a person reads it, written once for `effectd ctl show`
and the console's call page: the approval, the effect (forced or not), the
kept input and whether it hashes to the fingerprint a decision is bound to,
and the columns of the history and the reconciliations. What each fact and
each cell says is decided here; a face only lays them out in its medium
(aligned text, HTML) and picks the columns it shows. A cell is text, a
number, or a time that the face formats (`when`, or the page's `<time>`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeAlias, TypeVar

from effectd.v1 import ledger_pb2 as pb
from google.protobuf.timestamp_pb2 import Timestamp

from sidecar.ctl.output import enum_name, when
from sidecar.ctl.states import state_name, transition_to
from sidecar.ledger import fingerprint
from sidecar.ledger.model import Payload, PayloadKind

T = TypeVar("T")
Cell: TypeAlias = str | int | Timestamp


@dataclass(frozen=True, slots=True)
class Column(Generic[T]):
    """A column of one of a record's tables: its title and its cell."""

    title: str
    cell: Callable[[T], Cell]


def rows(columns: Sequence[Column[T]], items: Iterable[T]) -> list[list[Cell]]:
    return [[c.cell(item) for c in columns] for item in items]


HISTORY: tuple[Column[pb.Transition], ...] = (
    Column("Rev", lambda t: t.revision),
    Column("At", lambda t: t.at),
    Column("Event", lambda t: t.event),
    Column("From", lambda t: state_name(t.from_state)),
    Column("To", transition_to),
    Column("Attempt", lambda t: t.attempt),
    Column("Actor", lambda t: t.actor),
    Column("Reason", lambda t: t.reason),
)

_RECONCILIATION: tuple[Column[pb.Reconciliation], ...] = (
    Column("Rev", lambda r: r.revision),
    Column("At", lambda r: r.reconciled_at),
    Column(
        "Resolution",
        lambda r: enum_name(pb.Resolution.Name(r.resolution), "RESOLUTION_"),
    ),
    Column("From", lambda r: state_name(r.from_state)),
    Column("Attempt", lambda r: r.attempt),
    Column("Operator", lambda r: r.operator),
    Column("Reason", lambda r: r.reason),
    Column("Evidence", lambda r: r.evidence),
)


def reconciliation(*titles: str) -> tuple[Column[pb.Reconciliation], ...]:
    """The reconciliations' columns of these titles, in this order."""
    by_title = {c.title: c for c in _RECONCILIATION}
    return tuple(by_title[t] for t in titles)


def approval(call: pb.ToolCall) -> str:
    """Whether the call needs an approval, and the decision when made."""
    if not call.approval_required:
        return "not required"
    if not call.HasField("approval"):
        return "pending"
    a = call.approval
    verdict = "approved" if a.approved else "rejected"
    return (
        f"{verdict} by {a.approver} at {when(a.decided_at)} "
        f"(revision {a.revision}): {a.reason}"
    )


def effect(call: pb.ToolCall) -> tuple[str, str | None]:
    """The effect the call declared, and the one an operator forced on it
    (ADR-010 R2), None when none was."""
    declared = enum_name(pb.Effect.Name(call.effect), "EFFECT_")
    if call.forced_effect == pb.EFFECT_UNSPECIFIED:
        return declared, None
    return declared, enum_name(pb.Effect.Name(call.forced_effect), "EFFECT_")


@dataclass(frozen=True, slots=True)
class KeptInput:
    """The call's input as sent: JSON text, or raw bytes (`json` None);
    `matches`: it hashes to the input fingerprint. Someone else wrote that
    copy: a person decides on it only when it matches."""

    json: str | None
    raw: bytes
    matches: bool


def kept_input(call: pb.ToolCall) -> KeptInput | None:
    """The kept input; None when the daemon keeps none for the call."""
    if not call.HasField("kept_input"):
        return None
    kept = call.kept_input
    if kept.WhichOneof("kind") == "raw":
        return KeptInput(None, kept.raw, input_matches(call))
    return KeptInput(kept.json, b"", input_matches(call))


def input_matches(call: pb.ToolCall) -> bool:
    """Whether the call's kept input hashes to its input fingerprint, the
    one an approval is bound to; False when no input is kept."""
    if not call.HasField("kept_input"):
        return False
    kept = call.kept_input
    if kept.WhichOneof("kind") == "raw":
        payload = Payload(PayloadKind.RAW, kept.raw)
    else:
        payload = Payload(PayloadKind.JSON, kept.json.encode("utf-8", "surrogatepass"))
    try:
        return fingerprint.fingerprint(payload) == call.input_fingerprint
    except fingerprint.NotCanonicalizable:
        return False
