"""The real openai and anthropic SDKs at their default settings through the
transports: the SDK's own timeout is the call's deadline, and every outcome
the sidecar decided reaches the upstream exactly as often as the sidecar
decided, whatever the SDK's own retries (a real daemon on a Unix socket, a
scripted upstream on 127.0.0.1 that counts the requests it gets)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import anthropic
import grpc
import httpx
import httpx2
import openai
import pytest

from effectd_client import (
    AsyncEffectdTransport,
    EffectdTransport,
    Httpx2EffectdTransport,
)
from effectd_client import _provider as wire
from sidecar.errors import (
    EffectdError,
    RetryBudgetExhausted,
    RouteNotAllowed,
    UpstreamDeadlineExceeded,
    UpstreamFailed,
    UpstreamUnavailable,
)
from sidecar.rpc.errors import to_status
from tests.clients.fake_provider import anthropic_events, openai_chunks, proxied
from tests.provider.upstream import Reply

pytestmark = pytest.mark.timeout(60)

StatusError = openai.APIStatusError | anthropic.APIStatusError
SDKS = ("openai-httpx", "openai-httpx2", "anthropic")
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [
    {"role": "user", "content": "hi"}
]


def _openai(target: str, flavour: str, options: dict[str, Any]) -> openai.OpenAI:
    """openai 3 takes an httpx.Client at run time though it is typed for an
    httpx2.Client only: hence the cast."""
    http: httpx.Client | httpx2.Client
    if flavour == "httpx":
        http = httpx.Client(transport=EffectdTransport(target, route="openai"))
    else:
        http = httpx2.Client(transport=Httpx2EffectdTransport(target, route="openai"))
    return openai.OpenAI(
        base_url="http://effectd/v1",
        api_key="sk-client-never-sent",
        http_client=cast("httpx2.Client", http),
        **options,
    )


def _anthropic(target: str, options: dict[str, Any]) -> anthropic.Anthropic:
    http = httpx2.Client(transport=Httpx2EffectdTransport(target, route="anthropic"))
    return anthropic.Anthropic(
        base_url="http://effectd",
        api_key="sk-ant-client-never-sent",
        http_client=http,
        **options,
    )


def _call(
    sdk: str, target: str, *, stream: bool = False, timeout: float | None = None
) -> None:
    """One SDK call at the SDK's default `max_retries` (2, asserted)."""
    options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    if sdk.startswith("openai"):
        with _openai(target, sdk.removeprefix("openai-"), options) as llm:
            assert llm.max_retries == openai.DEFAULT_MAX_RETRIES == 2
            if stream:
                chunks = llm.chat.completions.create(
                    model="gpt-test", messages=MESSAGES, stream=True
                )
                list(chunks)
            else:
                llm.chat.completions.create(model="gpt-test", messages=MESSAGES)
        return
    with _anthropic(target, options) as claude:
        assert claude.max_retries == anthropic.DEFAULT_MAX_RETRIES == 2
        claude.messages.create(
            model="claude-test",
            max_tokens=16,
            messages=[{"role": "user", "content": "hi"}],
            stream=stream,
        )


def _ask(
    sdk: str, target: str, *, stream: bool = False, timeout: float | None = None
) -> StatusError:
    """The status error one SDK call ends with."""
    with pytest.raises((openai.APIStatusError, anthropic.APIStatusError)) as caught:
        _call(sdk, target, stream=stream, timeout=timeout)
    return cast("StatusError", caught.value)


@pytest.mark.parametrize("stream", [False, True], ids=["call", "stream"])
@pytest.mark.parametrize("sdk", SDKS)
def test_the_sdks_timeout_is_the_calls_deadline(
    short_tmp: Path, sdk: str, stream: bool
) -> None:
    """An SDK made with `timeout=1` against an upstream that never answers:
    the deadline of ProviderCall or ProviderStream is the SDK's 1 s, the
    upstream request is closed when it passes, and the SDK gets the sidecar's
    504 without retrying it (issue 10 item 19: fails before the fix: a call
    waited for the daemon's default deadline, then the SDK sent it twice
    more; a stream, which has none, hung until the test's timeout)."""
    # ADR-010 D4 "obeying ... the deadline"; provider-retries §10.1
    with proxied(short_tmp, Reply(hang=True), default_deadline=4.0) as (target, up):
        error = _ask(sdk, target, stream=stream, timeout=1.0)
        assert up.wait_until(lambda: up.disconnects == 1)
        assert len(up.seen) == 1
    assert error.status_code == 504
    assert error.response.headers["x-should-retry"] == "false"
    assert error.response.headers["x-effectd-reason"] in {
        "UPSTREAM_DEADLINE_EXCEEDED",
        "DEADLINE_EXCEEDED",
    }


