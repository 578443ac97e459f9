"""Concurrent RPCs per caller (docs/operations.md, section 5): one tenant
holding long ProviderStreams gets only its share of the slots; the other
tenants, gRPC health on the main port and the RPCs that record work already
done are served meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import provider_pb2 as ppb
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.config import ServerLimits
from sidecar.errors import ConcurrencyLimited
from sidecar.ledger.quota import Caller
from sidecar.rpc.concurrency import HEADROOM, WATCHES_PER_PEER, Peer, Pool, Slots
from sidecar.seams import Seams
from sidecar.testing import running_daemon
from tests.auth.support import AGENT_A, AGENT_B, Stubs, auth_config, stubs
from tests.rpc.support import decode, prepare_request, ref
from tests.settings.support import layered

TOTAL, PER_CALLER = 4, 2
A, B, C = Caller(namespace="a"), Caller(namespace="b"), Caller(token="c")


# -- the pools, as pure bookkeeping ---------------------------------------------


def test_a_caller_gets_its_share_and_then_the_total_applies() -> None:
    """Per caller at most `per_caller`; over all callers at most `total`; a
    slot given back can be taken again."""
    slots = Slots(TOTAL, PER_CALLER)
    held = [slots.take(Pool.ORDINARY, A) for _ in range(PER_CALLER)]
    with pytest.raises(ConcurrencyLimited) as mine:
        slots.take(Pool.ORDINARY, A)
    assert mine.value.metadata == {"limit": str(PER_CALLER), "namespace": "a"}
    held += [slots.take(Pool.ORDINARY, B) for _ in range(PER_CALLER)]
    with pytest.raises(ConcurrencyLimited) as everyone:
        slots.take(Pool.ORDINARY, C)
    assert everyone.value.metadata == {"limit": str(TOTAL)}
    held.pop()()
    slots.take(Pool.ORDINARY, C)
    assert slots.in_flight(Pool.ORDINARY) == TOTAL


def test_recording_calls_and_health_watches_have_room_of_their_own() -> None:
    """With every ordinary slot taken, a caller can still take its share of
    the recording pool, and health watches theirs."""
    slots = Slots(TOTAL, PER_CALLER)
    for caller in (A, A, B, B):
        slots.take(Pool.ORDINARY, caller)
    for _ in range(PER_CALLER):
        slots.take(Pool.RECORDING, A)
    with pytest.raises(ConcurrencyLimited):
        slots.take(Pool.RECORDING, A)
    slots.take(Pool.RECORDING, B)
    watches = [slots.take(Pool.HEALTH_WATCH, Caller()) for _ in range(PER_CALLER)]
    with pytest.raises(ConcurrencyLimited):
        slots.take(Pool.HEALTH_WATCH, Caller())
    assert len(watches) == PER_CALLER
    assert slots.backstop == 3 * TOTAL + PER_CALLER + HEADROOM


def test_giving_a_slot_back_twice_frees_only_one() -> None:
    """Release is idempotent: a second call cannot free another caller's slot."""
    slots = Slots(TOTAL, PER_CALLER)
    release = slots.take(Pool.ORDINARY, A)
    slots.take(Pool.ORDINARY, A)
    release()
    release()
    assert slots.in_flight(Pool.ORDINARY) == 1
    slots.take(Pool.ORDINARY, A)
    with pytest.raises(ConcurrencyLimited):
        slots.take(Pool.ORDINARY, A)


