"""The safe call records what a tool's outcome really is: a transport failure
of any common client library is unknown, never a failure; a value JSON cannot
say is a success, never an error."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import aiohttp
import botocore.session
import grpc
import httpx
import pytest
import requests
import urllib3
from botocore.config import Config
from botocore.exceptions import (
    ConnectionClosedError,
    ConnectTimeoutError,
    ReadTimeoutError,
)

from effectd_client import (
    AsyncClient,
    AsyncRun,
    Client,
    Effect,
    OutcomeUnknown,
    ReconciliationNeeded,
    Run,
    State,
    ToolFailed,
)
from effectd_client._safe_outcomes import is_unknown, jsonable
from sidecar.testing import RunningDaemon
from tests.clients.hostile_server import HostileServer, Mode, hostile

TIMEOUT = 0.3  # the tools' own client timeouts, against servers that hang


@contextmanager
def full_backlog() -> Iterator[str]:
    """A listener whose accept queue is full: a new connect never completes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(8):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for s in fillers:
            s.close()
        listener.close()


def s3(url: str) -> Any:
    return botocore.session.get_session().create_client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(
            read_timeout=TIMEOUT, connect_timeout=TIMEOUT, retries={"max_attempts": 1}
        ),
    )


def grpc_call(url: str, timeout: float) -> object:
    with grpc.insecure_channel(url.removeprefix("http://")) as channel:
        return channel.unary_unary("/shop.Orders/Create", None, None)(
            b"", timeout=timeout
        )


BIG = b"x" * (64 << 20)  # more than loopback buffers hold: the upload stalls

# (mode, the tool's request, the library exception it raises)
Request = Callable[[str], object]
FAMILIES: list[Any] = [
    pytest.param(
        Mode.HANG,
        lambda url: httpx.post(url, json={}, timeout=TIMEOUT),
        httpx.ReadTimeout,
        id="httpx-ReadTimeout",
    ),
    pytest.param(
        Mode.CLOSE,
        lambda url: httpx.post(url, json={}, timeout=TIMEOUT),
        httpx.RemoteProtocolError,
        id="httpx-RemoteProtocolError",
    ),
    pytest.param(
        Mode.PARTIAL,
        lambda url: httpx.post(url, json={}, timeout=TIMEOUT),
        httpx.RemoteProtocolError,
        id="httpx-RemoteProtocolError-body",
    ),
    pytest.param(
        Mode.STALL,
        lambda url: httpx.post(url, content=BIG, timeout=TIMEOUT),
        httpx.WriteTimeout,
        id="httpx-WriteTimeout",
    ),
    pytest.param(
        Mode.HANG,
        lambda url: requests.post(url, json={}, timeout=TIMEOUT),
        requests.ReadTimeout,
        id="requests-ReadTimeout",
    ),
    pytest.param(
        Mode.RESET,
        lambda url: requests.post(url, json={}, timeout=TIMEOUT),
        requests.ConnectionError,
        id="requests-ConnectionError",
    ),
    pytest.param(
        Mode.PARTIAL,
        lambda url: requests.post(url, json={}, timeout=TIMEOUT),
        requests.exceptions.ChunkedEncodingError,
        id="requests-ChunkedEncodingError",
    ),
    pytest.param(
        Mode.HANG,
        lambda url: urllib3.PoolManager(retries=False).request(
            "POST", url, body=b"{}", timeout=TIMEOUT
        ),
        urllib3.exceptions.ReadTimeoutError,
        id="urllib3-ReadTimeoutError",
    ),
    pytest.param(
        Mode.RESET,
        lambda url: urllib3.PoolManager(retries=False).request(
            "POST", url, body=b"{}", timeout=TIMEOUT
        ),
        urllib3.exceptions.ProtocolError,
        id="urllib3-ProtocolError",
    ),
    pytest.param(
        Mode.HANG,
        lambda url: s3(url).put_object(Bucket="b", Key="k", Body=b"1"),
        ReadTimeoutError,
        id="botocore-ReadTimeoutError",
    ),
    pytest.param(
        Mode.CLOSE,
        lambda url: s3(url).put_object(Bucket="b", Key="k", Body=b"1"),
        ConnectionClosedError,
        id="botocore-ConnectionClosedError",
    ),
    pytest.param(
        Mode.HANG,
        lambda url: grpc_call(url, TIMEOUT),
        grpc.RpcError,
        id="grpc-DEADLINE_EXCEEDED",
    ),
    pytest.param(
        Mode.RESET,
        lambda url: grpc_call(url, 5),
        grpc.RpcError,
        id="grpc-UNAVAILABLE",
    ),
]


