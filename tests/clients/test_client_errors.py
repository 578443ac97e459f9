"""Every refusal raises the client exception class of its `ErrorReason`."""

from __future__ import annotations

import grpc
import pytest
from effectd.v1 import errors_pb2

from effectd_client import (
    Client,
    Effect,
    EffectdError,
    InputMismatch,
    InvalidRequest,
    NotFound,
    ReconciliationRequired,
    RetryBudgetExhausted,
    RevisionConflict,
)
from effectd_client._exceptions import REASON_CLASSES, class_of
from sidecar import errors as domain
from sidecar.rpc.errors import to_status

REASONS = [
    name
    for name in errors_pb2.ErrorReason.keys()  # noqa: SIM118 (an enum wrapper)
    if name != "ERROR_REASON_UNSPECIFIED"
]


class StatusError(grpc.RpcError):
    """A failed call as grpc raises it, built from the daemon's own status."""

    def __init__(self, status: grpc.Status) -> None:
        self._status = status

    def code(self) -> grpc.StatusCode:
        return self._status.code

    def details(self) -> str:
        return self._status.details

    # grpc-stubs types this trailer as `_Metadatum`s; grpc gives (key, value).
    def trailing_metadata(self) -> grpc.Metadata:  # type: ignore[override]
        return tuple(self._status.trailing_metadata)


@pytest.mark.parametrize("reason", REASONS)
def test_every_reason_has_its_class(reason: str) -> None:
    """Each ErrorReason value maps to its own EffectdError subclass."""
    cls = class_of(reason)
    assert cls is not EffectdError
    assert issubclass(cls, EffectdError)
    assert reason == REASON_CLASSES[reason].REASON  # type: ignore[attr-defined]


def test_no_class_for_a_reason_that_does_not_exist() -> None:
    """The table has no reason the protos do not declare."""
    assert set(REASON_CLASSES) == set(REASONS)
    assert len(set(REASON_CLASSES.values())) == len(REASONS)


def test_an_unknown_reason_is_a_plain_effectd_error() -> None:
    """A reason newer than this client still raises EffectdError."""
    error = EffectdError.from_rpc_error(
        StatusError(to_status(domain.ShuttingDown("bye")))
    )
    assert type(error).__name__ == "ShuttingDown"
    assert class_of("SOMETHING_NEW") is EffectdError


def test_input_mismatch(client: Client) -> None:
    """Another input for a prepared call raises InputMismatch (FAILED_PRECONDITION)."""
    client.prepare_tool("run-e", "c", "send", {"to": "a"})
    with pytest.raises(InputMismatch) as caught:
        client.prepare_tool("run-e", "c", "send", {"to": "b"})
    assert caught.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.reason == "INPUT_MISMATCH"


def test_revision_conflict_carries_the_current_revision(client: Client) -> None:
    """REVISION_CONFLICT exposes `currentRevision` as an int."""
    p = client.prepare_tool("run-e", "r", "send", {"to": "a"})
    with pytest.raises(RevisionConflict) as caught:
        client.start_tool("run-e", "r", expected_revision=p.call.revision + 9)
    assert caught.value.code is grpc.StatusCode.ABORTED
    assert caught.value.current_revision == p.call.revision


def test_invalid_request_lists_field_violations(client: Client) -> None:
    """Bad input raises InvalidRequest naming every bad field."""
    with pytest.raises(InvalidRequest) as caught:
        client.prepare_tool("run:bad", "", "send", {})
    fields = {v.field for v in caught.value.violations}
    assert {"ref.run_id", "ref.call_id"} <= fields, fields
    assert caught.value.current_revision is None


def test_not_found_and_reconciliation_required(client: Client) -> None:
    """A missing record is NotFound; a side effect's retry ReconciliationRequired."""
    with pytest.raises(NotFound):
        client.get_tool_call("run-e", "missing")
    p = client.prepare_tool(
        "run-e", "m", "send", {}, effect=Effect.SIDE_EFFECT, start=True
    )
    client.report_unknown("run-e", "m", p.call.attempt, "timeout")
    with pytest.raises(ReconciliationRequired):
        client.start_tool("run-e", "m", retry=True)


def test_every_reason_class_is_still_an_effectd_error(client: Client) -> None:
    """Code that catches EffectdError keeps catching every refusal."""
    with pytest.raises(EffectdError) as caught:
        client.get_tool_call("run-e", "missing")
    assert caught.value.reason == "NOT_FOUND"


def test_retry_info_becomes_retry_delay() -> None:
    """google.rpc.RetryInfo in the status details is `retry_delay` in seconds."""
    status = to_status(domain.RetryBudgetExhausted("no credit", retry_delay=1.5))
    error = EffectdError.from_rpc_error(StatusError(status))
    assert isinstance(error, RetryBudgetExhausted)
    assert error.retry_delay == 1.5
    assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