@pytest.mark.parametrize(("total", "per_caller"), [(0, 1), (1, 0)])
def test_empty_pools_are_refused(total: int, per_caller: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Slots(total, per_caller)


# -- through a real daemon ------------------------------------------------------


class Stalled(httpx.AsyncByteStream):
    """An upstream event stream that sends one event, then nothing."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'data: {"n":1}\n\n'
        await asyncio.Event().wait()


async def stalled_upstream(_: httpx.Request) -> httpx.Response:
    return httpx.Response(
        200, headers={"content-type": "text/event-stream"}, stream=Stalled()
    )


@contextmanager
def limited_daemon(short_tmp: Path, limits: ServerLimits) -> Iterator[grpc.Channel]:
    """A daemon with tokens, a provider route to a stalling upstream, and
    these limits."""
    providers = short_tmp / "providers.toml"
    providers.write_text(
        '[routes.up]\nbase_url = "http://127.0.0.1:9"\npaths = ["/v1/"]\n'
    )
    config = auth_config(
        short_tmp / "data", providers_file=providers, server_limits=limits
    )
    seams = Seams(transport=httpx.MockTransport(stalled_upstream))
    with (
        running_daemon(config, seams=seams) as running,
        grpc.insecure_channel(running.target) as ch,
    ):
        yield ch


@pytest.fixture
def channel(short_tmp: Path) -> Iterator[grpc.Channel]:
    """Room for 4 ordinary calls, 2 per caller."""
    limits = ServerLimits(
        max_concurrent_rpcs=TOTAL, max_concurrent_rpcs_per_caller=PER_CALLER
    )
    with limited_daemon(short_tmp, limits) as ch:
        yield ch


def open_stream(s: Stubs, streams: ExitStack) -> str:
    """Opens a long ProviderStream; "OPEN" once its first message came (it
    holds a slot until cancelled at the end of the test), else the reason
    it was refused with."""
    request = ppb.ProviderRequest(route="up", path="/v1/chat", body=b"{}")
    call = s.provider.ProviderStream(request, metadata=s.metadata, timeout=60)
    return first_message(call, streams)


def first_message(call: Any, streams: ExitStack) -> str:
    """ "OPEN" once the stream's first message came (it is cancelled as
    `streams` closes), else the reason it was refused with."""
    streams.callback(call.cancel)
    try:
        next(call)
    except grpc.RpcError as exc:
        return decode(exc).reason or exc.code().name
    return "OPEN"


def test_one_tenants_streams_leave_room_for_others_health_and_commits(
    channel: grpc.Channel,
) -> None:
    """Agent A tries to hold 4 long streams: 2 open, 2 are refused
    CONCURRENCY_LIMITED. Agent B is served, health on the main port answers
    SERVING, and A's CommitTool is answered; once B holds the other 2 slots,
    A can still record its result (issue 10 item 24: fails before the fix:
    A's 4 streams took every slot, and B, health and the commit got
    `Concurrent RPC limit exceeded`)."""
    a, b = stubs(channel, AGENT_A), stubs(channel, AGENT_B)
    health = health_pb2_grpc.HealthStub(channel)
    started = a.ledger.PrepareTool(
        prepare_request("run", "c1", start=True), metadata=a.metadata, timeout=10
    )
    assert started.decision == pb.DECISION_EXECUTE
    with ExitStack() as streams:
        opened = [open_stream(a, streams) for _ in range(4)]
        assert opened == ["OPEN", "OPEN", "CONCURRENCY_LIMITED", "CONCURRENCY_LIMITED"]

        served = b.ledger.PrepareTool(
            prepare_request("run", "b1"), metadata=b.metadata, timeout=10
        )
        assert served.decision == pb.DECISION_EXECUTE
        check = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert check.status == health_pb2.HealthCheckResponse.SERVING

        assert [open_stream(b, streams) for _ in range(2)] == ["OPEN", "OPEN"]
        a.ledger.Heartbeat(
            pb.HeartbeatRequest(ref=ref("run", "c1"), attempt=1),
            metadata=a.metadata,
            timeout=10,
        )
        result = pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json="{}"))
        committed = a.ledger.CommitTool(
            pb.CommitToolRequest(ref=ref("run", "c1"), attempt=1, result=result),
            metadata=a.metadata,
            timeout=10,
        )
        assert committed.call.state == pb.CALL_STATE_COMMITTED
        check = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        # Every ordinary slot is taken now: anything else waits its turn.
        with pytest.raises(grpc.RpcError) as full:
            b.ledger.GetToolCall(
                pb.GetToolCallRequest(ref=ref("run", "b1")),
                metadata=b.metadata,
                timeout=10,
            )
        assert decode(full.value).reason == "CONCURRENCY_LIMITED"


# -- the per-caller share follows the server's limit ----------------------------


@pytest.mark.parametrize(
    ("argv", "per_caller", "session"),
    [
        ((), 64, 64),
        (("--max-concurrent-rpcs", "64"), 16, 16),
        (("--max-concurrent-rpcs", "3"), 1, 1),
        (
            ("--max-concurrent-rpcs", "64", "--max-concurrent-rpcs-per-caller", "40"),
            40,
            40,
        ),
        (
            ("--max-concurrent-rpcs-per-caller", "8", "--session-max-in-flight", "5"),
            8,
            5,
        ),
    ],
)
def test_the_per_caller_share_is_derived_from_the_servers_limit(
    argv: tuple[str, ...], per_caller: int, session: int
) -> None:
    """Unset, one caller's share is a quarter of --max-concurrent-rpcs, and a
    session stream's messages in flight that share; set, each is as set."""
    limits = layered(argv).config.server_limits
    assert (limits.per_caller, limits.session_in_flight) == (per_caller, session)