def send(client: Client, run_id: str, request: Request, url: str) -> object:
    """A SIDE_EFFECT tool whose request goes to `url`, through the safe call."""

    @Run(client, run_id).tool("create_order")
    def create_order(sku: str) -> object:
        return request(url)

    return create_order.at("order-1")("A1")


@pytest.mark.parametrize(("mode", "request_", "raised"), FAMILIES)
def test_a_transport_failure_of_a_client_library_is_an_unknown_outcome(
    client: Client, mode: Mode, request_: Request, raised: type[BaseException]
) -> None:
    """The library's real exception against a server that hangs, resets or
    breaks off leaves the side effect UNKNOWN, never a definite ERROR, and it
    is never run again (issue 10 item B3: fails before the fix: COMMITTED
    with an error result)."""
    with hostile(mode) as server, pytest.raises(raised):
        send(client, "run-net", request_, server.url)
    call = client.get_tool_call("run-net", "order-1")
    assert (call.state, call.result) == (State.UNKNOWN, None)
    with pytest.raises(ReconciliationNeeded):
        send(client, "run-net", request_, "http://127.0.0.1:9")


@pytest.mark.parametrize(
    ("request_", "raised"),
    [
        pytest.param(
            lambda url: httpx.post(url, timeout=TIMEOUT),
            httpx.ConnectTimeout,
            id="httpx",
        ),
        pytest.param(
            lambda url: requests.post(url, timeout=TIMEOUT),
            requests.ConnectTimeout,
            id="requests",
        ),
        pytest.param(
            lambda url: s3(url).put_object(Bucket="b", Key="k", Body=b"1"),
            ConnectTimeoutError,
            id="botocore",
        ),
    ],
)
def test_a_connect_timeout_is_an_unknown_outcome(
    client: Client, request_: Request, raised: type[BaseException]
) -> None:
    """A connect timeout against a listener whose queue is full is unknown
    too (issue 10 item B3: fails before the fix: committed as errors)."""
    with full_backlog() as url, pytest.raises(raised):
        send(client, "run-connect", request_, url)
    assert client.get_tool_call("run-connect", "order-1").state is State.UNKNOWN


@pytest.mark.parametrize(
    ("mode", "raised"),
    [
        pytest.param(Mode.HANG, aiohttp.SocketTimeoutError, id="SocketTimeoutError"),
        pytest.param(Mode.RESET, aiohttp.ClientOSError, id="ClientOSError"),
        pytest.param(Mode.CLOSE, aiohttp.ServerDisconnectedError, id="Disconnected"),
        pytest.param(Mode.PARTIAL, aiohttp.ClientPayloadError, id="ClientPayloadError"),
    ],
)
def test_an_aiohttp_failure_is_an_unknown_outcome(
    daemon: RunningDaemon, mode: Mode, raised: type[BaseException]
) -> None:
    """aiohttp's real exceptions through AsyncRun are unknown outcomes
    (issue 10 item B3: fails before the fix for all but the socket timeout,
    which is also a builtin TimeoutError)."""

    async def main(server: HostileServer) -> State:
        async with AsyncClient(daemon.target) as client:
            run = AsyncRun(client, "run-aio")

            @run.tool("create_order")
            async def create_order(sku: str) -> object:
                timeout = aiohttp.ClientTimeout(total=5, sock_read=TIMEOUT)
                async with (
                    aiohttp.ClientSession(timeout=timeout) as session,
                    session.post(server.url, json={"sku": sku}) as answer,
                ):
                    return await answer.json()

            with pytest.raises(raised):
                await create_order.at("order-1")("A1")
            return (await client.get_tool_call("run-aio", "order-1")).state

    with hostile(mode) as server:
        assert asyncio.run(main(server)) is State.UNKNOWN


