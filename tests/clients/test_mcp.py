"""effectd_client.contrib.mcp: every tools/call of a real MCP server (the `mcp`
package's own server, over stdio and Streamable HTTP) runs at most once."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any, TypeVar

import pytest
from mcp import ClientSession
from mcp.types import CallToolResult

from effectd_client import (
    ApprovalPending,
    AsyncClient,
    AsyncRun,
    Channel,
    Effect,
    ReconciliationNeeded,
    State,
)
from effectd_client.contrib.mcp import (
    KEY_META,
    MCP_TOOL_ERROR,
    LedgeredSession,
    McpConnectionLost,
    McpPolicy,
    SessionInvalidated,
    unwrapped,
)
from sidecar.ledger.channel_results import result_fault
from sidecar.ledger.model import Channel as LedgerChannel
from sidecar.ledger.model import Result
from sidecar.testing import RunningDaemon
from tests.clients.mcp.servers import (
    TRANSPORTS,
    connect,
    executions,
    http_server,
    kill_server,
    wait_for,
)
from tests.ledger.test_channel_results import ACCEPTED
from tests.support.imports import imported_by

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=TRANSPORTS)
def server(request: pytest.FixtureRequest, short_tmp: Path) -> Iterator[Server]:
    """A counter server's state directory and transport (port for HTTP)."""
    state = short_tmp / "mcp"
    state.mkdir()
    with ExitStack() as stack:
        port = 0
        if request.param == "http":
            port = stack.enter_context(http_server(state))
        yield Server(request.param, state, port)


class Server:
    def __init__(self, transport: str, state: Path, port: int) -> None:
        self.transport, self.state, self.port = transport, state, port

    def connect(self) -> Any:
        return connect(self.transport, self.state, self.port)

    def executions(self, tool: str) -> int:
        return executions(self.state, tool)


def run_with(daemon: RunningDaemon, body: Callable[[AsyncClient], Awaitable[T]]) -> T:
    async def main() -> T:
        async with AsyncClient(daemon.target) as client:
            return await body(client)

    return asyncio.run(main())


def text_of(result: CallToolResult) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


def test_a_repeated_call_returns_the_stored_result(
    daemon: RunningDaemon, server: Server
) -> None:
    """The same call id, even on a new connection, is answered from the ledger:
    the server runs the tool once."""

    async def body(effectd: AsyncClient) -> None:
        async with server.connect() as session:
            tools = LedgeredSession(session, AsyncRun(effectd, "r"), server="counter")
            first = await tools.call_tool("send", {"to": "ann"}, call_id="tc-1")
        async with server.connect() as session:
            tools = LedgeredSession(session, AsyncRun(effectd, "r"), server="counter")
            again = await tools.call_tool("send", {"to": "ann"}, call_id="tc-1")
        assert again == first
        call = await effectd.get_tool_call("r", "tc-1")
        assert (call.tool_name, call.channel) == ("mcp://counter/send", Channel.MCP)

    run_with(daemon, body)
    assert server.executions("send") == 1


@pytest.mark.slow
def test_an_agent_killed_between_commit_and_answer_gets_the_stored_result(
    daemon: RunningDaemon, server: Server
) -> None:
    """An agent process SIGKILLed after the commit, before its answer: the
    resumed agent's repeat returns the result the first one saw; count 1."""
    agent = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("mcp") / "agent.py"),
            daemon.target,
            str(server.state),
            server.transport,
            str(server.port),
            "run-k",
            "tc-7",
        ],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
    )
    try:
        wait_for((server.state / "committed").exists, "the commit")
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=30)
    seen = CallToolResult.model_validate_json((server.state / "committed").read_text())

    async def body(effectd: AsyncClient) -> CallToolResult:
        async with server.connect() as session:
            tools = LedgeredSession(
                session, AsyncRun(effectd, "run-k"), server="counter"
            )
            return await tools.call_tool("send", {"to": "ann"}, call_id="tc-7")

    assert run_with(daemon, body) == seen
    assert server.executions("send") == 1
    # The counter counts: the same request sent twice without the ledger.
    asyncio.run(_call_raw(server, "send", 2))
    assert server.executions("send") == 3


