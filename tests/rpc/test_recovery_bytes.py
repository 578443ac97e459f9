"""Recover's answers from plan rows (`RecoveryService.recover_rows`, framed
by `sidecar.rpc.recovery`) are byte for byte the answers built the
straightforward way: every record decoded, planned (`recover_page`) and
each item built as a message (`item_pb`) into one `RecoverResponse`.

Two stores are filled with the same random records of one run (every
state, STARTED calls of this and an earlier incarnation, committed calls
acknowledged, rejected or not), under a random policy (forced effects,
idempotency proofs); one is recovered each way, page by page with random
page sizes, and as one unpaged answer. The seed is printed
(EFFECTD_TEST_SEED replays one). Negative control: a stale plan row (its
acknowledged flag flipped on disk) is caught."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from effectd.v1 import recovery_pb2 as rpb

from sidecar.clock import ManualClock
from sidecar.ledger.model import Effect, State
from sidecar.ledger.policy import FixedPolicy, Policy
from sidecar.ledger.validation import Limits
from sidecar.rpc import summaries
from sidecar.rpc.recovery import Recovery, item_pb, page_bytes
from sidecar.services.recovery import RecoveryService
from sidecar.storage import keys, plan_rows, records
from sidecar.storage.api import Table, WriteView
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore
from tests.storage.random_calls import TOOLS, random_call

OPTIONS = LmdbOptions(map_size=64 << 20, sync=False, summarize=summaries.summarize)
CALLS = 300
RUN = "run"


@pytest.fixture
def seed() -> int:
    chosen = os.environ.get("EFFECTD_TEST_SEED")
    value = int(chosen) if chosen else random.randrange(2**32)  # noqa: S311
    print(f"seed={value}")
    return value


def _policy(rng: random.Random) -> Policy:
    tools = list(TOOLS)
    return Policy(
        effect_overrides={
            t: rng.choice(list(Effect)) for t in rng.sample(tools, rng.randrange(3))
        },
        idempotency_proof_required=rng.random() < 0.5,
        proven_idempotent_tools=frozenset(rng.sample(tools, rng.randrange(3))),
    )


class _World:
    def __init__(self, path: Path, seed: int) -> None:
        rng = random.Random(seed)  # noqa: S311 - not a secret
        self.store = LmdbStore(path, OPTIONS)
        calls = [
            random_call(rng, f"c{i:04d}", incarnation=self.store.incarnation)
            for i in range(CALLS)
        ]
        # Another run's calls around it, never in its plan.
        calls += [random_call(rng, "c", run_id=r) for r in ("ruo", "rup")]

        def fill(view: WriteView) -> None:
            for call in calls:
                records.save_call(view, None, call)

        self.store.submit(fill).result()
        self.clock = ManualClock()
        self.service = RecoveryService(
            self.store, self.clock, Limits(), FixedPolicy(_policy(rng))
        )


@pytest.fixture
def worlds(tmp_path: Path, seed: int) -> Iterator[tuple[_World, _World]]:
    a, b = _World(tmp_path / "a", seed), _World(tmp_path / "b", seed)
    try:
        yield a, b
    finally:
        a.store.close()
        b.store.close()


async def _stored_pages(world: _World, sizes: list[int]) -> list[bytes]:
    pages, token = [], ""
    for size in sizes:
        page = await world.service.recover_rows(
            "default", RUN, page_size=size, page_token=token
        )
        pages.append(page_bytes(page))
        token = page.next_page_token
        if not token:
            break
    return pages


async def _built_pages(world: _World, sizes: list[int]) -> list[bytes]:
    pages, token = [], ""
    for size in sizes:
        page = await world.service.recover_page(
            "default", RUN, page_size=size, page_token=token
        )
        answer = rpb.RecoverResponse(
            items=[item_pb(i) for i in page.plan.items],
            interrupted=page.plan.interrupted,
            settled=page.settled,
            next_page_token=page.next_page_token,
        )
        pages.append(answer.SerializeToString())
        token = page.next_page_token
        if not token:
            break
    return pages


def _sizes(seed: int) -> list[int]:
    rng = random.Random(seed + 1)  # noqa: S311 - not a secret
    return [rng.choice([1, 7, 50, 128, 1000]) for _ in range(CALLS)]


def _differences(a: list[bytes], b: list[bytes]) -> list[str]:
    found = [f"{len(a)} pages != {len(b)}"] if len(a) != len(b) else []
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            parsed = rpb.RecoverResponse.FromString(x)
            expected = rpb.RecoverResponse.FromString(y)
            found.append(f"page {i}: {parsed} != {expected}"[:2000])
    return found


def test_pages_from_plan_rows_are_the_pages_built_item_by_item(
    worlds: tuple[_World, _World], seed: int
) -> None:
    stored, built = worlds
    sizes = _sizes(seed)
    got = asyncio.run(_stored_pages(stored, sizes))
    want = asyncio.run(_built_pages(built, sizes))
    assert _differences(got, want) == [], f"seed={seed}"
    # The run held answers of both kinds, and recovery settled calls.
    items = [i for page in got for i in rpb.RecoverResponse.FromString(page).items]
    assert len(items) == CALLS, f"seed={seed}"
    assert sum(rpb.RecoverResponse.FromString(p).settled for p in got) > 0
    assert {i.call.state for i in items} >= {3, 4, 5}, f"seed={seed}"


def test_the_unpaged_answer_is_the_plan_built_item_by_item(
    worlds: tuple[_World, _World], seed: int
) -> None:
    stored, built = worlds

    async def whole() -> bytes:
        return await Recovery(stored.service)._whole_plan("default", RUN, "")

    got = asyncio.run(whole())
    pages = asyncio.run(_built_pages(built, [1000]))
    [page] = [rpb.RecoverResponse.FromString(p) for p in pages]
    page.ClearField("next_page_token")
    assert got == page.SerializeToString(), f"seed={seed}"


def test_negative_control_a_stale_plan_row_is_caught(
    worlds: tuple[_World, _World], seed: int
) -> None:
    """One COMMITTED record's row says acknowledged when the record does
    not (or the other way round)."""
    stored, built = worlds
    prefix = keys.run_prefix("default", RUN)

    def tamper(view: WriteView) -> None:
        for key, raw in view.scan(Table.PLAN_ROWS, prefix):
            row = bytearray(raw)
            row[1] ^= plan_rows.ACKNOWLEDGED
            view.put(Table.PLAN_ROWS, key, bytes(row))
            return
        raise AssertionError("no plan row")

    stored.store.submit(tamper).result()
    sizes = _sizes(seed)
    got = asyncio.run(_stored_pages(stored, sizes))
    want = asyncio.run(_built_pages(built, sizes))
    assert _differences(got, want), f"seed={seed}"


def test_a_record_without_its_row_is_answered_the_long_way(
    worlds: tuple[_World, _World], seed: int
) -> None:
    """A store whose rows are gone (as before its upgrade) answers the
    same."""
    stored, built = worlds

    def drop(view: WriteView) -> None:
        for key, _ in list(view.scan(Table.PLAN_ROWS, b"")):
            view.delete(Table.PLAN_ROWS, key)

    stored.store.submit(drop).result()
    sizes = _sizes(seed)
    got = asyncio.run(_stored_pages(stored, sizes))
    want = asyncio.run(_built_pages(built, sizes))
    assert _differences(got, want) == [], f"seed={seed}"
    assert State.COMMITTED  # the committed records were there, decoded