def test_grpc_unknown_and_cancelled_are_unknown_outcomes(client: Client) -> None:
    """A gRPC server that fails (UNKNOWN) or cancels (CANCELLED) after the
    request arrived leaves the tool's outcome unknown (issue 10 item B3:
    fails before the fix: both committed as errors)."""

    def fail(request: bytes, context: grpc.ServicerContext) -> bytes:
        raise RuntimeError("the order service crashed after writing the order")

    def cancel(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.cancel()  # type: ignore[no-untyped-call]
        return b""

    handler = grpc.method_handlers_generic_handler(
        "shop.Orders",
        {
            "Fail": grpc.unary_unary_rpc_method_handler(fail),
            "Cancel": grpc.unary_unary_rpc_method_handler(cancel),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    codes = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            for method in ("Fail", "Cancel"):
                path = f"/shop.Orders/{method}"

                @Run(client, "run-grpc").tool(method)
                def call(n: int, path: str = path) -> object:
                    return channel.unary_unary(path, None, None)(b"", timeout=5)

                with pytest.raises(grpc.RpcError) as raised:
                    call.at(method)(1)
                codes.append(raised.value.code())
                assert client.get_tool_call("run-grpc", method).state is State.UNKNOWN
    finally:
        server.stop(None)
    assert codes == [grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED]


def test_negative_control_a_definite_classifier_is_caught(client: Client) -> None:
    """The check above sees a safe call that commits every exception as a
    definite error: the call of a hanging request ends COMMITTED."""

    def broken(client: Client, url: str) -> None:
        p = client.prepare_tool("run-bad", "order-1", "create_order", {}, start=True)
        try:
            httpx.post(url, timeout=TIMEOUT)
        except Exception as exc:
            client.commit_tool(
                "run-bad", "order-1", p.call.attempt, error_code=type(exc).__name__
            )

    with hostile(Mode.HANG) as server:
        broken(client, server.url)
    assert client.get_tool_call("run-bad", "order-1").state is State.COMMITTED


class Declined(Exception):
    """A payment API's definite refusal."""


class Ambiguous(Exception):
    """A library error a tool knows to be ambiguous."""


@pytest.mark.parametrize(
    ("exc", "unknown_on", "definite_on", "unknown"),
    [
        (ValueError("bad input"), (), (), False),
        (TimeoutError(), (), (), True),
        (ConnectionResetError(), (), (), True),
        (asyncio.CancelledError(), (), (), True),
        (OutcomeUnknown(), (), (), True),
        (Ambiguous(), (Ambiguous,), (), True),
        (Ambiguous("504"), (lambda e: "504" in str(e),), (), True),
        (httpx.ConnectError("refused"), (), (httpx.ConnectError,), False),
        # The tool's unknown_on wins over its definite_on.
        (Ambiguous(), (Ambiguous,), (Ambiguous,), True),
        (type("Flagged", (Exception,), {"outcome_unknown": True})(), (), (), True),
    ],
)
def test_the_classification_table(
    exc: BaseException,
    unknown_on: tuple[Any, ...],
    definite_on: tuple[Any, ...],
    unknown: bool,
) -> None:
    """Declarations first, then the known families; otherwise definite."""
    assert is_unknown(exc, unknown_on, definite_on) is unknown


def test_an_exception_raised_from_a_transport_error_is_unknown() -> None:
    """A tool's own error raised from (or while handling) a timeout is
    unknown; `raise ... from None` says it is not, and so does definite_on."""

    def wrapped(suppress: bool) -> BaseException:
        try:
            try:
                raise httpx.ReadTimeout("timed out")
            except httpx.ReadTimeout as exc:
                if suppress:
                    raise Declined("payment failed") from None
                raise Declined("payment failed") from exc
        except Declined as outer:
            return outer

    assert is_unknown(wrapped(suppress=False))
    assert not is_unknown(wrapped(suppress=True))
    assert not is_unknown(wrapped(suppress=False), definite_on=(Declined,))


@pytest.mark.parametrize(
    ("declare", "state"),
    [
        ({"unknown_on": (Ambiguous,)}, State.UNKNOWN),
        ({"definite_on": (httpx.ConnectError,)}, State.COMMITTED),
    ],
)
def test_a_tool_declares_its_own_classification(
    client: Client, declare: dict[str, Any], state: State
) -> None:
    """`unknown_on=` and `definite_on=` of the decorator decide first."""
    error = Ambiguous() if "unknown_on" in declare else httpx.ConnectError("no")

    @Run(client, "run-declared").tool("t", **declare)
    def tool() -> None:
        raise error

    with pytest.raises(type(error)):
        tool.at("c")()
    assert client.get_tool_call("run-declared", "c").state is state


FAMILY_MODULES = (
    "requests",
    "urllib3",
    "aiohttp",
    "botocore",
    "httpx2",
    "openai",
    "anthropic",
)

# Blocks and records every import of the client libraries, then classifies.
ABSENT_PROGRAM = """
import importlib.abc, json, sys
NAMES = set(sys.argv[1].split(","))
tried = []
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in NAMES:
            tried.append(name)
            raise ImportError(f"{name} is not installed")
sys.meta_path.insert(0, Absent())
from effectd_client import Run
from effectd_client._safe_outcomes import is_unknown
verdicts = [is_unknown(e) for e in (ValueError(), TimeoutError(), KeyError())]
if sys.argv[2] == "control":
    try:
        import requests
    except ImportError:
        pass
loaded = sorted(m for m in sys.modules if m.split(".")[0] in NAMES)
print(json.dumps({"tried": tried, "loaded": loaded, "verdicts": verdicts}))
"""


@pytest.mark.parametrize("control", [False, True], ids=["classifier", "control"])
def test_the_classifier_imports_no_client_library(control: bool) -> None:
    """With the libraries absent, importing the client and classifying never
    tries to import one; the control (which imports requests) is caught."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            ABSENT_PROGRAM,
            ",".join(FAMILY_MODULES),
            "control" if control else "plain",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    found = json.loads(out.stdout)
    assert found["verdicts"] == [False, True, False]
    assert found["loaded"] == []
    assert found["tried"] == (["requests"] if control else [])


# -- results JSON cannot say (B4) ----------------------------------------------


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Receipt:
    id: int
    at: datetime.datetime
    tags: frozenset[str]


class Unprintable:
    def __str__(self) -> str:
        return "an unprintable"


def cyclic() -> list[Any]:
    value: list[Any] = [1]
    value.append(value)
    return value


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ({"a": [1, 2.5, None, True]}, {"a": [1, 2.5, None, True]}),
        ((1, "x"), [1, "x"]),
        (Color.RED, "red"),
        (
            Receipt(7, datetime.datetime(2026, 1, 2, 3, 4, 5), frozenset({"b", "a"})),
            {"id": 7, "at": "2026-01-02T03:04:05", "tags": ["a", "b"]},
        ),
        (b"\x00\xff", "AP8="),
        (2**64, "18446744073709551616"),
        (float("nan"), "nan"),
        ({1: "one", (2, 3): "pair"}, {"1": "one", "[2, 3]": "pair"}),
        (Unprintable(), "an unprintable"),
        (cyclic(), [1, "<cycle>"]),
    ],
)
def test_the_fallback_encoding_table(value: Any, stored: Any) -> None:
    """What JSON cannot say is encoded losslessly where it can be."""
    encoded = jsonable(value)
    assert encoded == stored
    json.dumps(encoded, allow_nan=False)


def test_a_side_effect_returning_a_value_json_cannot_say_is_committed_ok(
    client: Client,
) -> None:
    """A SIDE_EFFECT that ran and returned an object is recorded as a success
    with the fallback encoding, and never run again (issue 10 item B4: fails
    before the fix: committed as ERROR TypeError)."""
    calls: list[int] = []

    def make() -> object:
        calls.append(1)
        return Unprintable()

    assert isinstance(Run(client, "run-obj").tool("make")(make).at("m")(), Unprintable)
    assert Run(client, "run-obj").tool("make")(make).at("m")() == "an unprintable"
    call = client.get_tool_call("run-obj", "m")
    assert call.result is not None
    assert (call.state, call.result.ok, call.result.value) == (
        State.COMMITTED,
        True,
        "an unprintable",
    )
    assert calls == [1]


def test_a_result_out_of_the_json_number_domain_is_committed_ok(
    client: Client,
) -> None:
    """An id beyond 2**53 (which the daemon's JSON refuses) is stored as text,
    not lost (issue 10 item B4: fails before the fix: the commit was
    INVALID_REQUEST and the result was lost)."""

    @Run(client, "run-big").tool("create")
    def create() -> dict[str, int]:
        return {"id": 2**64}

    assert create.at("c")() == {"id": 2**64}
    call = client.get_tool_call("run-big", "c")
    assert call.result is not None
    assert call.result.value == {"id": "18446744073709551616"}


def test_the_serialize_hook_decides_what_is_committed(client: Client) -> None:
    """`serialize=` turns the returned object into the stored result; a
    replay returns that stored form."""

    @Run(client, "run-ser").tool("stamp", serialize=lambda r: {"receipt": r.id})
    def stamp() -> Receipt:
        return Receipt(9, datetime.datetime(2026, 1, 1), frozenset())

    assert stamp.at("s")().id == 9
    again = Run(client, "run-ser").tool("stamp", serialize=lambda r: r.id)(stamp.fn)
    replayed: object = again.at("s")()
    assert replayed == {"receipt": 9}


def test_a_definite_error_is_still_committed_as_an_error(client: Client) -> None:
    """Only values are encoded: a raised ValueError stays a definite error."""

    @Run(client, "run-def").tool("t", effect=Effect.READ)
    def tool() -> None:
        raise ValueError("no such order")

    with pytest.raises(ValueError, match="no such order"):
        tool.at("t")()
    with pytest.raises(ToolFailed):
        tool.at("t")()


def test_an_error_message_the_daemon_would_refuse_is_bounded(client: Client) -> None:
    """A huge message with control characters is still committed, cut to the
    daemon's limits (fails before the fix: the commit was INVALID_REQUEST)."""

    @Run(client, "run-long").tool("t", effect=Effect.READ)
    def tool() -> None:
        raise ValueError("\r\x00" + "e" * 10_000)

    with pytest.raises(ValueError, match="eee"):
        tool.at("t")()
    call = client.get_tool_call("run-long", "t")
    assert call.result is not None
    assert call.result.error_code == "ValueError"
    assert len(call.result.error_message.encode()) <= 4096
