"""The httpx transports with the real `openai` and `anthropic` SDKs: a real
daemon on a Unix socket, a fake provider on 127.0.0.1, real clock and sleep."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import cast

import anthropic
import httpx
import httpx2
import openai
import pytest

from effectd_client import (
    AsyncEffectdTransport,
    AsyncHttpx2EffectdTransport,
    EffectdTransport,
    Httpx2EffectdTransport,
)
from effectd_client._provider import wants_stream
from tests.clients.fake_provider import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    anthropic_events,
    anthropic_message,
    openai_chunks,
    openai_completion,
    proxied,
    rate_limited,
)
from tests.provider.upstream import Reply, Seen

pytestmark = pytest.mark.timeout(30)
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [
    {"role": "user", "content": "hi"}
]


def _openai(
    target: str, max_retries: int = 0, *, flavour: str = "httpx"
) -> openai.OpenAI:
    """openai 3 accepts an httpx.Client at run time though it is typed to
    take an httpx2.Client only: hence the cast."""
    http: httpx.Client | httpx2.Client
    if flavour == "httpx":
        http = httpx.Client(transport=EffectdTransport(target, route="openai"))
    else:
        http = httpx2.Client(transport=Httpx2EffectdTransport(target, route="openai"))
    return openai.OpenAI(
        base_url="http://effectd/v1",
        api_key="sk-client-never-sent",
        http_client=cast("httpx2.Client", http),
        max_retries=max_retries,
    )


def _anthropic(target: str) -> anthropic.Anthropic:
    transport = Httpx2EffectdTransport(target, route="anthropic")
    return anthropic.Anthropic(
        base_url="http://effectd",
        api_key="sk-ant-client-never-sent",
        http_client=httpx2.Client(transport=transport),
        max_retries=0,
    )


def _openai_injected(seen: Seen) -> None:
    assert seen.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert "never-sent" not in json.dumps(seen.headers)


def _anthropic_injected(seen: Seen) -> None:
    assert seen.headers["x-api-key"] == ANTHROPIC_KEY
    assert "authorization" not in seen.headers
    assert "never-sent" not in json.dumps(seen.headers)


def test_the_stream_rule() -> None:
    """ProviderStream for Accept: text/event-stream or a JSON body with
    "stream": true; ProviderCall for anything else."""
    assert wants_stream([("Accept", "text/event-stream")], b"")
    assert wants_stream([], b'{"model": "m", "stream": true}')
    assert not wants_stream([], b'{"stream": false}')
    assert not wants_stream([], b'{"stream": "yes"}')
    assert not wants_stream([("accept", "application/json")], b"[1]")
    assert not wants_stream([], b"{not json")


@pytest.mark.parametrize("flavour", ["httpx", "httpx2"])
def test_openai_chat_completion(short_tmp: Path, flavour: str) -> None:
    with proxied(short_tmp, openai_completion("Hello there")) as (target, up):
        with _openai(target, flavour=flavour) as llm:
            raw = llm.chat.completions.with_raw_response.create(
                model="gpt-test", messages=MESSAGES
            )
            completion = raw.parse()
        assert completion.choices[0].message.content == "Hello there"
        assert raw.headers["x-should-retry"] == "false"
        assert raw.headers["x-effectd-attempts"] == "1"
        assert raw.headers["x-request-id"] == "req-1"
        [seen] = up.seen
        assert (seen.method, seen.path) == ("POST", "/v1/chat/completions")
        assert json.loads(seen.body)["messages"] == MESSAGES
        _openai_injected(seen)


def test_openai_streaming_chat_completion(short_tmp: Path) -> None:
    reply = Reply(events=openai_chunks("Hel", "lo", "!"))
    with proxied(short_tmp, reply) as (target, up), _openai(target) as llm:
        stream = llm.chat.completions.create(
            model="gpt-test", messages=MESSAGES, stream=True
        )
        with stream:
            chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert text == "Hello!"
        assert chunks[-1].choices[0].finish_reason == "stop"
        [seen] = up.seen
        assert json.loads(seen.body)["stream"] is True
        _openai_injected(seen)


def test_anthropic_messages_create(short_tmp: Path) -> None:
    with proxied(short_tmp, anthropic_message("Hi from Claude")) as (target, up):
        with _anthropic(target) as llm:
            message = llm.messages.create(
                model="claude-test",
                max_tokens=16,
                messages=[{"role": "user", "content": "hi"}],
            )
        block = message.content[0]
        assert isinstance(block, anthropic.types.TextBlock)
        assert block.text == "Hi from Claude"
        [seen] = up.seen
        assert (seen.method, seen.path) == ("POST", "/v1/messages")
        assert "anthropic-version" in seen.headers
        _anthropic_injected(seen)


def test_anthropic_streaming(short_tmp: Path) -> None:
    reply = Reply(events=anthropic_events("Hi ", "there"))
    with proxied(short_tmp, reply) as (target, up), _anthropic(target) as llm:
        stream = llm.messages.create(
            model="claude-test",
            max_tokens=16,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
        )
        with stream:
            events = list(stream)
        kinds = [e.type for e in events]
        # The sidecar drops the ping keep-alive.
        assert kinds == [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
        text = "".join(
            e.delta.text
            for e in events
            if isinstance(e, anthropic.types.RawContentBlockDeltaEvent)
            and isinstance(e.delta, anthropic.types.TextDelta)
        )
        assert text == "Hi there"
        _anthropic_injected(up.seen[0])


def test_a_429_is_retried_by_the_sidecar_not_the_sdk(short_tmp: Path) -> None:
    """retry-after-ms 50: the sidecar retries once; the SDK sees success."""
    script = (rate_limited(50), openai_completion("after the wait"))
    with proxied(short_tmp, *script) as (target, up), _openai(target) as llm:
        raw = llm.chat.completions.with_raw_response.create(
            model="gpt-test", messages=MESSAGES
        )
        assert raw.parse().choices[0].message.content == "after the wait"
        assert raw.headers["x-effectd-attempts"] == "2"
        assert len(up.seen) == 2
        # One logical SDK call: the SDK never retried itself.
        assert [s.headers["x-stainless-retry-count"] for s in up.seen] == ["0", "0"]
        for seen in up.seen:
            _openai_injected(seen)


def test_the_sdk_does_not_stack_retries_on_the_sidecars(short_tmp: Path) -> None:
    """Even an SDK left at max_retries=2 does not retry the sidecar's final
    429: the answer says x-should-retry: false (the upstream said true)."""
    with (
        proxied(short_tmp, rate_limited(50), max_retries=1) as (target, up),
        _openai(target, max_retries=2) as llm,
        pytest.raises(openai.RateLimitError) as caught,
    ):
        llm.chat.completions.create(model="gpt-test", messages=MESSAGES)
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert len(up.seen) == 2


def test_a_stream_is_retried_before_its_first_event(short_tmp: Path) -> None:
    """A 429 before the stream began is retried by the sidecar; a final 400
    reaches the SDK as its error, with the upstream's body."""
    bad = Reply(
        400,
        (("content-type", "application/json"),),
        b'{"type": "error", "error": {"type": "invalid_request_error",'
        b' "message": "max_tokens too large"}}',
    )
    script = (rate_limited(50), Reply(events=anthropic_events("ok")), bad)
    with proxied(short_tmp, *script) as (target, up), _anthropic(target) as llm:
        stream = llm.messages.create(
            model="claude-test",
            max_tokens=16,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
        )
        with stream:
            assert [e.type for e in stream][-1] == "message_stop"
        assert len(up.seen) == 2
        with pytest.raises(anthropic.BadRequestError, match="max_tokens too large"):
            llm.messages.create(
                model="claude-test",
                max_tokens=16,
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
            )
        assert len(up.seen) == 3


