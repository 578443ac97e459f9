"""The one table from domain errors to gRPC statuses (contract §11, STYLE
"Errors"): every reason-owning class is mapped, every reason is a value of
`effectd.v1.ErrorReason`, and the status carries ErrorInfo (+ BadRequest)."""

from __future__ import annotations

import inspect
from typing import Any

import grpc
import pytest
from effectd.v1 import errors_pb2
from google.rpc import error_details_pb2, status_pb2

from sidecar import errors
from sidecar.errors import EffectdError, FieldViolation
from sidecar.rpc.errors import DOMAIN, code_of, to_status

# The code each reason is documented with in errors.proto.
DOCUMENTED_CODES = {
    "INVALID_REQUEST": grpc.StatusCode.INVALID_ARGUMENT,
    "INPUT_MISMATCH": grpc.StatusCode.FAILED_PRECONDITION,
    "INVALID_TRANSITION": grpc.StatusCode.FAILED_PRECONDITION,
    "REVISION_CONFLICT": grpc.StatusCode.ABORTED,
    "RECONCILIATION_REQUIRED": grpc.StatusCode.FAILED_PRECONDITION,
    "SIDE_EFFECT_NOT_RETRY_SAFE": grpc.StatusCode.FAILED_PRECONDITION,
    "STALE_ATTEMPT": grpc.StatusCode.FAILED_PRECONDITION,
    "RESULT_MISMATCH": grpc.StatusCode.FAILED_PRECONDITION,
    "ATTEMPTS_EXHAUSTED": grpc.StatusCode.FAILED_PRECONDITION,
    "NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "STORAGE_FULL": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "STORAGE_UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "PERMISSION_DENIED": grpc.StatusCode.PERMISSION_DENIED,
    "ROUTE_NOT_ALLOWED": grpc.StatusCode.FAILED_PRECONDITION,
    "SHUTTING_DOWN": grpc.StatusCode.UNAVAILABLE,
    "NOT_IMPLEMENTED": grpc.StatusCode.UNIMPLEMENTED,
    "MISSING_IDEMPOTENCY_KEY": grpc.StatusCode.FAILED_PRECONDITION,
    "DEADLINE_EXCEEDED": grpc.StatusCode.FAILED_PRECONDITION,
    "ALREADY_COMMITTED": grpc.StatusCode.FAILED_PRECONDITION,
    "MCP_NO_REPLAY": grpc.StatusCode.FAILED_PRECONDITION,
    "RUN_NOT_READ_ONLY": grpc.StatusCode.FAILED_PRECONDITION,
    "RETRY_DISABLED": grpc.StatusCode.FAILED_PRECONDITION,
    "RESULT_COMPACTED": grpc.StatusCode.FAILED_PRECONDITION,
    "POLICY_INVALID": grpc.StatusCode.FAILED_PRECONDITION,
    "NO_POLICY_FILE": grpc.StatusCode.FAILED_PRECONDITION,
    "UPSTREAM_UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "UPSTREAM_DEADLINE_EXCEEDED": grpc.StatusCode.DEADLINE_EXCEEDED,
    "RETRY_BUDGET_EXHAUSTED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "UNAUTHENTICATED": grpc.StatusCode.UNAUTHENTICATED,
    "QUOTA_EXCEEDED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "RATE_LIMITED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "UNSUPPORTED_KEY_SCHEME": grpc.StatusCode.FAILED_PRECONDITION,
    "RECONCILE_QUARANTINE": grpc.StatusCode.FAILED_PRECONDITION,
    "CONCURRENCY_LIMITED": grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def _subclasses(cls: type[EffectdError]) -> list[type[EffectdError]]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


# Only the product's classes: a test may define its own subclasses.
PRODUCT_CLASSES = [
    c for c in _subclasses(EffectdError) if c.__module__.startswith("sidecar.")
]
WITH_REASON = [c for c in PRODUCT_CLASSES if "reason" in vars(c)]
REASON_NAMES = frozenset(errors_pb2.ErrorReason.keys())


def instance(cls: type[EffectdError]) -> EffectdError:
    """An instance of any class of the tree, whatever its constructor takes."""
    if issubclass(cls, errors.InvalidArgument):
        return cls([FieldViolation("ref.run_id", "is required")])
    if issubclass(cls, errors.RevisionConflict):
        return cls("conflict", 7, {"key": "k"})
    return cls(f"a {cls.__name__}", {"detail": "x"})


def unpack(status: grpc.Status) -> status_pb2.Status:
    """The google.rpc.Status that `to_status` put in the trailing metadata."""
    [value] = [v for k, v in status.trailing_metadata if k == "grpc-status-details-bin"]
    rich: Any = status_pb2.Status.FromString(value)
    assert isinstance(rich, status_pb2.Status)
    return rich


def details(rich: status_pb2.Status) -> tuple[Any, Any]:
    """The ErrorInfo and the BadRequest (None when absent) of a status."""
    info: Any = None
    bad: Any = None
    for detail in rich.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
    return info, bad


def test_the_walk_finds_the_whole_tree() -> None:
    """The recursive walk sees the nested classes, so the tests below are not
    vacuous (14 classes own a reason in sidecar.errors today)."""
    assert errors.StaleAttempt in WITH_REASON
    assert errors.PreconditionFailed in PRODUCT_CLASSES
    assert errors.PreconditionFailed not in WITH_REASON
    assert len(WITH_REASON) >= 14


@pytest.mark.parametrize("cls", WITH_REASON, ids=lambda c: c.__name__)
def test_every_reason_is_an_error_reason_value(cls: type[EffectdError]) -> None:
    """Each class's reason is the name of a value of effectd.v1.ErrorReason,
    so clients of every language can match on it."""
    assert cls.reason in REASON_NAMES
    assert cls.reason != "ERROR_REASON_UNSPECIFIED"


@pytest.mark.parametrize("cls", WITH_REASON, ids=lambda c: c.__name__)
def test_every_class_is_mapped_to_its_documented_code(
    cls: type[EffectdError],
) -> None:
    """code_of maps each class to the gRPC code errors.proto documents for
    its reason."""
    assert code_of(instance(cls)) is DOCUMENTED_CODES[cls.reason]


def test_reasons_are_owned_once() -> None:
    """No two classes claim the same reason (a reason names one refusal)."""
    reasons = [c.reason for c in WITH_REASON]
    assert len(reasons) == len(set(reasons))


def test_documented_codes_cover_the_enum() -> None:
    """The table above names every ErrorReason, so new reasons get a row."""
    assert set(DOCUMENTED_CODES) == REASON_NAMES - {"ERROR_REASON_UNSPECIFIED"}


def test_an_unmapped_class_is_refused() -> None:
    """Negative control: a class outside every mapped branch has no code, so
    the completeness test above would catch a new unmapped class."""

    class Orphan(EffectdError):
        reason = "INVALID_REQUEST"

    with pytest.raises(LookupError, match="Orphan"):
        code_of(Orphan("nobody maps me"))


@pytest.mark.parametrize("cls", WITH_REASON, ids=lambda c: c.__name__)
def test_to_status_carries_error_info(cls: type[EffectdError]) -> None:
    """to_status gives the mapped code, the message, and an ErrorInfo with
    domain effectd, the class's reason and its metadata."""
    error = instance(cls)
    status = to_status(error)
    assert status.code is code_of(error)
    assert status.details == error.message
    rich = unpack(status)
    assert rich.code == status.code.value[0]
    assert rich.message == error.message
    info, bad = details(rich)
    assert info is not None
    assert (info.domain, info.reason) == (DOMAIN, cls.reason) == ("effectd", cls.reason)
    assert dict(info.metadata) == error.metadata
    assert (bad is not None) is issubclass(cls, errors.InvalidArgument)


def test_revision_conflict_carries_current_revision() -> None:
    """REVISION_CONFLICT metadata names the current revision as a string."""
    rich = unpack(to_status(errors.RevisionConflict("x", 42, {"key": "k"})))
    info, _ = details(rich)
    assert dict(info.metadata) == {"key": "k", "currentRevision": "42"}


def test_invalid_argument_lists_every_violation() -> None:
    """InvalidArgument adds a BadRequest with every field violation, in order."""
    violations = [
        FieldViolation(f"calls[{i}].ref.run_id", f"problem {i}") for i in range(7)
    ]
    rich = unpack(to_status(errors.InvalidArgument(violations)))
    info, bad = details(rich)
    assert (info.domain, info.reason) == ("effectd", "INVALID_REQUEST")
    assert [(v.field, v.description) for v in bad.field_violations] == [
        (v.field, v.description) for v in violations
    ]
    assert rich.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]


