"""A method of a served service that the daemon does not provide is answered
UNIMPLEMENTED with its ErrorInfo, never INTERNAL: gRPC health's `List`,
which the health proto defines and the servicer of grpcio-health-checking
does not implement (found by the fuzz test, tests/torture/test_fuzz.py)."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.testing import RunningDaemon
from tests.rpc.support import assert_serving, expect_refusal


def test_health_list_is_unimplemented_not_internal(daemon: RunningDaemon) -> None:
    """Health.List: UNIMPLEMENTED, NOT_IMPLEMENTED (fails before the fix:
    INTERNAL, the servicer's NotImplementedError taken for a failure)."""
    with grpc.insecure_channel(daemon.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        got = expect_refusal(
            lambda: stub.List(health_pb2.HealthListRequest(), timeout=10),
            grpc.StatusCode.UNIMPLEMENTED,
            "NOT_IMPLEMENTED",
        )
        assert "List" in got.message
        assert_serving(channel)