async def _call_raw(server: Server, tool: str, times: int) -> None:
    async with server.connect() as session:
        for _ in range(times):
            await session.call_tool(tool, {"to": "ann"})


def check_never_reissued(server: Server, tool: str) -> None:
    """The property: the tool ran once, however the connection ended."""
    count = server.executions(tool)
    if count != 1:
        raise AssertionError(f"{tool} ran {count} times")


async def _interrupted(
    server: Server, call: Callable[[ClientSession], Awaitable[Any]]
) -> BaseException:
    """Runs `call` on a new session and kills the server while its tool runs;
    returns what the call raised."""
    (server.state / "hold").touch()
    caught: BaseException | None = None
    with suppress(Exception):  # the transport's own teardown after the kill
        async with server.connect() as session:
            task = asyncio.ensure_future(call(session))
            for _ in range(600):
                if server.executions("slow_send") or task.done():
                    break
                await asyncio.sleep(0.05)
            kill_server(server.state)
            try:
                await task
            except Exception as exc:
                caught = exc
    (server.state / "hold").unlink()
    assert caught is not None, "the call did not fail"
    return caught


def _restart(server: Server, stack: ExitStack) -> None:
    if server.transport == "http":
        server.port = stack.enter_context(http_server(server.state))


@pytest.mark.slow
def test_a_server_killed_mid_call_leaves_the_call_unknown_and_never_resends_it(
    daemon: RunningDaemon, server: Server
) -> None:
    """Killed while its tool runs: UNKNOWN, the session invalidated, and
    neither the old session nor a reconnected one sends the call again."""

    async def body(effectd: AsyncClient) -> None:
        run = AsyncRun(effectd, "r")
        wrapped: list[LedgeredSession] = []

        async def call(session: ClientSession) -> Any:
            wrapped.append(LedgeredSession(session, run, server="counter"))
            return await wrapped[0].call_tool("slow_send", {"to": "bo"}, call_id="tc-2")

        error = await _interrupted(server, call)
        assert isinstance(error, McpConnectionLost)
        assert (await effectd.get_tool_call("r", "tc-2")).state is State.UNKNOWN
        assert wrapped[0].invalidated
        with pytest.raises(SessionInvalidated):
            await wrapped[0].call_tool("slow_send", {"to": "bo"}, call_id="tc-2")
        with ExitStack() as stack:
            _restart(server, stack)
            async with server.connect() as session:
                tools = LedgeredSession(session, run, server="counter")
                with pytest.raises(ReconciliationNeeded):
                    await tools.call_tool("slow_send", {"to": "bo"}, call_id="tc-2")

    run_with(daemon, body)
    check_never_reissued(server, "slow_send")


@pytest.mark.slow
def test_the_check_catches_a_naive_retry_that_resends_after_the_kill(
    server: Server,
) -> None:
    """Negative control: a wrapper that reconnects and sends the call again
    after a transport failure runs the tool twice, and the check says so."""

    async def naive() -> None:
        async def call(session: ClientSession) -> Any:
            return await session.call_tool("slow_send", {"to": "bo"})

        await _interrupted(server, call)
        with ExitStack() as stack:
            _restart(server, stack)
            async with server.connect() as session:
                await session.call_tool("slow_send", {"to": "bo"})

    asyncio.run(naive())
    with pytest.raises(AssertionError, match="ran 2 times"):
        check_never_reissued(server, "slow_send")