@pytest.mark.parametrize("sdk", SDKS)
def test_a_committed_stream_ends_at_the_sdks_deadline(
    short_tmp: Path, sdk: str
) -> None:
    """A stream whose upstream stalls after its first event ends when the
    SDK's `timeout=1` passes: the events before arrive, then the stream's
    error (openai wraps it as a connection error; never retried), and the
    upstream request is closed (issue 10 item 19: fails before the fix: a
    stream brought no deadline, so it hung until the test's timeout)."""
    # provider-retries §10.5 S3: the deadline covers a whole stream
    events = openai_chunks("a")[:2] if sdk.startswith("openai") else None
    events = events or anthropic_events("a")[:2]
    reply = Reply(events=events, stall=True)
    with (
        proxied(short_tmp, reply, default_deadline=4.0) as (target, up),
        pytest.raises((openai.APIConnectionError, httpx2.RemoteProtocolError)),
    ):
        _read_stream(sdk, target, timeout=1.0)
    assert up.wait_until(lambda: up.disconnects == 1)
    assert len(up.seen) == 1


def _read_stream(sdk: str, target: str, *, timeout: float) -> None:
    options = {"timeout": timeout}
    if sdk.startswith("openai"):
        with _openai(target, sdk.removeprefix("openai-"), options) as llm:
            chunks = llm.chat.completions.create(
                model="gpt-test", messages=MESSAGES, stream=True
            )
            list(chunks)
        return
    with _anthropic(target, options) as claude:
        events = claude.messages.create(
            model="claude-test",
            max_tokens=16,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
        )
        list(events)


def test_the_async_transport_takes_the_deadline_too(short_tmp: Path) -> None:
    """`AsyncEffectdTransport` under `openai.AsyncOpenAI(timeout=1)`: the same
    deadline, one upstream request, closed (issue 10 item 19: fails before
    the fix, as above)."""

    async def main(target: str) -> StatusError:
        http = httpx.AsyncClient(
            transport=AsyncEffectdTransport(target, route="openai")
        )
        async with openai.AsyncOpenAI(
            base_url="http://effectd/v1",
            api_key="sk-client-never-sent",
            http_client=cast("httpx2.AsyncClient", http),
            timeout=1.0,
        ) as llm:
            with pytest.raises(openai.APIStatusError) as caught:
                await llm.chat.completions.create(model="gpt-test", messages=MESSAGES)
        return caught.value

    with proxied(short_tmp, Reply(hang=True), default_deadline=4.0) as (target, up):
        error = asyncio.run(main(target))
        assert up.wait_until(lambda: up.disconnects == 1)
        assert len(up.seen) == 1
    assert error.status_code == 504


# (effect of the routes, the upstream's script, stream?, upstream requests the
# sidecar decides on: 1 + its retries)
DECIDED = {
    "side-effect-reset": ("side-effect", Reply(reset=True), False, 1),
    "side-effect-eof-before-first-event": (
        "side-effect",
        Reply(events=[], break_off=True),
        True,
        1,
    ),
    "side-effect-502": ("side-effect", Reply(502), False, 1),
    "inference-reset": ("inference", Reply(reset=True), False, 3),
    "inference-503": ("inference", Reply(503), False, 3),
}


@pytest.mark.parametrize("case", DECIDED)
@pytest.mark.parametrize("sdk", SDKS)
def test_sdk_default_retries_never_repeat_the_sidecars_decision(
    short_tmp: Path, sdk: str, case: str
) -> None:
    """With the SDK's default `max_retries=2`, the upstream gets exactly the
    requests the sidecar decided on (the answer's `x-effectd-attempts`): a
    side-effect POST without an answer once, a default route's retried one
    three times, never three times that (issue 10 item 20: fails before the fix: the
    sidecar's failure was raised as an httpx error, which the SDKs retry)."""
    # ADR-010 D1, D4; provider-retries §11 item 3
    effect, reply, stream, expected = DECIDED[case]
    with proxied(short_tmp, reply, effect=effect) as (target, up):
        error = _ask(sdk, target, stream=stream)
        seen = len(up.seen)
    headers = error.response.headers
    assert headers["x-should-retry"] == "false"
    assert seen == int(headers["x-effectd-attempts"]) == expected
    assert [s.headers["x-stainless-retry-count"] for s in up.seen] == ["0"] * seen


