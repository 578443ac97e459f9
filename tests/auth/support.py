"""A daemon with tokens, and raw stubs that call it with one token."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from effectd.v1 import (
    admin_pb2_grpc,
    checkpoints_pb2_grpc,
    ledger_pb2_grpc,
    provider_pb2_grpc,
    recovery_pb2_grpc,
    retry_pb2_grpc,
)

from sidecar.config import ServeConfig
from sidecar.testing import RunningDaemon, running_daemon

# Secrets of at least 16 characters; each names its holder.
AGENT_A = "agent-a-secret-0123456789"
AGENT_B = "agent-b-secret-0123456789"
APPROVER_A = "approver-a-secret-0123456789"
OPERATOR_A = "operator-a-secret-0123456789"
OPERATOR_ALL = "operator-all-secret-0123456789"
AGENT_AB = "agent-ab-secret-0123456789"

TOKENS = f"""
[[token]]
name = "agent-a"
secret = "{AGENT_A}"
roles = ["agent"]
namespaces = ["a"]

[[token]]
name = "agent-b"
secret = "{AGENT_B}"
roles = ["agent"]
namespaces = ["b"]

[[token]]
name = "approver-a"
secret = "{APPROVER_A}"
roles = ["approver"]
namespaces = ["a"]

[[token]]
name = "operator-a"
secret = "{OPERATOR_A}"
roles = ["operator"]
namespaces = ["a"]

[[token]]
name = "operator-all"
secret = "{OPERATOR_ALL}"
roles = ["operator", "approver"]
namespaces = ["*"]

[[token]]
name = "agent-ab"
secret = "{AGENT_AB}"
roles = ["agent"]
namespaces = ["a", "b"]
"""


@dataclass(frozen=True, slots=True)
class Stubs:
    """Every service's stub over one channel, and the token's metadata."""

    ledger: ledger_pb2_grpc.ToolLedgerStub
    checkpoints: checkpoints_pb2_grpc.CheckpointsStub
    recovery: recovery_pb2_grpc.RecoveryStub
    retry: retry_pb2_grpc.RetryPolicyStub
    admin: admin_pb2_grpc.AdminStub
    provider: provider_pb2_grpc.ProviderStub
    metadata: tuple[tuple[str, str], ...]


def stubs(channel: grpc.Channel, token: str | None) -> Stubs:
    metadata = (("authorization", f"Bearer {token}"),) if token is not None else ()
    return Stubs(
        ledger_pb2_grpc.ToolLedgerStub(channel),
        checkpoints_pb2_grpc.CheckpointsStub(channel),
        recovery_pb2_grpc.RecoveryStub(channel),
        retry_pb2_grpc.RetryPolicyStub(channel),
        admin_pb2_grpc.AdminStub(channel),
        provider_pb2_grpc.ProviderStub(channel),
        metadata,
    )


def auth_config(data_dir: Path, **overrides: object) -> ServeConfig:
    return ServeConfig(data_dir=data_dir, tokens_text=TOKENS, **overrides)  # type: ignore[arg-type]


@contextmanager
def authenticated_daemon(
    data_dir: Path, **overrides: object
) -> Iterator[tuple[RunningDaemon, grpc.Channel]]:
    with (
        running_daemon(auth_config(data_dir, **overrides)) as daemon,
        grpc.insecure_channel(daemon.target) as channel,
    ):
        yield daemon, channel
