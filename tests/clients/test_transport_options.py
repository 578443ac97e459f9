"""One `Connection` value for every entry point, one transport implementation
over the httpx flavours with one failure boundary, and one hop-by-hop list
shared by the client and the daemon."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import httpx
import httpx2
import pytest

from effectd_client import (
    AsyncClient,
    AsyncEffectdTransport,
    AsyncHttpx2EffectdTransport,
    Client,
    Connection,
    EffectdTransport,
    Httpx2EffectdTransport,
    is_hop_by_hop,
)
from effectd_client import _provider as wire
from effectd_client._flavours import HTTPX, Flavour, httpx2_flavour, mapped
from tests.clients.test_auth_options import AGENT, OPERATOR, recording_server

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]


def _client(daemon: Connection) -> None:
    with Client(daemon, timeout=5) as client:
        client.put_checkpoint("k", b"v")


def _async_client(daemon: Connection) -> None:
    async def main() -> None:
        async with AsyncClient(daemon, timeout=5) as client:
            await client.put_checkpoint("k", b"v")

    asyncio.run(main())


def _transport(daemon: Connection) -> None:
    transport = EffectdTransport(daemon, route="r", timeout=5)
    with httpx.Client(transport=transport) as http:
        assert http.get("http://effectd/x").status_code == 200


def _async_transport(daemon: Connection) -> None:
    async def main() -> None:
        transport = AsyncEffectdTransport(daemon, route="r", timeout=5)
        async with httpx.AsyncClient(transport=transport) as http:
            assert (await http.get("http://effectd/x")).status_code == 200

    asyncio.run(main())


def _httpx2_transport(daemon: Connection) -> None:
    transport = Httpx2EffectdTransport(daemon, route="r", timeout=5)
    with httpx2.Client(transport=transport) as http:
        assert http.get("http://effectd/x").status_code == 200


def _async_httpx2_transport(daemon: Connection) -> None:
    async def main() -> None:
        transport = AsyncHttpx2EffectdTransport(daemon, route="r", timeout=5)
        async with httpx2.AsyncClient(transport=transport) as http:
            assert (await http.get("http://effectd/x")).status_code == 200

    asyncio.run(main())


ENTRY_POINTS: dict[str, Callable[[Connection], None]] = {
    "Client": _client,
    "AsyncClient": _async_client,
    "EffectdTransport": _transport,
    "AsyncEffectdTransport": _async_transport,
    "Httpx2EffectdTransport": _httpx2_transport,
    "AsyncHttpx2EffectdTransport": _async_httpx2_transport,
}
MAKERS: dict[str, Callable[..., object]] = {
    "Client": Client,
    "AsyncClient": AsyncClient,
    "EffectdTransport": lambda *a, **k: EffectdTransport(*a, route="r", **k),
    "AsyncEffectdTransport": lambda *a, **k: AsyncEffectdTransport(*a, route="r", **k),
    "Httpx2EffectdTransport": lambda *a, **k: Httpx2EffectdTransport(
        *a, route="r", **k
    ),
    "AsyncHttpx2EffectdTransport": lambda *a, **k: AsyncHttpx2EffectdTransport(
        *a, route="r", **k
    ),
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_takes_one_connection_value(
    entry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each of the six entry points accepts a `Connection` and calls with its
    token (issue 11 item 3: fails before the fix: the value was private and
    only a target string was accepted)."""
    monkeypatch.delenv("EFFECTD_TOKEN", raising=False)
    with recording_server() as server:
        ENTRY_POINTS[entry](Connection(server.target, token=AGENT))
        ENTRY_POINTS[entry](Connection(server.target))
    with_token, without = server.seen
    assert with_token["authorization"] == f"Bearer {AGENT}"
    assert "authorization" not in without


@pytest.mark.parametrize("entry", MAKERS)
@pytest.mark.parametrize(
    "keyword",
    [
        {"token": AGENT},
        {"tls": True},
        {"root_certificates": b"pem"},
        {"max_message_bytes": 1 << 10},
    ],
)
def test_a_connection_and_its_keywords_are_not_given_together(
    entry: str, keyword: dict[str, Any]
) -> None:
    """Options in a `Connection` and as keywords at once are a mistake: which
    would win is not obvious, so neither does."""
    with pytest.raises(TypeError, match="not both"):
        MAKERS[entry](Connection("unix:/nonexistent.sock"), **keyword)


def test_a_connection_without_a_token_reads_effectd_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A `Connection` is what the keywords are: no token reads EFFECTD_TOKEN
    when the entry point is made, an empty one sends none even then."""
    monkeypatch.setenv("EFFECTD_TOKEN", OPERATOR)
    with recording_server() as server:
        _client(Connection(server.target))
        _client(Connection(server.target, token=""))
    from_env, none = server.seen
    assert from_env["authorization"] == f"Bearer {OPERATOR}"
    assert "authorization" not in none


FLAVOURS: dict[str, Callable[[], Flavour[Any]]] = {
    "httpx": lambda: HTTPX,
    "httpx2": httpx2_flavour,
}
LIBRARIES: dict[str, Any] = {"httpx": httpx, "httpx2": httpx2}


@pytest.mark.parametrize("name", FLAVOURS)
def test_every_internal_failure_is_mapped_for_every_flavour(name: str) -> None:
    """Each internal failure has its library's transport error, and the one
    boundary raises it with the request and the daemon's error as its cause
    (issue 11 item 3: fails before the fix: four stream classes and two
    functions translated failures each on their own)."""
    # httpx tests/test_exceptions.py::test_httpcore_all_exceptions_mapped
    flavour, library = FLAVOURS[name](), LIBRARIES[name]
    assert set(flavour.errors) == set(wire.Failure.__subclasses__())
    for failure, maps_to in flavour.errors.items():
        error = cast("type[Exception]", maps_to)
        assert issubclass(error, library.TransportError)
        request = library.Request("GET", "http://effectd/x")
        cause = RuntimeError("why")
        raised = failure("effectd: because")
        raised.__cause__ = cause
        with pytest.raises(error) as caught, mapped(flavour, request):
            raise raised
        assert getattr(caught.value, "request", None) is request
        assert caught.value.__cause__ is cause
        assert str(caught.value) == "effectd: because"


def test_the_four_transports_are_one_implementation() -> None:
    """httpx and httpx2 transports run the same code, sync and async each
    (issue 11 item 3: fails before the fix: four near-identical classes)."""
    sync: object = EffectdTransport.handle_request
    aio: object = AsyncEffectdTransport.handle_async_request
    assert sync is Httpx2EffectdTransport.handle_request
    assert aio is AsyncHttpx2EffectdTransport.handle_async_request
    init: object = EffectdTransport.__init__
    assert init is AsyncHttpx2EffectdTransport.__init__


def test_the_hop_by_hop_list_exists_once() -> None:
    """One list of hop-by-hop headers, in the client, which the daemon
    imports (issue 11 item 3: fails before the fix: the client and the
    daemon each kept their own)."""
    sources = [
        *(ROOT / "sidecar").rglob("*.py"),
        *(ROOT / "clients/python/src/effectd_client").rglob("*.py"),
    ]
    holding = [p for p in sources if '"proxy-connection"' in p.read_text()]
    assert [p.name for p in holding] == ["_provider.py"]
    assert is_hop_by_hop("Keep-Alive")
    assert not is_hop_by_hop("content-type")
