"""`effectd ctl show` and the console's call page render a record through
one piece, `sidecar.ctl.record` (issue 28 item 2): the same facts read the
same in both, and a change to that piece shows in both faces."""

from __future__ import annotations

import html

import pytest
from effectd.v1 import ledger_pb2 as pb

from sidecar.ctl import record, show
from sidecar.ctl.output import when
from sidecar.web import callpage


def _call() -> pb.ToolCall:
    call = pb.ToolCall(
        ref=pb.CallRef(namespace="ns", run_id="run-1", call_id="pay"),
        tool_name="pay",
        effect=pb.EFFECT_READ,
        forced_effect=pb.EFFECT_SIDE_EFFECT,
        state=pb.CALL_STATE_COMMITTED,
        revision=4,
        attempt=1,
        approval_required=True,
        approval=pb.Approval(approved=True, approver="alice", reason="ok", revision=2),
        kept_input=pb.Payload(json='{"cents":5}'),
        input_fingerprint="not-the-hash",
    )
    call.approval.decided_at.FromSeconds(1_800_000_000)
    for rev, event, to in (
        (1, "prepare", pb.CALL_STATE_AWAITING_APPROVAL),
        (2, "approve", pb.CALL_STATE_PREPARED),
    ):
        t = call.history.add(revision=rev, event=event, to_state=to, actor="alice")
        t.at.FromSeconds(1_800_000_000 + rev)
    r = call.reconciliations.add(
        revision=4,
        resolution=pb.RESOLUTION_COMMITTED,
        from_state=pb.CALL_STATE_UNKNOWN,
        attempt=1,
        operator="bob",
        reason="found",
        evidence="psp",
    )
    r.reconciled_at.FromSeconds(1_800_000_100)
    return call


def _both(call: pb.ToolCall, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    show.print_record(call)
    text = capsys.readouterr().out
    page = html.unescape(callpage.call_page(call, "csrf", now_ns=1_800_000_200 * 10**9))
    return text, page


def test_the_same_facts_read_the_same_in_both_faces(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The approval, the effect, the input check and every history cell
    are the record piece's, in the terminal and on the page."""
    call = _call()
    text, page = _both(call, capsys)
    approval = record.approval(call)
    assert approval.startswith("approved by alice at 2027-01-15T08:00:00.000Z")
    declared, forced = record.effect(call)
    assert (declared, forced) == ("READ", "SIDE_EFFECT")
    kept = record.kept_input(call)
    assert kept is not None
    assert not kept.matches
    for face in (text, page):
        assert approval in face
        assert f"{declared}, forced to {forced}" in face
        assert "DOES NOT hash to the" in face
        for row in record.rows(record.HISTORY, call.history):
            for cell in row:
                value = when(cell) if not isinstance(cell, str | int) else str(cell)
                assert value in face, (value, face)


def test_a_change_to_the_piece_shows_in_both_faces(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: the faces own no copy of the record's rendering: a
    planted approval text and history column appear in both."""
    monkeypatch.setattr(record, "approval", lambda call: "planted approval")
    column: record.Column[pb.Transition] = record.Column(
        "Planted", lambda t: f"cell-{t.revision}"
    )
    monkeypatch.setattr(record, "HISTORY", (column,))
    text, page = _both(_call(), capsys)
    for face in (text, page):
        assert "planted approval" in face
        assert "cell-1" in face
        assert "cell-2" in face
    assert "PLANTED" in text
    assert "Planted" in page
