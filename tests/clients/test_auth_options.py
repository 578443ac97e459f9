"""The shipped Python client speaks to an authenticated, TLS, size-limited
daemon: the bearer token rides on every call of every entry point, TLS and
mutual TLS verify both ends, one message limit holds in both directions,
and the token never shows in a `repr()` or an exception message."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from effectd.v1 import checkpoints_pb2 as cpb
from effectd.v1 import provider_pb2 as ppb

from effectd_client import (
    AsyncClient,
    AsyncEffectdTransport,
    Client,
    Effect,
    EffectdError,
    EffectdTransport,
    PermissionDenied,
    Run,
    Unauthenticated,
)
from effectd_client._channel import DEFAULT_MAX_MESSAGE_BYTES
from sidecar.config import ServeConfig, ServerLimits
from sidecar.testing import running_daemon
from tests.support.certs import Pki, make_pki
from tests.support.tokens import ONCALL, TEAM, TEAM_AGENT, tokens_text

pytestmark = pytest.mark.timeout(60)

AGENT, OPERATOR = TEAM_AGENT.secret, ONCALL.secret
TOKENS = tokens_text(*TEAM)
KIB = 1 << 10


# -- a server that records what reaches it ---------------------------------


@dataclass
class Recorder:
    """The metadata of every call that reached the recording server."""

    target: str
    seen: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, context: grpc.ServicerContext) -> None:
        with self.lock:
            metadata = context.invocation_metadata()
            self.seen.append({k: v for k, v in metadata if isinstance(v, str)})


@contextmanager
def recording_server(
    credentials: grpc.ServerCredentials | None = None,
    refuse: grpc.StatusCode | None = None,
) -> Iterator[Recorder]:
    """A gRPC server on 127.0.0.1 answering Checkpoints.Put and
    Provider.ProviderCall, recording each call's metadata; with `refuse`,
    Put fails with that bare status (no ErrorInfo), as a proxy would."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    address = "127.0.0.1:0"
    port = (
        server.add_insecure_port(address)
        if credentials is None
        else server.add_secure_port(address, credentials)
    )
    recorder = Recorder(f"127.0.0.1:{port}")

    def put(
        _: cpb.PutCheckpointRequest, context: grpc.ServicerContext
    ) -> cpb.PutCheckpointResponse:
        recorder.record(context)
        if refuse is not None:
            context.abort(refuse, "refused at the edge")
        return cpb.PutCheckpointResponse(revision=1)

    def provider_call(
        _: ppb.ProviderRequest, context: grpc.ServicerContext
    ) -> ppb.ProviderResponse:
        recorder.record(context)
        return ppb.ProviderResponse(status=200, body=b"{}")

    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "effectd.v1.Checkpoints",
                {
                    "Put": grpc.unary_unary_rpc_method_handler(
                        put,
                        request_deserializer=cpb.PutCheckpointRequest.FromString,
                        response_serializer=cpb.PutCheckpointResponse.SerializeToString,
                    )
                },
            ),
            grpc.method_handlers_generic_handler(
                "effectd.v1.Provider",
                {
                    "ProviderCall": grpc.unary_unary_rpc_method_handler(
                        provider_call,
                        request_deserializer=ppb.ProviderRequest.FromString,
                        response_serializer=ppb.ProviderResponse.SerializeToString,
                    )
                },
            ),
        )
    )
    server.start()
    try:
        yield recorder
    finally:
        server.stop(None)


def _client_put(target: str, **options: Any) -> None:
    with Client(target, timeout=5, **options) as client:
        client.put_checkpoint("k", b"v")


def _async_client_put(target: str, **options: Any) -> None:
    async def main() -> None:
        async with AsyncClient(target, timeout=5, **options) as client:
            await client.put_checkpoint("k", b"v")

    asyncio.run(main())


def _transport_call(target: str, **options: Any) -> None:
    transport = EffectdTransport(target, route="r", timeout=5, **options)
    with httpx.Client(transport=transport) as http:
        assert http.get("http://effectd/x").status_code == 200


def _async_transport_call(target: str, **options: Any) -> None:
    async def main() -> None:
        transport = AsyncEffectdTransport(target, route="r", timeout=5, **options)
        async with httpx.AsyncClient(transport=transport) as http:
            assert (await http.get("http://effectd/x")).status_code == 200

    asyncio.run(main())


