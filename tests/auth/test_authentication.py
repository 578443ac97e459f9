"""Authentication and roles at the gate: a call without a known token never
reaches a handler; a token's roles decide what it may call (contract §10.2)."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from hashlib import sha256
from pathlib import Path

import grpc
import pytest
from effectd.v1 import admin_pb2, ledger_pb2_grpc, provider_pb2
from effectd.v1 import ledger_pb2 as pb
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from sidecar.auth import access, tokens
from sidecar.composition import Services, load_credentials
from sidecar.config import ConfigError, ServeConfig
from sidecar.ledger.rules import Answer, PrepareSpec
from sidecar.server import Daemon
from sidecar.services.ledger import LedgerService
from sidecar.storage.api import Store
from sidecar.testing import running_daemon
from tests.auth.support import (
    AGENT_A,
    AGENT_AB,
    APPROVER_A,
    OPERATOR_A,
    TOKENS,
    auth_config,
    authenticated_daemon,
    stubs,
)
from tests.rpc.support import decode, refused
from tests.support.tokens import GATE, write_tokens


class CountingLedger(LedgerService):
    """Counts the prepares that reached the service."""

    prepares = 0

    async def prepare(self, spec: PrepareSpec) -> Answer:
        type(self).prepares += 1
        return await super().prepare(spec)


class CountingDaemon(Daemon):
    def compose(self, store: Store) -> Services:
        services = super().compose(store)
        ledger = CountingLedger(
            store, self.seams.clock, self.config.limits, services.policy
        )
        return replace(services, ledger=ledger)


def prepare(call_id: str = "c", namespace: str = "") -> pb.PrepareToolRequest:
    return pb.PrepareToolRequest(
        ref=pb.CallRef(namespace=namespace, run_id="r", call_id=call_id),
        tool_name="t",
        input=pb.Payload(json="{}"),
    )


BAD_METADATA = {
    "no token": (),
    "empty token": (("authorization", "Bearer "),),
    "wrong token": (("authorization", "Bearer not-a-known-token-at-all"),),
    "truncated token": (("authorization", f"Bearer {AGENT_A[:-1]}"),),
    "token with a suffix": (("authorization", f"Bearer {AGENT_A}x"),),
    "another scheme": (("authorization", f"Basic {AGENT_A}"),),
    "two tokens": (
        ("authorization", f"Bearer {AGENT_A}"),
        ("authorization", f"Bearer {AGENT_A}"),
    ),
}


@pytest.mark.parametrize("case", BAD_METADATA)
def test_a_call_without_a_known_token_never_reaches_a_handler(
    short_tmp: Path, case: str
) -> None:
    CountingLedger.prepares = 0
    config = auth_config(short_tmp / "data")
    with (
        running_daemon(config, daemon=CountingDaemon(config)) as daemon,
        grpc.insecure_channel(daemon.target) as channel,
    ):
        ledger = ledger_pb2_grpc.ToolLedgerStub(channel)
        refusal = refused(
            lambda: ledger.PrepareTool(prepare(), metadata=BAD_METADATA[case])
        )
        assert refusal.code is grpc.StatusCode.UNAUTHENTICATED
        assert refusal.reason == "UNAUTHENTICATED"
        # A body that does not even parse is refused for the token first: the
        # request was never decoded.
        garbage = channel.unary_unary(
            "/effectd.v1.ToolLedger/PrepareTool",
            request_serializer=None,
            response_deserializer=None,
        )
        with pytest.raises(grpc.RpcError) as info:
            garbage(b"\xff\xff\xff", metadata=BAD_METADATA[case])
        assert decode(info.value).code is grpc.StatusCode.UNAUTHENTICATED
        assert CountingLedger.prepares == 0
        # Control: the same call with the token reaches the handler.
        ledger.PrepareTool(prepare(), metadata=stubs(channel, AGENT_A).metadata)
        assert CountingLedger.prepares == 1


def test_the_token_never_appears_in_a_refusal(short_tmp: Path) -> None:
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        s = stubs(channel, AGENT_A[:-1])
        refusal = refused(lambda: s.ledger.PrepareTool(prepare(), metadata=s.metadata))
        assert AGENT_A[:-1] not in refusal.message
        assert all(AGENT_A[:-1] not in v for v in refusal.metadata.values())


def _awaiting(channel: grpc.Channel) -> pb.ToolCall:
    a = stubs(channel, AGENT_A)
    request = prepare("needs-approval")
    request.require_approval = True
    return a.ledger.PrepareTool(request, metadata=a.metadata).call


def test_an_agent_token_cannot_approve_or_reconcile(short_tmp: Path) -> None:
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        call = _awaiting(channel)
        a = stubs(channel, AGENT_A)
        approve = pb.DecideApprovalRequest(
            ref=call.ref,
            approve=True,
            reason="mine",
            expected_revision=call.revision,
            input_fingerprint=call.input_fingerprint,
        )
        denied = refused(lambda: a.ledger.DecideApproval(approve, metadata=a.metadata))
        assert denied.code is grpc.StatusCode.PERMISSION_DENIED
        assert denied.reason == "PERMISSION_DENIED"
        reconcile = pb.ReconcileRequest(
            ref=call.ref,
            expected_revision=call.revision,
            not_executed=True,
            reason="r",
            evidence="e",
        )
        denied = refused(lambda: a.ledger.Reconcile(reconcile, metadata=a.metadata))
        assert denied.code is grpc.StatusCode.PERMISSION_DENIED
        after = a.ledger.GetToolCall(
            pb.GetToolCallRequest(ref=call.ref), metadata=a.metadata
        ).call
        assert after.revision == call.revision
        assert after.state == pb.CALL_STATE_AWAITING_APPROVAL
        # Control: the approver of the namespace may, and is recorded as the
        # actor by its token's name.
        approver = stubs(channel, APPROVER_A)
        done = approver.ledger.DecideApproval(approve, metadata=approver.metadata)
        assert done.call.state == pb.CALL_STATE_PREPARED
        assert done.call.approval.approver == "approver-a"


def test_an_approver_cannot_record_someone_else_as_the_actor(short_tmp: Path) -> None:
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        call = _awaiting(channel)
        approver = stubs(channel, APPROVER_A)
        request = pb.DecideApprovalRequest(
            ref=call.ref,
            approve=True,
            approver="the-boss",
            reason="r",
            expected_revision=call.revision,
            input_fingerprint=call.input_fingerprint,
        )
        refusal = refused(
            lambda: approver.ledger.DecideApproval(request, metadata=approver.metadata)
        )
        assert refusal.code is grpc.StatusCode.INVALID_ARGUMENT
        assert refusal.fields == ("approver",)


@pytest.mark.parametrize("token", [AGENT_A, APPROVER_A, OPERATOR_A])
def test_global_admin_rpcs_need_every_namespace(short_tmp: Path, token: str) -> None:
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        s = stubs(channel, token)
        refusal = refused(
            lambda: s.admin.VerifyAudit(
                admin_pb2.VerifyAuditRequest(), metadata=s.metadata
            )
        )
        assert refusal.code is grpc.StatusCode.PERMISSION_DENIED


def test_health_is_open_and_reflection_needs_a_token(short_tmp: Path) -> None:
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        health = health_pb2_grpc.HealthStub(channel)
        answer = health.Check(health_pb2.HealthCheckRequest())
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
        ask = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.RpcError) as info:
            list(reflect.ServerReflectionInfo(iter([ask])))
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
        replies = list(
            reflect.ServerReflectionInfo(
                iter([ask]), metadata=stubs(channel, AGENT_A).metadata
            )
        )
        names = {s.name for s in replies[0].list_services_response.service}
        assert "effectd.v1.ToolLedger" in names


def test_a_method_without_a_rule_is_denied_to_everyone(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Default deny: take GetToolCall's rule away and every token is refused."""
    rules = dict(access.RULES)
    del rules["/effectd.v1.ToolLedger/GetToolCall"]
    monkeypatch.setattr(access, "RULES", rules)
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        s = stubs(channel, OPERATOR_A)
        refusal = refused(
            lambda: s.ledger.GetToolCall(
                pb.GetToolCallRequest(ref=prepare().ref), metadata=s.metadata
            )
        )
        assert refusal.code is grpc.StatusCode.PERMISSION_DENIED