def test_lowering_the_servers_limit_alone_leaves_room_for_other_tenants(
    short_tmp: Path,
) -> None:
    """--max-concurrent-rpcs 8 and nothing else: agent A holds 2 long
    streams, its third is refused CONCURRENCY_LIMITED, and agent B opens its
    own (issue 25 item 19: fails before the fix: the per-caller limit stayed
    64, clamped to 8, and A's streams took every slot)."""
    with limited_daemon(short_tmp, ServerLimits(max_concurrent_rpcs=8)) as channel:
        a, b = stubs(channel, AGENT_A), stubs(channel, AGENT_B)
        with ExitStack() as streams:
            opened = [open_stream(a, streams) for _ in range(3)]
            assert opened == ["OPEN", "OPEN", "CONCURRENCY_LIMITED"]
            assert [open_stream(b, streams) for _ in range(2)] == ["OPEN", "OPEN"]


# -- health Watch streams, bounded per peer -------------------------------------


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("ipv4:127.0.0.1:5555", "127.0.0.1"),
        ("ipv6:%5B::1%5D:5555", "::1"),
        ("ipv6:[2001:db8::7]:443", "2001:db8::7"),
        ("unix:", "unix"),
        ("unix:/run/effectd/effectd.sock", "unix"),
        ("", ""),
    ],
)
def test_a_peer_is_its_address_without_the_port(peer: str, address: str) -> None:
    assert Peer.of(peer).address == address


def test_one_peer_gets_at_most_its_share_of_the_watch_pool() -> None:
    slots = Slots(256, 64)
    here, there = Peer("10.0.0.1"), Peer("10.0.0.2")
    for _ in range(WATCHES_PER_PEER):
        slots.take(Pool.HEALTH_WATCH, here)
    with pytest.raises(ConcurrencyLimited) as refused:
        slots.take(Pool.HEALTH_WATCH, here)
    assert refused.value.metadata == {
        "limit": str(WATCHES_PER_PEER),
        "peer": "10.0.0.1",
    }
    slots.take(Pool.HEALTH_WATCH, there)


def open_watch(channel: grpc.Channel, streams: ExitStack) -> str:
    """Opens a health Watch; "OPEN" once its first answer came (it holds a
    slot until cancelled at the end of the test), else its refusal."""
    health = health_pb2_grpc.HealthStub(channel)
    call = health.Watch(health_pb2.HealthCheckRequest(), timeout=60)
    return first_message(call, streams)


def test_one_peers_health_watches_leave_the_pool_to_others(short_tmp: Path) -> None:
    """Watches need no token: the clients of the Unix socket (one peer) open
    WATCHES_PER_PEER, the next is refused CONCURRENCY_LIMITED, and loopback
    TCP, another peer, still opens its own; the health port is bounded the
    same way (issue 25 item 20: fails before the fix: one peer could open
    every one of the 64 watch slots, and the health port any number)."""
    config = auth_config(
        short_tmp / "data", listen="127.0.0.1:0", health_listen="127.0.0.1:0"
    )
    with running_daemon(config) as daemon, ExitStack() as streams:
        assert daemon.endpoints.tcp is not None
        assert daemon.daemon.health_address is not None
        socket = streams.enter_context(grpc.insecure_channel(daemon.target))
        opened = [open_watch(socket, streams) for _ in range(WATCHES_PER_PEER + 1)]
        assert opened == ["OPEN"] * WATCHES_PER_PEER + ["CONCURRENCY_LIMITED"]
        tcp = streams.enter_context(grpc.insecure_channel(daemon.endpoints.tcp))
        assert open_watch(tcp, streams) == "OPEN"
        probes = streams.enter_context(
            grpc.insecure_channel(daemon.daemon.health_address)
        )
        # 127.0.0.1 holds one watch already, on the main port.
        opened = [open_watch(probes, streams) for _ in range(WATCHES_PER_PEER)]
        assert opened == ["OPEN"] * (WATCHES_PER_PEER - 1) + ["CONCURRENCY_LIMITED"]
        check = health_pb2_grpc.HealthStub(probes).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        assert check.status == health_pb2.HealthCheckResponse.SERVING