ENTRY_POINTS: dict[str, Callable[..., None]] = {
    "Client": _client_put,
    "AsyncClient": _async_client_put,
    "EffectdTransport": _transport_call,
    "AsyncEffectdTransport": _async_transport_call,
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_the_token_rides_on_every_call_as_bearer_metadata(
    entry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each entry point sends `authorization: Bearer <token>` with a token,
    and no authorization header without one (the control)."""
    monkeypatch.delenv("EFFECTD_TOKEN", raising=False)
    with recording_server() as server:
        ENTRY_POINTS[entry](server.target, token=AGENT)
        ENTRY_POINTS[entry](server.target)
    with_token, without = server.seen
    assert with_token["authorization"] == f"Bearer {AGENT}"
    assert "authorization" not in without


def test_the_token_defaults_to_effectd_token_and_empty_sends_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`token=None` reads EFFECTD_TOKEN; `token=""` sends none even then."""
    monkeypatch.setenv("EFFECTD_TOKEN", OPERATOR)
    with recording_server() as server:
        _client_put(server.target)
        _client_put(server.target, token="")
        _client_put(server.target, token=AGENT)
    from_env, none, explicit = server.seen
    assert from_env["authorization"] == f"Bearer {OPERATOR}"
    assert "authorization" not in none
    assert explicit["authorization"] == f"Bearer {AGENT}"


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (grpc.StatusCode.UNAUTHENTICATED, Unauthenticated),
        (grpc.StatusCode.PERMISSION_DENIED, PermissionDenied),
        (grpc.StatusCode.UNAVAILABLE, EffectdError),  # the control: no guess
    ],
)
def test_a_bare_credential_refusal_still_has_its_class(
    code: grpc.StatusCode, expected: type[EffectdError]
) -> None:
    """UNAUTHENTICATED or PERMISSION_DENIED without an ErrorInfo (from a
    proxy, say) is still `Unauthenticated` / `PermissionDenied`; other bare
    codes keep no reason."""
    with recording_server(refuse=code) as server, pytest.raises(EffectdError) as raised:
        _client_put(server.target, token=AGENT)
    assert type(raised.value) is expected
    assert raised.value.reason == ("" if expected is EffectdError else code.name)


@pytest.mark.parametrize("make", [Client, AsyncClient])
def test_repr_says_a_token_is_set_but_never_shows_it(
    make: Callable[..., Client | AsyncClient],
) -> None:
    """A client logged or shown in a traceback does not leak its token."""

    async def main() -> str:
        client = make("unix:/nonexistent.sock", namespace="team-a", token=AGENT)
        text = repr(client)
        result = client.close()
        if asyncio.iscoroutine(result):
            await result
        return text

    text = asyncio.run(main())
    assert AGENT not in text
    assert "token=<hidden>" in text
    assert "team-a" in text


@pytest.mark.parametrize(
    "bad",
    [f" {AGENT}", f"{AGENT}\n", f"{AGENT}\x00", "é" + AGENT],
    ids=["space", "newline", "nul", "non-ascii"],
)
def test_an_unsendable_token_is_refused_without_quoting_it(bad: str) -> None:
    """A token gRPC could not send as metadata fails at construction, and the
    message does not repeat it."""
    with pytest.raises(ValueError, match="token") as raised:
        Client("unix:/nonexistent.sock", token=bad)
    assert AGENT not in str(raised.value)


def test_a_client_certificate_needs_its_key(pki: Pki) -> None:
    """Half of a client identity is a mistake, not plaintext."""
    with pytest.raises(ValueError, match="private_key"):
        Client("127.0.0.1:1", certificate_chain=pki.client.cert_pem)


# -- TLS, from the client side ----------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _server_tls(pki: Pki, *, require_client_auth: bool) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials(
        [(pki.server.key_pem, pki.server.cert_pem)],
        root_certificates=pki.ca_pem if require_client_auth else None,
        require_client_auth=require_client_auth,
    )


def _unavailable(call: Callable[[], None]) -> EffectdError:
    with pytest.raises(EffectdError) as raised:
        call()
    assert raised.value.code is grpc.StatusCode.UNAVAILABLE
    return raised.value


