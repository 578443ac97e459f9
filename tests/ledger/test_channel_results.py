"""Which results a call's channel can return (`ledger.channel_results`), and
Reconcile refusing a result an MCP call's adapters could never return
(issue 25 item 5: fails before the fix: `"charged i-9"` was committed, and
the resumed MCP agent failed on it forever)."""

from __future__ import annotations

import dataclasses

import pytest

from sidecar.errors import InvalidArgument
from sidecar.ledger import operator_rules
from sidecar.ledger.channel_results import MCP_TOOL_ERROR, result_fault
from sidecar.ledger.fingerprint import result_digest
from sidecar.ledger.model import (
    Channel,
    Effect,
    Outcome,
    Payload,
    PayloadKind,
    Result,
    State,
    ToolCall,
)
from sidecar.ledger.operator_rules import ReconcileOrder
from tests.ledger.builders import answer, later, moment, refusal, unknown

TEXT = b'{"content": [{"type": "text", "text": "charged i-9"}], "isError": false}'


def result(body: bytes | None, outcome: Outcome = Outcome.OK, code: str = "") -> Result:
    payload = None if body is None else Payload(PayloadKind.JSON, body)
    digest = result_digest(outcome, payload, code, "")
    return Result(outcome, payload, code, "", digest)


ACCEPTED = [
    # The shapes the MCP adapters commit and return.
    pytest.param(result(TEXT), id="text"),
    pytest.param(result(b'{"content": []}'), id="no-content-blocks"),
    pytest.param(
        result(
            b'{"content": [{"type": "image", "data": "AA==", "mimeType": "image/png"},'
            b' {"type": "audio", "data": "AA==", "mimeType": "audio/wav"},'
            b' {"type": "resource_link", "uri": "file:///a", "name": "a"},'
            b' {"type": "resource", "resource": {"uri": "file:///b", "text": "b"}},'
            b' {"type": "resource", "resource": {"uri": "file:///c", "blob": "AA=="}}],'
            b' "structuredContent": {"charged": 9}, "_meta": {"k": 1}}'
        ),
        id="every-block",
    ),
    # A tool's own error answer, with or without the answer kept.
    pytest.param(
        result(
            b'{"content": [{"type": "text", "text": "no"}], "isError": true}',
            Outcome.ERROR,
            MCP_TOOL_ERROR,
        ),
        id="tool-error",
    ),
    pytest.param(result(None, Outcome.ERROR, MCP_TOOL_ERROR), id="tool-error-bare"),
    # Any other error: the adapters raise it as the stored error.
    pytest.param(result(b'"boom"', Outcome.ERROR, "E_PSP"), id="other-error"),
]

REFUSED = [
    pytest.param(result(b'"charged i-9"'), "is a string, not an object", id="string"),
    pytest.param(result(b'{"charged": 9}'), "content is not a list", id="no-content"),
    pytest.param(result(None), "not JSON", id="no-payload"),
    pytest.param(
        Result(Outcome.OK, Payload(PayloadKind.RAW, b"x"), "", "", "sha256:x"),
        "not JSON",
        id="raw",
    ),
    pytest.param(
        result(b'{"content": ["charged"]}'), "content[0] is a string", id="bare-block"
    ),
    pytest.param(
        result(b'{"content": [{"text": "x"}]}'), "has type null", id="untyped-block"
    ),
    pytest.param(
        result(b'{"content": [{"type": "text"}]}'), "needs text", id="textless"
    ),
    pytest.param(
        result(b'{"content": [{"type": "image", "data": "AA=="}]}'),
        "needs mimeType",
        id="image-without-type",
    ),
    pytest.param(
        result(b'{"content": [{"type": "resource", "resource": {"uri": "u"}}]}'),
        "needs a resource object",
        id="empty-resource",
    ),
    pytest.param(
        result(b'{"content": [], "isError": "no"}'), "isError is not", id="is-error"
    ),
    pytest.param(
        result(b'{"content": [], "isError": true}'),
        f"code {MCP_TOOL_ERROR}",
        id="ok-with-is-error",
    ),
    pytest.param(result(b'{"content": [], "_meta": 1}'), "_meta", id="meta"),
    pytest.param(
        result(b'"no"', Outcome.ERROR, MCP_TOOL_ERROR), "a string", id="tool-error"
    ),
]


@pytest.mark.parametrize("found", ACCEPTED)
def test_an_mcp_call_returns_a_call_tool_result(found: Result) -> None:
    """What the MCP adapters return is a result of an MCP call."""
    assert result_fault(Channel.MCP, found) is None


@pytest.mark.parametrize(("found", "why"), REFUSED)
def test_anything_else_is_not_an_mcp_calls_result_and_says_the_shape(
    found: Result, why: str
) -> None:
    """The fault names what is wrong and shows the CallToolResult wanted."""
    fault = result_fault(Channel.MCP, found)
    assert fault is not None
    assert why in fault
    assert '{"content": [{"type": "text", "text": "..."}], "isError": false}' in fault


@pytest.mark.parametrize(
    "channel", [c for c in Channel if c is not Channel.MCP], ids=lambda c: c.name
)
@pytest.mark.parametrize(("found", "why"), REFUSED)
def test_the_other_channels_return_any_result(
    channel: Channel, found: Result, why: str
) -> None:
    assert result_fault(channel, found) is None


def _mcp_unknown() -> ToolCall:
    return dataclasses.replace(unknown(Effect.SIDE_EFFECT), channel=Channel.MCP)


def _order(call: ToolCall, found: Result) -> ReconcileOrder:
    return ReconcileOrder(call.revision, found, "olga", "found it", "PSP ref 7")


def test_reconcile_refuses_a_result_the_mcp_adapters_could_never_return() -> None:
    """`ctl reconcile RUN CALL --result '"charged i-9"'` of an MCP call:
    INVALID_ARGUMENT on `result`, nothing changes."""
    call = _mcp_unknown()
    step = operator_rules.reconcile(
        call, later(moment(), 1), _order(call, result(b'"charged i-9"'))
    )
    refused = refusal(step, InvalidArgument)
    [violation] = refused.violations
    assert violation.field == "result"
    assert "CallToolResult" in violation.description
    assert step.call == call


def test_reconcile_commits_a_call_tool_result_of_an_mcp_call() -> None:
    call = _mcp_unknown()
    step = operator_rules.reconcile(
        call, later(moment(), 1), _order(call, result(TEXT))
    )
    assert answer(step).call.state is State.COMMITTED


def test_reconcile_of_a_tool_call_takes_any_result() -> None:
    call = unknown(Effect.SIDE_EFFECT)
    found = result(b'"charged i-9"')
    step = operator_rules.reconcile(call, later(moment(), 1), _order(call, found))
    assert answer(step).call.result == found
