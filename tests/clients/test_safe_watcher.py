"""The sync safe call watches its calls from one thread per run: calls in a
row start no thread of their own, a call's renewals still come while its
tool runs (`test_safe_call_boundary`: the lease outlived, with its negative
control), and the thread ends once no call needs it."""

from __future__ import annotations

import threading

import pytest

from effectd_client import Client, Run
from effectd_client import _safe_threads as safe_threads


def _names() -> set[str]:
    return {t.name for t in threading.enumerate()}


def test_calls_in_a_row_share_one_watcher_thread(client: Client) -> None:
    """No call runs with a thread of its own (fails before: each call
    started an `effectd-watch-<call id>` thread)."""
    seen: list[set[str]] = []
    tool = Run(client, "run-w").tool("t")(lambda: seen.append(_names()))
    for i in range(5):
        tool.at(f"c{i}")()
    for names in seen:
        assert not [n for n in names if n.startswith("effectd-watch-")]
        assert "effectd-watcher" in names


def test_the_watcher_thread_ends_when_no_call_needs_it(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its last call, the watcher thread ends on its own."""
    monkeypatch.setattr(safe_threads, "WATCHER_LINGER_S", 0.01)
    watchers: list[threading.Thread] = []

    def find() -> None:
        watchers.extend(t for t in threading.enumerate() if t.name == "effectd-watcher")

    Run(client, "run-end").tool("t")(find).at("c")()
    assert watchers
    for t in watchers:
        t.join(timeout=30)
        assert not t.is_alive()


def test_a_deadline_is_signalled_by_the_watcher(client: Client) -> None:
    """A block past its deadline sees `cancelled`, set by the shared thread."""
    with Run(client, "run-d").call("t", {}, call_id="c", timeout=0.01) as step:
        assert step.cancelled.wait(timeout=30)
        step.set_result(1)