# A refused handshake fails as a daemon that is away does (UNAVAILABLE, the
# request not sent), which a client waits out for its `reconnect_wait`: the
# refusals are asked of clients that do not wait, and fail at once.
NO_WAIT = {"reconnect_wait": 0}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_tls_with_the_right_root_connects_and_the_wrong_one_does_not(
    entry: str, pki: Pki
) -> None:
    """The daemon's certificate is verified: trusted root OK, an unrelated
    root refused, and a plaintext client cannot talk to the TLS port."""
    run = ENTRY_POINTS[entry]
    with recording_server(_server_tls(pki, require_client_auth=False)) as server:
        run(server.target, root_certificates=pki.ca_pem, token=AGENT)
        assert server.seen[-1]["authorization"] == f"Bearer {AGENT}"
        if entry.endswith("Transport"):
            # The transports answer httpx errors; their cause is the refusal.
            for options in ({"root_certificates": pki.untrusted_ca_pem}, {}):
                with pytest.raises(httpx.ConnectError):
                    run(server.target, **options)
        else:
            _unavailable(
                lambda: run(
                    server.target, root_certificates=pki.untrusted_ca_pem, **NO_WAIT
                )
            )
            _unavailable(lambda: run(server.target, **NO_WAIT))
    assert len(server.seen) == 1


def test_tls_true_verifies_against_the_system_roots(pki: Pki) -> None:
    """`tls=True` without roots trusts the system's, which do not include a
    private CA: the handshake fails rather than falling back to plaintext."""
    with recording_server(_server_tls(pki, require_client_auth=False)) as server:
        _unavailable(lambda: _client_put(server.target, tls=True, **NO_WAIT))
    assert server.seen == []


def test_mutual_tls_presents_the_client_certificate(pki: Pki) -> None:
    """A server requiring client certificates accepts the client's own,
    signed by its CA, and refuses none or one from another CA."""
    with recording_server(_server_tls(pki, require_client_auth=True)) as server:
        _client_put(
            server.target,
            root_certificates=pki.ca_pem,
            certificate_chain=pki.client.cert_pem,
            private_key=pki.client.key_pem,
        )
        _unavailable(
            lambda: _client_put(server.target, root_certificates=pki.ca_pem, **NO_WAIT)
        )
        _unavailable(
            lambda: _client_put(
                server.target,
                root_certificates=pki.ca_pem,
                certificate_chain=pki.untrusted_client.cert_pem,
                private_key=pki.untrusted_client.key_pem,
                **NO_WAIT,
            )
        )
    assert len(server.seen) == 1


# -- against the real daemon with tokens ------------------------------------


@pytest.fixture
def auth_target(short_tmp: Path) -> Iterator[str]:
    config = ServeConfig(data_dir=short_tmp / "data", init=True, tokens_text=TOKENS)
    with running_daemon(config) as daemon:
        yield daemon.target


def test_the_right_token_is_served_in_its_namespace(auth_target: str) -> None:
    """An agent token with no namespace named acts in its one namespace."""
    with Client(auth_target, token=AGENT) as agent:
        prepared = agent.prepare_tool("run-1", "call-1", "search", {"q": 1})
    assert prepared.call.namespace == "team-a"
    with Client(auth_target, token=OPERATOR, namespace="team-a") as oncall:
        assert oncall.get_tool_call("run-1", "call-1").tool_name == "search"


@pytest.mark.parametrize(
    "token",
    ["", "not-a-token-of-this-daemon", AGENT[:-1]],
    ids=["none", "unknown", "truncated"],
)
def test_a_missing_or_wrong_token_is_unauthenticated(
    auth_target: str, token: str
) -> None:
    """No token, an unknown one or a truncated one: `Unauthenticated`, and
    the message quotes no token."""
    with (
        Client(auth_target, token=token) as client,
        pytest.raises(Unauthenticated) as raised,
    ):
        client.prepare_tool("run-1", "call-1", "search", {"q": 1})
    assert raised.value.code is grpc.StatusCode.UNAUTHENTICATED
    for secret in (AGENT, OPERATOR, token):
        assert not secret or secret not in str(raised.value)


def test_an_agent_token_may_not_reconcile(auth_target: str) -> None:
    """Reconciliation needs the operator role: the agent gets
    `PermissionDenied`, the operator (the control) is served."""
    with Client(auth_target, token=AGENT) as agent:
        prepared = agent.prepare_tool("run-1", "c", "charge", {"id": 1}, start=True)
        unknown = agent.report_unknown("run-1", "c", prepared.call.attempt, "died")
        with pytest.raises(PermissionDenied):
            agent.reconcile(
                "run-1",
                "c",
                expected_revision=unknown.revision,
                operator="agent-a",
                reason="guess",
                evidence="none",
                not_executed=True,
            )
    with Client(auth_target, token=OPERATOR, namespace="team-a") as oncall:
        done = oncall.reconcile(
            "run-1",
            "c",
            expected_revision=unknown.revision,
            operator="oncall",
            reason="checked",
            evidence="no charge in the ledger",
            not_executed=True,
            confirmed_dead_attempt=1,
        )
    assert done.revision > unknown.revision


