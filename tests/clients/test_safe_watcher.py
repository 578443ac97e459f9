"""The sync safe call watches its calls from one thread per run: calls in a
row start no thread of their own, a call's renewals still come while its
tool runs (`test_safe_call_boundary`: the lease outlived, with its negative
control), and the thread ends once no call needs it."""

from __future__ import annotations

import threading
import time

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
    # Another test's watcher may still linger, on the default's time.
    earlier = set(threading.enumerate())

    def find() -> None:
        watchers.extend(
            t
            for t in threading.enumerate()
            if t.name == "effectd-watcher" and t not in earlier
        )

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


def test_calls_in_a_row_do_not_wake_the_watcher(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call due after the watcher's next wake costs it no wake-up (fails
    before: each call notified the thread, which found nothing due)."""
    run = Run(client, "run-quiet")
    tool = run.tool("t")(lambda: None)
    tool.at("c0")()  # the watcher thread is up, asleep until c0's renewal
    cond = run._watcher._cond
    notified: list[int] = []
    notify = cond.notify

    def counted(n: int = 1) -> None:
        notified.append(n)
        notify(n)

    monkeypatch.setattr(cond, "notify", counted)
    for i in range(1, 11):
        tool.at(f"c{i}")()
    assert notified == []


def test_a_call_due_before_the_watchers_next_wake_wakes_it(client: Client) -> None:
    """The watcher asleep until a renewal an hour away still signals a
    deadline due sooner (the negative control of the test above: a watcher
    never notified would sleep for the hour)."""
    run = Run(client, "run-soon", heartbeat_interval=3600)
    with run.call("t", {}, call_id="c0") as outer:
        for _ in range(3000):  # until the thread sleeps toward c0's renewal
            if run._watcher._wakes_at > time.monotonic() + 1000:
                break
            time.sleep(0.01)
        assert run._watcher._wakes_at > time.monotonic() + 1000
        with run.call("t", {}, call_id="c1", timeout=0.01) as step:
            assert step.cancelled.wait(timeout=30)
            step.set_result(1)
        outer.set_result(0)
