"""The daemon as one signed-in person's browser session reaches it: the
public client (`effectd_client.Client`) on one channel that carries that
person's token, and the RPCs the console sends through its operator
surface, the same ones `effectd ctl` sends. Nothing here reads the store:
every answer and every refusal is the daemon's own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from effectd.v1 import admin_pb2 as apb
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import recovery_pb2 as rpb

from effectd_client import Client, Connection, State
from sidecar.ctl.output import printable
from sidecar.ctl.record import input_matches

# What waits for a person: an approval, or a reconciliation.
WAITING = (State.AWAITING_APPROVAL, State.UNKNOWN)
# The audit log a page shows at most, newest first.
AUDIT_PAGE = 200
# Queue rows whose input is shown (a read of the call each), and inputs
# remembered per session (the input of a fingerprint never changes).
PREVIEWS = 100
_REMEMBERED = 1000


class Ref(NamedTuple):
    """The call a page or a form is about."""

    namespace: str
    run_id: str
    call_id: str


@dataclass(frozen=True, slots=True)
class Preview:
    """The start of a call's kept input, made printable, and whether the
    whole of it hashes to the fingerprint; `text` is "" when not kept."""

    text: str
    matches: bool


class Daemon:
    """One session's view of the daemon: its token on every call."""

    def __init__(self, connection: Connection, timeout: float) -> None:
        self.timeout = timeout
        # A page says at once that the daemon is away rather than wait.
        self._client = Client(
            connection, timeout=timeout, session=False, reconnect_wait=0
        )
        # The decisions go straight to the client's operator surface.
        self.operator = self._client.operator
        self._admin = self._client.admin
        self._previews: dict[tuple[str, str, str, str], Preview] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._client.close()

    def check(self) -> tuple[str, tuple[str, ...]]:
        """Proves the credential with a read every role may make; answers
        whose token the daemon took it for and its roles ("", () without
        authentication)."""
        caller = self.operator.caller()
        return caller.name, caller.roles

    def calls(
        self,
        states: tuple[State, ...] = (),
        run_id: str = "",
        namespace: str = "",
        *,
        limit: int = 0,
    ) -> list[pb.ToolCall]:
        """Every matching call of `namespace`, or of every namespace the
        token may see (""), following page tokens; at most `limit` (0: all)."""
        return self.operator.calls(
            states=states,
            run_id=run_id,
            namespace=namespace,
            all_namespaces=not namespace,
            limit=limit,
        )

    def waiting(self) -> list[pb.ToolCall]:
        """The calls waiting for a person, oldest first."""
        return sorted(
            self.calls(WAITING),
            key=lambda c: (c.created_at.seconds, c.created_at.nanos, _key(c.ref)),
        )

    def call(self, ref: Ref | pb.CallRef) -> pb.ToolCall:
        return self.operator.record(ref.run_id, ref.call_id, namespace=ref.namespace)

    def previews(self, calls: list[pb.ToolCall]) -> dict[tuple[str, str, str], Preview]:
        """The input previews of the first PREVIEWS of `calls` (a listing
        carries no input: each is read once per fingerprint)."""
        shown: dict[tuple[str, str, str], Preview] = {}
        for c in calls[:PREVIEWS]:
            key = (*_key(c.ref), c.input_fingerprint)
            with self._lock:
                found = self._previews.get(key)
            if found is None:
                found = preview(self.call(c.ref))
                with self._lock:
                    self._previews[key] = found
                    while len(self._previews) > _REMEMBERED:
                        self._previews.pop(next(iter(self._previews)))
            shown[_key(c.ref)] = found
        return shown

    def recover(self, namespace: str, run_id: str) -> Iterator[rpb.RecoverResponse]:
        """The recovery plan of a run, page by page. Recover settles the
        run's expired leases (it never executes anything), as `effectd ctl
        recover` does: a state-changing request, so only a POST calls it."""
        return self.operator.recover_pages(run_id, namespace=namespace)

    def audit(self, namespace: str) -> list[apb.AuditEntry]:
        """The newest entries of the audit log of `namespace` ("": all)."""
        return self._admin.audit_entries(
            namespace=namespace,
            newest_first=True,
            limit=AUDIT_PAGE,
            page_size=AUDIT_PAGE,
        )

    def verify(self) -> apb.VerifyAuditResponse:
        return self._admin.verify_audit()


def _key(ref: Ref | pb.CallRef) -> tuple[str, str, str]:
    return ref.namespace, ref.run_id, ref.call_id


def preview(call: pb.ToolCall, most: int = 120) -> Preview:
    """The first `most` characters of the kept input, control and format
    characters escaped (an agent wrote it)."""
    if not call.HasField("kept_input"):
        return Preview("", False)
    kept = call.kept_input
    if kept.WhichOneof("kind") == "raw":
        text = f"<{len(kept.raw)} raw bytes>"
    else:
        text = printable(kept.json[:most]) + ("…" if len(kept.json) > most else "")
    return Preview(text, input_matches(call))