def test_the_async_client_sends_its_token(auth_target: str) -> None:
    """AsyncClient: served with the token, Unauthenticated without."""

    async def main() -> None:
        async with AsyncClient(auth_target, token=AGENT) as agent:
            await agent.put_checkpoint("k", b"v")
        async with AsyncClient(auth_target, token="") as anonymous:
            with pytest.raises(Unauthenticated):
                await anonymous.put_checkpoint("k2", b"v")

    asyncio.run(main())


def test_the_daemon_over_mutual_tls_with_a_token(short_tmp: Path, pki: Pki) -> None:
    """The real daemon's TLS listener with client certificates required: the
    client with the CA, its certificate and a token is served; without its
    certificate, or in plaintext, it never reaches the daemon."""
    config = ServeConfig(
        data_dir=short_tmp / "data",
        init=True,
        tokens_text=TOKENS,
        listen="127.0.0.1:0",
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        tls_client_ca=pki.ca,
    )
    with running_daemon(config) as daemon:
        target = daemon.endpoints.tcp
        assert target is not None
        with Client(
            target,
            token=AGENT,
            root_certificates=pki.ca_pem,
            certificate_chain=pki.client.cert_pem,
            private_key=pki.client.key_pem,
        ) as agent:
            agent.put_checkpoint("k", b"v")
            assert agent.get_checkpoint("k") is not None
        _unavailable(
            lambda: _client_put(
                target, token=AGENT, root_certificates=pki.ca_pem, **NO_WAIT
            )
        )
        _unavailable(lambda: _client_put(target, token=AGENT, **NO_WAIT))


# -- one message limit, both directions -------------------------------------


def _resource_exhausted(call: Callable[[], object]) -> None:
    with pytest.raises(EffectdError) as raised:
        call()
    assert raised.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_the_default_limit_is_the_daemons() -> None:
    """The shipped client's default is the daemon's default limit."""
    assert ServerLimits().max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES


def test_the_client_limit_holds_when_sending_and_receiving(short_tmp: Path) -> None:
    """A client limited to 64 KiB refuses to send a larger request, and to
    receive a larger answer; under the limit both pass."""
    config = ServeConfig(data_dir=short_tmp / "data", init=True)
    with (
        running_daemon(config) as daemon,
        Client(daemon.target) as roomy,
        Client(daemon.target, max_message_bytes=64 * KIB) as small,
    ):
        small.put_checkpoint("under", bytes(60 * KIB))
        _resource_exhausted(lambda: small.put_checkpoint("over", bytes(70 * KIB)))
        assert roomy.get_checkpoint("over") is None  # never sent
        roomy.put_checkpoint("big", bytes(70 * KIB))
        _resource_exhausted(lambda: small.get_checkpoint("big"))
        under = small.get_checkpoint("under")
        assert under is not None
        assert len(under.value) == 60 * KIB


def test_the_daemon_limit_refuses_a_larger_request(short_tmp: Path) -> None:
    """A daemon limited to 64 KiB answers RESOURCE_EXHAUSTED to a larger
    request from a client that would send it; a smaller one is served."""
    config = ServeConfig(
        data_dir=short_tmp / "data",
        init=True,
        server_limits=ServerLimits(max_message_bytes=64 * KIB),
    )
    with running_daemon(config) as daemon, Client(daemon.target) as client:
        client.put_checkpoint("under", bytes(60 * KIB))
        _resource_exhausted(lambda: client.put_checkpoint("over", bytes(70 * KIB)))
        assert client.get_checkpoint("over") is None


def test_the_safe_call_uses_its_clients_token(auth_target: str) -> None:
    """`Run` rides on its client: with the agent's token the tool runs once
    and its repeat replays; with none the call is refused before it runs."""
    ran: list[int] = []

    def search(q: int) -> dict[str, int]:
        ran.append(q)
        return {"hits": q}

    with Client(auth_target, token=AGENT) as agent:
        safe = Run(agent, "run-safe").tool("search", effect=Effect.READ)(search)
        assert safe.at("c1")(q=3) == {"hits": 3}
        assert safe.at("c1")(q=3) == {"hits": 3}
    with Client(auth_target, token="") as anonymous:
        unsafe = Run(anonymous, "run-safe").tool("search", effect=Effect.READ)(search)
        with pytest.raises(Unauthenticated):
            unsafe.at("c2")(q=4)
    assert ran == [3]