def test_a_stream_broken_after_commit_raises(short_tmp: Path) -> None:
    """The events before the break arrive; then httpx.RemoteProtocolError
    with the sidecar's explanation (the SDK wraps it), and nothing is retried."""
    reply = Reply(events=openai_chunks("Hel")[:2], break_off=True)
    with proxied(short_tmp, reply) as (target, up), _openai(target) as llm:
        stream = llm.chat.completions.create(
            model="gpt-test", messages=MESSAGES, stream=True
        )
        got: list[str] = []
        with stream, pytest.raises(openai.APIConnectionError) as caught:
            got.extend(c.choices[0].delta.content or "" for c in stream)
        assert got == ["", "Hel"]
        cause = caught.value.__cause__
        assert isinstance(cause, httpx.RemoteProtocolError)
        assert "after 2 events" in str(cause)
        assert "never retried" in str(cause)
        assert len(up.seen) == 1


def test_events_stream_through_as_they_arrive(short_tmp: Path) -> None:
    """The first event reaches the client while the upstream still holds the
    stream open; closing the response ends the upstream request."""
    reply = Reply(events=openai_chunks("a")[:1], stall=True)
    with (
        proxied(short_tmp, reply) as (target, up),
        httpx.Client(transport=EffectdTransport(target, route="openai")) as http,
    ):
        with http.stream(
            "POST",
            "http://effectd/v1/chat/completions",
            headers={"Accept": "text/event-stream", "Authorization": "Bearer x"},
            content=b"{}",
        ) as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream"
            assert response.headers["x-should-retry"] == "false"
            assert "x-effectd-attempts" not in response.headers
            first = next(response.iter_raw())
            assert first.startswith(b"data: {")
        assert up.wait_until(lambda: up.disconnects == 1)