def test_annotations_do_not_downgrade_a_side_effect(
    daemon: RunningDaemon, server: Server
) -> None:
    """`send` claims read-only and idempotent: from an untrusted server it is
    still a SIDE_EFFECT (a trusted one is believed, the control); a tool
    pinned READ that says it is destructive is raised to SIDE_EFFECT."""
    pinned = McpPolicy.from_toml(
        '[servers.counter.tools.lookup]\neffect = "read"\n'
        '[servers.counter.tools.send]\neffect = "side-effect"\n'
    )
    trusted = McpPolicy.from_toml("[servers.counter]\ntrusted = true\n")

    async def body(effectd: AsyncClient) -> dict[str, Effect]:
        run = AsyncRun(effectd, "r")
        async with server.connect() as session:
            for policy, tool, call_id in (
                (McpPolicy(), "send", "untrusted"),
                (pinned, "send", "pinned"),
                (trusted, "send", "trusted"),
                (pinned, "lookup", "raised"),
            ):
                tools = LedgeredSession(session, run, server="counter", policy=policy)
                await tools.call_tool(tool, {"to": "x", "query": "q"}, call_id=call_id)
        return {
            c: (await effectd.get_tool_call("r", c)).effect
            for c in ("untrusted", "pinned", "trusted", "raised")
        }

    assert run_with(daemon, body) == {
        "untrusted": Effect.SIDE_EFFECT,
        "pinned": Effect.SIDE_EFFECT,
        "trusted": Effect.READ,
        "raised": Effect.SIDE_EFFECT,
    }


def test_a_call_the_policy_holds_for_approval_runs_once_approved(
    daemon: RunningDaemon, server: Server
) -> None:
    """ApprovalPending before an approver decides (the server not reached);
    after the approval the same call id runs once, and a repeat replays."""
    policy = McpPolicy.from_toml(
        "[servers.counter.tools.send]\nrequire_approval = true\n"
    )

    async def body(effectd: AsyncClient) -> None:
        async with server.connect() as session:
            tools = LedgeredSession(
                session, AsyncRun(effectd, "r"), server="counter", policy=policy
            )
            with pytest.raises(ApprovalPending) as pending:
                await tools.call_tool("send", {"to": "cy"}, call_id="tc-3")
            assert server.executions("send") == 0
            waiting = pending.value.call
            assert waiting.state is State.AWAITING_APPROVAL
            await effectd.decide_approval(
                "r",
                "tc-3",
                approve=True,
                approver="ops",
                reason="looks right",
                expected_revision=waiting.revision,
                input_fingerprint=waiting.input_fingerprint,
            )
            first = await tools.call_tool("send", {"to": "cy"}, call_id="tc-3")
            assert await tools.call_tool("send", {"to": "cy"}, call_id="tc-3") == first

    run_with(daemon, body)
    assert server.executions("send") == 1


def test_an_is_error_result_is_committed_as_an_error_and_never_rerun(
    daemon: RunningDaemon, server: Server
) -> None:
    """A tool that ran and answered isError: committed ERROR MCP_TOOL_ERROR
    with the whole result; a repeat returns the same result, count 1."""

    async def body(effectd: AsyncClient) -> None:
        async with server.connect() as session:
            tools = LedgeredSession(session, AsyncRun(effectd, "r"), server="counter")
            first = await tools.call_tool("fail", {"to": "dee"}, call_id="tc-4")
            assert first.is_error
            assert await tools.call_tool("fail", {"to": "dee"}, call_id="tc-4") == first
        call = await effectd.get_tool_call("r", "tc-4")
        assert call.state is State.COMMITTED
        assert call.result is not None
        assert (call.result.ok, call.result.error_code) == (False, MCP_TOOL_ERROR)

    run_with(daemon, body)
    assert server.executions("fail") == 1


def test_an_idempotent_write_carries_its_key_in_meta(
    daemon: RunningDaemon, server: Server
) -> None:
    """A tool pinned IDEMPOTENT_WRITE receives `run_id:call_id` in `_meta`."""
    policy = McpPolicy.from_toml(
        '[servers.counter.tools.upsert]\neffect = "idempotent-write"\n'
    )

    async def body(effectd: AsyncClient) -> None:
        async with server.connect() as session:
            tools = LedgeredSession(
                session, AsyncRun(effectd, "r"), server="counter", policy=policy
            )
            await tools.call_tool("upsert", {"name": "eve"}, call_id="tc-5")

    run_with(daemon, body)
    meta = (server.state / "upsert.meta").read_text()
    assert f'"{KEY_META}": "r:tc-5"' in meta


def test_importing_the_client_does_not_import_mcp() -> None:
    """The extra is imported only by `effectd_client.contrib.mcp`."""
    assert imported_by("import effectd_client", ["mcp"]) == []


