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
from tests.support.tokens import GATE, tokens_text

# The secrets of the gate's role table (tests.support.tokens.GATE).
AGENT_A, AGENT_B, APPROVER_A, OPERATOR_A, OPERATOR_ALL, AGENT_AB = (
    token.secret for token in GATE
)
TOKENS = tokens_text(*GATE)


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
    return ServeConfig(data_dir=data_dir, init=True, tokens_text=TOKENS, **overrides)  # type: ignore[arg-type]


@contextmanager
def authenticated_daemon(
    data_dir: Path, **overrides: object
) -> Iterator[tuple[RunningDaemon, grpc.Channel]]:
    with (
        running_daemon(auth_config(data_dir, **overrides)) as daemon,
        grpc.insecure_channel(daemon.target) as channel,
    ):
        yield daemon, channel
