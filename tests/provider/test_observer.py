"""The provider client's seams and values: an observer injected at
construction sees every step, attempts are recorded frozen, and the
provider itself checks a request before anything is sent."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sidecar.errors import InvalidArgument
from sidecar.provider.client import ProviderClient
from sidecar.provider.messages import Answer, Attempt, Events, StreamEnd
from sidecar.provider.observer import RetryDetails, Stop
from tests.provider.support import FakeSleep, request, run
from tests.provider.upstream import Reply, serving


class Recording:
    """An observer that keeps what it was told, in order."""

    def __init__(self, sleep: list[float] | None = None) -> None:
        self.steps: list[tuple[str, Any]] = []
        self._slept = sleep

    def attempt_started(self, route: str) -> None:
        self.steps.append(("started", route))

    def attempt_ended(self, route: str, attempt: Attempt) -> None:
        self.steps.append(("ended", attempt))

    def retry_denied(self, route: str) -> None:
        self.steps.append(("denied", route))

    def retry_scheduled(self, details: RetryDetails) -> None:
        slept = None if self._slept is None else len(self._slept)
        self.steps.append(("scheduled", (details, slept)))

    def call_ended(self, route: str, stop: Stop) -> None:
        self.steps.append(("stop", stop))

    def call_cancelled(self, route: str) -> None:
        self.steps.append(("cancelled", route))


def test_the_observer_sees_each_step_before_the_sleep() -> None:
    """A 500 then a 200: two attempts started and ended, one retry scheduled
    before its sleep with the wait the attempt records, then SUCCEEDED
    (issue 11 item 2: fails before the fix: no observer could be given)."""
    # provider-retries §10.8; stamina's retry hook is called before the sleep
    slept: list[float] = []
    seen = Recording(slept)

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def body(client: ProviderClient, _: FakeSleep) -> Answer:
        return await client.call(request())

    with serving(Reply(500), Reply(200)) as up:
        answer = run(body, up.base_url, sleep=sleep, observer=seen)
    kinds = [kind for kind, _ in seen.steps]
    assert kinds == ["started", "ended", "scheduled", "started", "ended", "stop"]
    first, second = answer.attempts
    assert seen.steps[1] == ("ended", first)
    details, slept_before = seen.steps[2][1]
    assert slept_before == 0
    assert details == RetryDetails(
        route="up",
        attempt=first,
        wait_for=first.wait,
        waited_so_far=first.wait,
        hint=None,
        transparent=False,
        stream=False,
    )
    assert slept == [first.wait]
    assert seen.steps[4] == ("ended", second)
    assert seen.steps[5] == ("stop", Stop.SUCCEEDED)


def test_a_stream_reports_its_end_when_the_stream_closes() -> None:
    """A stream's pre-commit retry is reported as a stream retry, and its
    stop only when the forwarded stream has ended."""
    # provider-retries §10.5, §10.8
    seen = Recording()
    script = (Reply(503), Reply(events=[b"data: one\n\n", b"data: two\n\n"]))

    async def body(client: ProviderClient, _: FakeSleep) -> list[object]:
        items: list[object] = []
        async for item in client.stream(request()):
            if isinstance(item, Events):
                items.append([kind for kind, _ in seen.steps])
            items.append(item)
        return items

    with serving(*script) as up:
        items = run(body, up.base_url, observer=seen)
    details, _ = seen.steps[2][1]
    assert details.stream
    before_end = [i for i in items if isinstance(i, list)]
    assert all("stop" not in kinds for kinds in before_end)
    assert seen.steps[-1] == ("stop", Stop.SUCCEEDED)
    assert isinstance(items[-1], StreamEnd)


def test_attempts_are_recorded_frozen() -> None:
    """An attempt handed out cannot be changed afterwards (issue 11 item 2:
    fails before the fix: the loop mutated attempts after recording them)."""
    with serving(Reply(500), Reply(200)) as up:
        answer = run(lambda c, _: c.call(request()), up.base_url)
    with pytest.raises(dataclasses.FrozenInstanceError):
        answer.attempts[0].wait = 0.0  # type: ignore[misc]


@pytest.mark.parametrize("name", ["Authorization", "x-injected", "Connection"])
def test_the_provider_refuses_headers_it_or_the_route_sets(name: str) -> None:
    """The provider itself, not only the gRPC boundary, refuses a request
    that sets the route's credential or injected header, or a hop-by-hop
    one, and sends nothing (issue 11 item 2: fails before the fix: the
    client dropped or sent them)."""
    # contract §9, §11.1
    headers = {"x-injected": "yes"}

    async def body(client: ProviderClient, _: FakeSleep) -> Answer:
        return await client.call(request(headers=((name, "agent's"),)))

    with serving(Reply(200)) as up:
        with pytest.raises(InvalidArgument) as caught:
            run(body, up.base_url, headers=headers)
        assert not up.seen
    assert [v.field for v in caught.value.violations] == ["headers[0].name"]
