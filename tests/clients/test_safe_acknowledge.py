"""The safe call acknowledges a fresh result with its commit: a new key costs
PrepareTool and CommitTool, not a third request (and a third durable write)
for AcknowledgeRecovery; against a daemon that does not acknowledge with the
commit, the safe call still acknowledges on its own."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from effectd_client import AsyncClient, AsyncRun, Client, Run, ToolCall
from sidecar.testing import RunningDaemon
from tests.clients.flaky_proxy import FlakyProxy, flaky_proxy


@pytest.fixture
def proxy(daemon: RunningDaemon) -> Iterator[FlakyProxy]:
    with flaky_proxy(daemon.target) as p:
        yield p


def test_a_fresh_result_is_acknowledged_with_its_commit(
    proxy: FlakyProxy, client: Client
) -> None:
    """Two requests for a new key, and the result is acknowledged (fails
    before the commit carried the acknowledgement: AcknowledgeRecovery was
    a third request)."""
    with Client(proxy.target) as via:
        tool = Run(via, "run-ack").tool("t")(lambda x: {"x": x})
        assert tool.at("c")(1) == {"x": 1}

        @Run(via, "run-ack").tool("fail")
        def fail() -> None:
            raise ValueError("no")

        with pytest.raises(ValueError, match="no"):
            fail.at("e")()
    assert proxy.calls == ["PrepareTool", "CommitTool"] * 2
    assert client.get_tool_call("run-ack", "c").acknowledged
    assert client.get_tool_call("run-ack", "e").acknowledged


def test_the_async_run_acknowledges_with_its_commit(
    proxy: FlakyProxy, client: Client
) -> None:
    """The same for `AsyncRun`."""

    async def scenario() -> None:
        async with AsyncClient(proxy.target) as via:

            async def tool(x: int) -> dict[str, int]:
                return {"x": x}

            safe = AsyncRun(via, "run-aack").tool("t")(tool)
            assert await safe.at("c")(1) == {"x": 1}

    asyncio.run(scenario())
    assert proxy.calls == ["PrepareTool", "CommitTool"]
    assert client.get_tool_call("run-aack", "c").acknowledged


class _OlderDaemon(Client):
    """A client whose commits are answered as by a daemon that predates the
    commit's acknowledgement: the option is not sent."""

    def commit_tool(self, *args: Any, **kwargs: Any) -> ToolCall:
        kwargs["acknowledge"] = False
        return super().commit_tool(*args, **kwargs)


def test_a_commit_that_did_not_acknowledge_is_acknowledged_apart(
    proxy: FlakyProxy, client: Client
) -> None:
    """The answer says not acknowledged: AcknowledgeRecovery follows."""
    with _OlderDaemon(proxy.target) as via:
        assert Run(via, "run-old").tool("t")(lambda: 1).at("c")() == 1
    assert proxy.calls == ["PrepareTool", "CommitTool", "AcknowledgeRecovery"]
    assert client.get_tool_call("run-old", "c").acknowledged


def test_acknowledge_false_does_not_acknowledge_with_the_commit(
    proxy: FlakyProxy, client: Client
) -> None:
    """With `acknowledge=False` the commit leaves the result unacknowledged."""
    with Client(proxy.target) as via:
        assert Run(via, "run-no", acknowledge=False).tool("t")(lambda: 1).at("c")() == 1
    assert proxy.calls == ["PrepareTool", "CommitTool"]
    assert not client.get_tool_call("run-no", "c").acknowledged
