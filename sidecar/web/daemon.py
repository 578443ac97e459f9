"""The daemon as one signed-in person's browser session reaches it: the
generated stubs on one channel that carries that person's token, and the
RPCs the console calls, the same ones `effectd ctl` calls. Nothing here
reads the store: every answer and every refusal is the daemon's own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import grpc
from effectd.v1 import admin_pb2 as apb
from effectd.v1 import admin_pb2_grpc, ledger_pb2_grpc, recovery_pb2_grpc
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import recovery_pb2 as rpb

from effectd_client import Connection, EffectdError
from sidecar.ctl.calls import input_matches
from sidecar.ctl.output import printable

T = TypeVar("T")

# What waits for a person: an approval, or a reconciliation.
WAITING = (pb.CALL_STATE_AWAITING_APPROVAL, pb.CALL_STATE_UNKNOWN)
# The audit log a page shows at most, newest first.
AUDIT_PAGE = 200
# Queue rows whose input is shown (a read of the call each), and inputs
# remembered per session (the input of a fingerprint never changes).
PREVIEWS = 100
_REMEMBERED = 1000


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
        self._connection = connection
        self._channel = connection.channel()
        self._ledger = ledger_pb2_grpc.ToolLedgerStub(self._channel)
        self._admin = admin_pb2_grpc.AdminStub(self._channel)
        self._recovery = recovery_pb2_grpc.RecoveryStub(self._channel)
        self._previews: dict[tuple[str, str, str, str], Preview] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Callable[..., T], request: object) -> T:
        try:
            return method(
                request, timeout=self.timeout, metadata=self._connection.metadata
            )
        except grpc.RpcError as exc:
            raise EffectdError.from_rpc_error(exc) from None

    def check(self) -> tuple[str, tuple[str, ...]]:
        """Proves the credential with a read every role may make; answers
        whose token the daemon took it for and its roles ("", () without
        authentication)."""
        answer = self._call(
            self._ledger.ListToolCalls,
            pb.ListToolCallsRequest(all_namespaces=True, page_size=1),
        )
        return answer.caller, tuple(answer.caller_roles)

    def calls(
        self,
        states: tuple[pb.CallState.ValueType, ...] = (),
        run_id: str = "",
        namespace: str = "",
        *,
        limit: int = 0,
    ) -> list[pb.ToolCall]:
        """Every matching call of `namespace`, or of every namespace the
        token may see (""), following page tokens; at most `limit` (0: all)."""
        found: list[pb.ToolCall] = []
        token = ""
        while not limit or len(found) < limit:
            page = self._call(
                self._ledger.ListToolCalls,
                pb.ListToolCallsRequest(
                    namespace=namespace,
                    all_namespaces=not namespace,
                    run_id=run_id,
                    states=list(states),
                    page_token=token,
                ),
            )
            found.extend(page.calls)
            token = page.next_page_token
            if not token:
                break
        return found[:limit] if limit else found

    def waiting(self) -> list[pb.ToolCall]:
        """The calls waiting for a person, oldest first."""
        return sorted(
            self.calls(WAITING),
            key=lambda c: (c.created_at.seconds, c.created_at.nanos, _key(c.ref)),
        )

    def call(self, ref: pb.CallRef) -> pb.ToolCall:
        return self._call(self._ledger.GetToolCall, pb.GetToolCallRequest(ref=ref)).call

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

    def decide(self, request: pb.DecideApprovalRequest) -> pb.ToolCall:
        """The decision (`sidecar.ctl.requests.decide_request`), as decided."""
        return self._call(self._ledger.DecideApproval, request).call

    def reconcile(self, request: pb.ReconcileRequest) -> pb.ToolCall:
        """The reconciliation (`sidecar.ctl.requests.reconcile_request`)."""
        return self._call(self._ledger.Reconcile, request).call

    def recover(self, namespace: str, run_id: str) -> Iterator[rpb.RecoverResponse]:
        """The recovery plan of a run, page by page. Recover settles the
        run's expired leases (it never executes anything), as `effectd ctl
        recover` does: a state-changing request, so only a POST calls it."""
        token = ""
        while True:
            page = self._call(
                self._recovery.Recover,
                rpb.RecoverRequest(
                    namespace=namespace, run_id=run_id, page_token=token
                ),
            )
            yield page
            token = page.next_page_token
            if not token:
                return

    def audit(self, namespace: str) -> list[apb.AuditEntry]:
        """The newest entries of the audit log of `namespace` ("": all)."""
        page = self._call(
            self._admin.ListAudit,
            apb.ListAuditRequest(
                namespace=namespace, newest_first=True, page_size=AUDIT_PAGE
            ),
        )
        return list(page.entries)

    def verify(self) -> apb.VerifyAuditResponse:
        return self._call(self._admin.VerifyAudit, apb.VerifyAuditRequest())


def _key(ref: pb.CallRef) -> tuple[str, str, str]:
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