RETRY_LATER = [c for c in WITH_REASON if issubclass(c, errors.RetryLater)]


def test_the_refusals_with_a_delay_share_one_base() -> None:
    """Every class whose constructor takes `retry_delay` is a RetryLater,
    which alone defines that constructor: the provider failures and the
    throttles are its two families."""
    takes_a_delay = {
        c
        for c in PRODUCT_CLASSES
        if "retry_delay" in inspect.signature(c.__init__).parameters
    }
    assert takes_a_delay == {errors.RetryLater, *_subclasses(errors.RetryLater)}
    assert [c for c in takes_a_delay if "__init__" in vars(c)] == [errors.RetryLater]
    assert {c.reason for c in RETRY_LATER} == {
        "UPSTREAM_UNAVAILABLE",
        "UPSTREAM_DEADLINE_EXCEEDED",
        "RETRY_BUDGET_EXHAUSTED",
        "QUOTA_EXCEEDED",
        "RATE_LIMITED",
        "CONCURRENCY_LIMITED",
    }


@pytest.mark.parametrize("cls", RETRY_LATER, ids=lambda c: c.__name__)
def test_a_retry_delay_is_sent_as_retry_info(cls: type[errors.RetryLater]) -> None:
    """The delay of a RetryLater travels as google.rpc.RetryInfo; without one
    the status carries none."""

    def retry_info(error: EffectdError) -> list[Any]:
        found = []
        for detail in unpack(to_status(error)).details:
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                info = error_details_pb2.RetryInfo()
                detail.Unpack(info)
                found.append(info)
        return found

    [info] = retry_info(cls("later", {}, retry_delay=1.5))
    assert info.retry_delay.ToNanoseconds() == 1_500_000_000
    assert retry_info(cls("later")) == []