@pytest.mark.parametrize("found", ACCEPTED)
def test_what_reconcile_accepts_of_an_mcp_call_the_sdk_reads(found: Result) -> None:
    """Every result the daemon's rule lets an operator record for an MCP call
    is a CallToolResult of the SDK (another error than the tool's own is
    raised as `ToolFailed`, whatever it holds)."""
    assert result_fault(LedgerChannel.MCP, found) is None
    if found.payload is not None and found.error_code in ("", MCP_TOOL_ERROR):
        CallToolResult.model_validate_json(found.payload.data)


@pytest.mark.parametrize(
    ("stored", "text"),
    [("charged i-9", "charged i-9"), ({"charged": 9}, '{"charged": 9}')],
    ids=["string", "object"],
)
def test_a_stored_result_that_is_no_call_tool_result_reaches_the_caller_as_text(
    daemon: RunningDaemon, server: Server, stored: Any, text: str
) -> None:
    """A plain value stored for an MCP call (recorded before the daemon
    checked a reconciled result's shape) is returned as a CallToolResult
    with that text, never a validation error; the server is not called
    (issue 25 item 5: fails before the fix: a raw ValidationError, on every
    resume)."""

    async def body(effectd: AsyncClient) -> CallToolResult:
        p = await effectd.prepare_tool(
            "r",
            "tc-9",
            "mcp://counter/send",
            {"server": "counter", "tool": "send", "arguments": {"to": "ann"}},
            start=True,
            channel=Channel.MCP,
        )
        await effectd.commit_tool("r", "tc-9", p.call.attempt, stored)
        async with server.connect() as session:
            tools = LedgeredSession(session, AsyncRun(effectd, "r"), server="counter")
            return await tools.call_tool("send", {"to": "ann"}, call_id="tc-9")

    result = run_with(daemon, body)
    assert (text_of(result), result.is_error) == (text, False)
    assert server.executions("send") == 0


@pytest.mark.slow
def test_a_lost_connection_names_its_call_and_is_caught_as_itself(
    daemon: RunningDaemon, server: Server
) -> None:
    """Killed mid-call inside the transport's and session's blocks: with
    `unwrapped()` around them, `except McpConnectionLost` catches it (not an
    ExceptionGroup), and it names the run and the call to reconcile (issue
    25 item 15: fails before the fix: an ExceptionGroup, and no call id)."""

    async def body(effectd: AsyncClient) -> McpConnectionLost:
        (server.state / "hold").touch()
        try:
            with unwrapped():
                async with server.connect() as session:
                    tools = LedgeredSession(
                        session, AsyncRun(effectd, "r-lost"), server="counter"
                    )
                    sent = asyncio.ensure_future(
                        tools.call_tool("slow_send", {"to": "bo"}, call_id="tc-8")
                    )
                    await asyncio.to_thread(
                        wait_for, lambda: server.executions("slow_send"), "the call"
                    )
                    kill_server(server.state)
                    await sent
        except McpConnectionLost as lost:
            return lost
        finally:
            (server.state / "hold").unlink()
        raise AssertionError("the call did not fail")

    lost = run_with(daemon, body)
    assert (lost.run_id, lost.call_id) == ("r-lost", "tc-8")
    assert "call tc-8 of run r-lost" in str(lost)
    assert "effectd ctl show r-lost tc-8" in str(lost)
    check_never_reissued(server, "slow_send")


def test_unwrapped_lifts_one_ledger_error_and_leaves_other_groups() -> None:
    """One ledger exception among the transport's teardown errors is raised
    as itself; a group without one, or with two, is raised as it is."""
    lost = McpConnectionLost("lost", run_id="r", call_id="c")
    nested = BaseExceptionGroup(
        "session", [ExceptionGroup("transport", [lost, OSError("closed")])]
    )
    with pytest.raises(McpConnectionLost) as caught, unwrapped():
        raise nested
    assert caught.value is lost
    two = McpConnectionLost("too", run_id="r", call_id="d")
    for group in (
        ExceptionGroup("g", [OSError("closed")]),
        ExceptionGroup("g", [lost, two]),
    ):
        with pytest.raises(ExceptionGroup) as kept, unwrapped():
            raise group
        assert kept.value is group