def _as_before(exc: grpc.RpcError) -> wire.Answer:
    """The transport's old answer to a call the sidecar ended without an
    upstream answer: an httpx error."""
    raise wire.failure(exc)


@pytest.mark.parametrize("sdk", SDKS)
def test_negative_control_a_raised_decision_is_sent_again_by_the_sdk(
    short_tmp: Path, sdk: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: with the sidecar's decision raised as an httpx error
    (the old behaviour) the SDK's own retries send the side-effect POST to the
    upstream three times, so the count above would catch it."""
    monkeypatch.setattr(wire, "decided", _as_before)
    effect, reply, stream, decided = DECIDED["side-effect-reset"]
    with (
        proxied(short_tmp, reply, effect=effect) as (target, up),
        pytest.raises((openai.APIConnectionError, anthropic.APIConnectionError)),
    ):
        _call(sdk, target, stream=stream)
    assert len(up.seen) == 3 != decided


class _RpcError(grpc.RpcError):
    """A failed call as the daemon would end it."""

    def __init__(
        self,
        code: grpc.StatusCode,
        metadata: Sequence[tuple[str, str | bytes]] = (),
    ) -> None:
        self._code, self._metadata = code, tuple(metadata)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "why"

    def trailing_metadata(self) -> Any:
        return self._metadata


def _rpc(error: EffectdError) -> _RpcError:
    status = to_status(error)
    return _RpcError(status.code, status.trailing_metadata)


META = {"route": "openai", "attempts": "3", "stopReason": "max_retries"}


@pytest.mark.parametrize(
    ("error", "status", "extra"),
    [
        (_rpc(UpstreamUnavailable("down", META)), 502, {"x-effectd-attempts": "3"}),
        (_rpc(UpstreamDeadlineExceeded("late", META)), 504, {}),
        (
            _rpc(RetryBudgetExhausted("no credit", META, 1.5)),
            503,
            {"retry-after-ms": "1500"},
        ),
        # The caller's deadline passed first: it covered every attempt.
        (_RpcError(grpc.StatusCode.DEADLINE_EXCEEDED), 504, {}),
    ],
)
def test_the_sidecars_decisions_are_answers(
    error: _RpcError, status: int, extra: dict[str, str]
) -> None:
    """A call the sidecar ended without an upstream answer is an HTTP answer
    with `x-should-retry: false`, the reason and the attempts."""
    answer = wire.decided(error)
    headers = dict(answer.headers)
    assert answer.status == status
    assert headers["x-should-retry"] == "false"
    assert headers.items() >= extra.items()
    assert answer.body is not None
    assert b'"message": "effectd: ' in answer.body


@pytest.mark.parametrize(
    "error",
    [
        _rpc(RouteNotAllowed("no route", {"route": "x"})),
        _RpcError(grpc.StatusCode.UNAVAILABLE),  # no daemon
    ],
)
def test_what_never_reached_the_upstream_is_still_raised(error: _RpcError) -> None:
    """A refusal or an unreachable daemon decided nothing about the upstream:
    raised, as an httpx ConnectError by the flavours."""
    with pytest.raises(wire.Failed):
        wire.decided(error)


def test_every_failure_without_an_upstream_answer_is_mapped() -> None:
    """Every reason of a provider call ended without an HTTP answer has its
    status, so no new one is raised (and retried by an SDK) by omission."""
    reasons = {c.reason for c in UpstreamFailed.__subclasses__()}
    assert reasons
    assert reasons <= wire.DECIDED.keys()


@pytest.mark.parametrize(
    ("extensions", "deadline"),
    [
        ({"timeout": {"connect": 5.0, "read": 3, "write": 600, "pool": 600}}, 3.0),
        ({"timeout": {"connect": 5.0, "read": None}}, None),
        ({"timeout": None}, None),
        ({}, None),
        ({"timeout": {"read": True}}, None),
        ({"timeout": {"read": float("inf")}}, None),
    ],
)
def test_the_deadline_is_the_requests_read_timeout(
    extensions: dict[str, Any], deadline: float | None
) -> None:
    """The read timeout of the request's `timeout` extension, when a number."""
    assert wire.read_timeout(extensions) == deadline


@pytest.mark.parametrize(
    ("configured", "requested", "deadline"),
    [(None, None, None), (None, 3.0, 3.0), (10.0, None, 10.0), (2.0, 3.0, 2.0)],
)
def test_the_transports_timeout_bounds_the_requests(
    configured: float | None, requested: float | None, deadline: float | None
) -> None:
    """The transport's `timeout` only lowers a request's deadline."""
    options = wire.options("openai", configured, None, ())
    assert options.deadline(requested) == deadline