def test_the_namespace_comes_from_the_token(short_tmp: Path) -> None:
    """An empty namespace is the token's own; a token of several namespaces
    must name one; a named one it may touch is used."""
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        a = stubs(channel, AGENT_A)
        made = a.ledger.PrepareTool(prepare(), metadata=a.metadata)
        assert made.call.ref.namespace == "a"
        ab = stubs(channel, AGENT_AB)
        refusal = refused(
            lambda: ab.ledger.PrepareTool(prepare(), metadata=ab.metadata)
        )
        assert refusal.code is grpc.StatusCode.INVALID_ARGUMENT
        assert refusal.fields == ("ref.namespace",)
        seen = ab.ledger.GetToolCall(
            pb.GetToolCallRequest(ref=made.call.ref), metadata=ab.metadata
        )
        assert seen.call.input_fingerprint == made.call.input_fingerprint


def test_without_tokens_the_daemon_says_authentication_is_off(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sidecar.server")
    with running_daemon(ServeConfig(data_dir=short_tmp / "data")):
        pass
    assert any("authentication is off" in r.getMessage() for r in caplog.records)


def test_a_non_loopback_listener_needs_tls_and_tokens(short_tmp: Path) -> None:
    with pytest.raises(ConfigError, match="listen"):
        ServeConfig(data_dir=short_tmp, listen="0.0.0.0:0").validate()
    cert = short_tmp / "c.pem"
    with pytest.raises(ConfigError, match="needs tokens"):
        ServeConfig(
            data_dir=short_tmp, listen="0.0.0.0:0", tls_cert=cert, tls_key=cert
        ).validate()
    ServeConfig(
        data_dir=short_tmp,
        listen="0.0.0.0:0",
        tls_cert=cert,
        tls_key=cert,
        tokens_text=TOKENS,
    ).validate()


# -- the tokens file ---------------------------------------------------------


def test_a_tokens_file_others_may_read_is_refused(short_tmp: Path) -> None:
    path = write_tokens(short_tmp / "tokens.toml", *GATE, mode=0o640)
    with pytest.raises(ConfigError, match="chmod 600"):
        tokens.load_file(path)
    os.chmod(path, 0o600)
    assert len(tokens.load_file(path)) == 6


def test_a_digest_stands_for_the_token() -> None:
    secret = "a-long-enough-secret-value"
    text = f"""
[[token]]
name = "hashed"
sha256 = "{sha256(secret.encode()).hexdigest()}"
roles = ["agent"]
namespaces = ["x"]
"""
    principal = tokens.parse(text).authenticate(secret)
    assert principal.name == "hashed"
    assert principal.namespaces == frozenset({"x"})


GOOD = {
    "name": '"t"',
    "secret": '"long-enough-secret-1"',
    "roles": '["agent"]',
    "namespaces": '["a"]',
}


def _table(**changes: str | None) -> str:
    fields = {**GOOD, **changes}
    return "\n".join(f"{k} = {v}" for k, v in fields.items() if v is not None)


@pytest.mark.parametrize(
    ("table", "names"),
    [
        (_table(secret='"short"'), "secret"),
        (_table(roles='["root"]'), "roles"),
        (_table(namespaces='["a b"]'), "namespaces"),
        (_table(namespaces=None), "namespaces"),
        (_table(secret=None, sha256='"abc"'), "sha256"),
        (_table(name=None), "name"),
        (_table(extra="1"), "extra"),
    ],
)
def test_an_invalid_token_table_names_the_setting(table: str, names: str) -> None:
    with pytest.raises(ConfigError, match=names) as info:
        tokens.parse(f"[[token]]\n{table}\n")
    # The message never quotes a secret.
    assert "long-enough-secret-1" not in str(info.value)


def test_tokens_compare_whole() -> None:
    """Prefixes, extensions and case changes of a token are not the token."""
    known = tokens.parse(TOKENS)
    assert known.authenticate(AGENT_A).name == "agent-a"
    for near in (AGENT_A[:-1], AGENT_A + "0", AGENT_A.upper(), f" {AGENT_A}"):
        with pytest.raises(Exception, match="not known"):
            known.authenticate(near)


def test_a_stream_passes_the_same_gate(short_tmp: Path) -> None:
    """ProviderStream (server streaming): no token is UNAUTHENTICATED before
    anything streams; an approver may not call it; the agent reaches the
    handler (which refuses the unknown route)."""
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        request = provider_pb2.ProviderRequest(
            route="nowhere", method="POST", path="/v1/x"
        )
        expected = {
            None: grpc.StatusCode.UNAUTHENTICATED,
            APPROVER_A: grpc.StatusCode.PERMISSION_DENIED,
            AGENT_A: grpc.StatusCode.FAILED_PRECONDITION,
        }
        for token, code in expected.items():
            s = stubs(channel, token)
            with pytest.raises(grpc.RpcError) as info:
                list(s.provider.ProviderStream(request, metadata=s.metadata))
            assert info.value.code() is code, token


def test_a_tokens_text_that_is_not_toml_is_refused_without_quoting_it() -> None:
    with pytest.raises(ConfigError, match=r"not valid TOML \(at line 2") as info:
        tokens.parse('[[token]]\nsecret = "a-secret-in-broken-toml" junk\n')
    assert "a-secret-in-broken-toml" not in str(info.value)


def test_the_history_names_the_token_that_acted(short_tmp: Path) -> None:
    """With authentication on, each transition's actor is the token's name;
    without it, "agent" (control)."""
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        a = stubs(channel, AGENT_A)
        request = prepare("traced")
        request.start = True
        started = a.ledger.PrepareTool(request, metadata=a.metadata).call
        a.ledger.Heartbeat(
            pb.HeartbeatRequest(ref=started.ref, attempt=started.attempt),
            metadata=a.metadata,
        )
        done = a.ledger.CommitTool(
            pb.CommitToolRequest(
                ref=started.ref,
                attempt=started.attempt,
                result=pb.ToolResult(outcome=pb.OUTCOME_OK),
            ),
            metadata=a.metadata,
        ).call
        events = [t.event for t in done.history]
        assert {"prepare", "start", "commit"} <= set(events)
        assert {t.actor for t in done.history} == {"agent-a"}
    with running_daemon(ServeConfig(data_dir=short_tmp / "open")) as daemon:
        ledger = ledger_pb2_grpc.ToolLedgerStub(grpc.insecure_channel(daemon.target))
        call = ledger.PrepareTool(prepare("open")).call
        assert [t.actor for t in call.history] == ["agent"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")
def test_a_tokens_file_of_another_user_is_refused(short_tmp: Path) -> None:
    path = write_tokens(short_tmp / "tokens.toml", *GATE)
    os.chown(path, 65534, -1)
    with pytest.raises(ConfigError, match="not owned by the daemon's user"):
        tokens.load_file(path)


def test_tokens_come_from_one_place(short_tmp: Path) -> None:
    path = write_tokens(short_tmp / "tokens.toml", *GATE)
    config = ServeConfig(data_dir=short_tmp, tokens_file=path, tokens_text=TOKENS)
    with pytest.raises(ConfigError, match="set one, not both"):
        load_credentials(config)
    assert load_credentials(ServeConfig(data_dir=short_tmp, tokens_file=path))
