"""What reaches the upstream besides the request itself: an HTTP client's
default headers, which the request's own override, and nothing kept from
an earlier answer (attempts go to the pooled transport, with no client and
no cookie jar around it)."""

from __future__ import annotations

from sidecar.provider.client import ProviderClient
from sidecar.provider.messages import Answer
from tests.provider.support import FakeSleep, request, run
from tests.provider.upstream import Reply, serving


def test_the_defaults_are_sent_unless_the_request_sets_them() -> None:
    """Accept, Accept-Encoding, Connection and User-Agent go with every
    request; the request's own Accept replaces the default one."""
    # provider-retries §12.3: the request is sent as the agent made it

    async def body(client: ProviderClient, _: FakeSleep) -> list[Answer]:
        own = request(headers=(("Accept", "text/event-stream"),))
        return [await client.call(request()), await client.call(own)]

    with serving(Reply(200)) as up:
        run(body, up.base_url)
        plain, own = up.seen
    assert plain.headers["accept"] == "*/*"
    assert own.headers["accept"] == "text/event-stream"
    for seen in (plain, own):
        assert seen.headers["accept-encoding"] == "gzip, deflate"
        assert seen.headers["connection"] == "keep-alive"
        assert seen.headers["user-agent"].startswith("python-httpx/")


def test_an_upstream_cookie_is_never_sent_back() -> None:
    """A cookie an upstream set in one answer is not sent with any later
    request, whoever makes it: the sidecar keeps no state between calls, and
    an agent's own cookies are never sent either (fails before the fix: the
    daemon's shared httpx client kept a cookie jar)."""
    # contract §9: credentials and cookies stay out of upstream requests
    set_cookie = Reply(200, headers=[("set-cookie", "session=agent-a; Path=/")])

    async def body(client: ProviderClient, _: FakeSleep) -> list[Answer]:
        return [await client.call(request()), await client.call(request())]

    with serving(set_cookie, Reply(200)) as up:
        first, _ = run(body, up.base_url)
        assert len(up.seen) == 2
    assert ("set-cookie", "session=agent-a; Path=/") in first.headers
    assert "cookie" not in up.seen[1].headers
