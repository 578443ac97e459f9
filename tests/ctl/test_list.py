"""`effectd ctl list` a page at a time (issue 25 item 12): a default
--limit, the page token that goes on exactly where it stopped, --tool,
--older-than and the AGE column."""

from __future__ import annotations

import json
import time

import pytest

from effectd_client import Client
from sidecar.clock import ManualClock
from sidecar.ctl.listing import DEFAULT_LIMIT
from tests.ctl.conftest import Ctl
from tests.ctl.support import awaiting, rows, unknown

DAY = 86400


def _prepare(agent: Client, count: int, run: str = "bulk") -> None:
    for i in range(count):
        agent.prepare_tool(run, f"c{i:03}", "search", {"q": i})


def _token(out: str) -> str | None:
    last = out.rstrip("\n").splitlines()[-1]
    if not last.startswith("more: "):
        return None
    return last.rsplit(" ", 1)[1]


def test_a_listing_stops_at_its_default_limit_and_says_how_to_go_on(
    ctl: Ctl, agent: Client
) -> None:
    """With more calls than the limit, `list` prints DEFAULT_LIMIT calls and
    a page token; following the tokens lists every call once, those that
    wait for a person first although their keys sort last (fails before the
    fix: every call in one listing)."""
    _prepare(agent, 2 * DEFAULT_LIMIT + 7)
    unknown(agent, "z-unknown", run="zz")
    awaiting(agent, "z-awaiting", run="zz")
    code, out, _ = ctl("list")
    assert code == 0
    first = rows(out)
    assert len(first) == DEFAULT_LIMIT
    assert [r[1] for r in first[:2]] == ["UNKNOWN", "AWAITING_APPROVAL"]
    seen = [(r[2], r[3]) for r in first]
    token = _token(out)
    pages = 1
    while token is not None:
        code, out, err = ctl("list", "--page-token", token)
        assert code == 0, err
        seen += [(r[2], r[3]) for r in rows(out)]
        token = _token(out)
        pages += 1
    assert pages == 3
    assert len(seen) == len(set(seen)) == 2 * DEFAULT_LIMIT + 9
    code, out, _ = ctl("list", "--limit", "0")
    assert len(rows(out)) == 2 * DEFAULT_LIMIT + 9
    assert _token(out) is None


def test_the_json_listing_pages_with_the_same_tokens(ctl: Ctl, agent: Client) -> None:
    """`--json` carries the token as `next_page_token`, null on the last page."""
    _prepare(agent, 5)
    first = json.loads(ctl("--json", "list", "--limit", "3")[1])
    assert [c["ref"]["call_id"] for c in first["calls"]] == ["c000", "c001", "c002"]
    rest = json.loads(
        ctl("--json", "list", "--limit", "3", "--page-token", first["next_page_token"])[
            1
        ]
    )
    assert [c["ref"]["call_id"] for c in rest["calls"]] == ["c003", "c004"]
    assert rest["next_page_token"] is None


def test_tool_narrows_the_listing(ctl: Ctl, agent: Client) -> None:
    """`--tool` lists only the calls of that tool, over every page read."""
    _prepare(agent, 3)
    unknown(agent, "u1")
    assert [r[4] for r in rows(ctl("list", "--tool", "charge")[1])] == ["charge"]
    assert ctl("list", "--tool", "nothing")[1].startswith("no calls in")


@pytest.fixture
def clock() -> ManualClock:
    """The daemon's wall clock three days behind the real one, so that the
    calls made now are three days old to `ctl`, which reads the real one."""
    return ManualClock(wall_ns=time.time_ns() - 3 * DAY * 1_000_000_000)


def test_older_than_and_the_age_column(
    ctl: Ctl, agent: Client, clock: ManualClock
) -> None:
    """`--older-than 1d` keeps the calls prepared three days ago and drops
    those of an hour ago; AGE says how old each one is."""
    awaiting(agent, "old")
    clock.advance(3 * DAY - 3600)
    awaiting(agent, "new")
    listed = {r[3]: r[-1] for r in rows(ctl("list")[1])}
    assert listed["old"].startswith(("3d", "2d23h"))
    assert listed["new"].startswith("1h")
    assert [r[3] for r in rows(ctl("list", "--older-than", "1d")[1])] == ["old"]
    assert [r[3] for r in rows(ctl("list", "--older-than", "30m")[1])] == [
        "new",
        "old",
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["list", "--older-than", "yesterday"],
        ["list", "--older-than", "5"],
        ["list", "--limit", "-1"],
        ["list", "--page-token", "not-a-token"],
        ["list", "--page-token", "WzAsICIiLCA1MDBd"],
    ],
)
def test_bad_listing_options_exit_2(ctl: Ctl, argv: list[str]) -> None:
    """A duration, limit or page token that means nothing is a usage error."""
    with pytest.raises(SystemExit) as info:
        ctl(*argv)
    assert info.value.code == 2