def test_refusals_raise_an_httpx_error(short_tmp: Path) -> None:
    """A path outside the route never reaches the upstream."""
    with (
        proxied(short_tmp) as (target, up),
        httpx.Client(transport=EffectdTransport(target, route="openai")) as http,
        pytest.raises(httpx.ConnectError, match="ROUTE_NOT_ALLOWED"),
    ):
        http.get("http://effectd/admin")
    assert up.seen == []


def test_async_openai(short_tmp: Path) -> None:
    script = (openai_completion("async hello"), Reply(events=openai_chunks("x", "y")))

    async def main(target: str) -> tuple[str | None, str]:
        transport = AsyncEffectdTransport(target, route="openai")
        async with openai.AsyncOpenAI(
            base_url="http://effectd/v1",
            api_key="sk-client-never-sent",
            http_client=cast(
                "httpx2.AsyncClient", httpx.AsyncClient(transport=transport)
            ),
            max_retries=0,
        ) as llm:
            done = await llm.chat.completions.create(
                model="gpt-test", messages=MESSAGES
            )
            stream = await llm.chat.completions.create(
                model="gpt-test", messages=MESSAGES, stream=True
            )
            parts = [c.choices[0].delta.content or "" async for c in stream]
            return done.choices[0].message.content, "".join(parts)

    with proxied(short_tmp, *script) as (target, up):
        assert asyncio.run(main(target)) == ("async hello", "xy")
        assert len(up.seen) == 2
        for seen in up.seen:
            _openai_injected(seen)


def test_async_anthropic_on_httpx2(short_tmp: Path) -> None:
    script = (anthropic_message("async"), Reply(events=anthropic_events("s")))

    async def main(target: str) -> list[str]:
        transport = AsyncHttpx2EffectdTransport(target, route="anthropic")
        async with anthropic.AsyncAnthropic(
            base_url="http://effectd",
            api_key="sk-ant-client-never-sent",
            http_client=httpx2.AsyncClient(transport=transport),
            max_retries=0,
        ) as llm:
            message = await llm.messages.create(
                model="claude-test",
                max_tokens=16,
                messages=[{"role": "user", "content": "hi"}],
            )
            stream = await llm.messages.create(
                model="claude-test",
                max_tokens=16,
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
            )
            kinds = [e.type async for e in stream]
            return [message.type, *kinds]

    with proxied(short_tmp, *script) as (target, up):
        kinds = asyncio.run(main(target))
        assert kinds[0] == "message"
        assert kinds[1] == "message_start"
        assert kinds[-1] == "message_stop"
        for seen in up.seen:
            _anthropic_injected(seen)
