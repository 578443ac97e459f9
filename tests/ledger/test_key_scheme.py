"""Idempotency key schemes (ADR-010 D2, R4): a record keeps the scheme it was
created with, and this daemon acts only on records of a scheme it knows. A
record or tombstone of another scheme (made by a newer daemon) is refused
with UNSUPPORTED_KEY_SCHEME by every path that would act on it or hand out
a key, and is left untouched. Negative control: a daemon that does not
consult the scheme hands such a call out for execution with a key of scheme
1."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.clock import ManualClock
from sidecar.errors import EffectdError, UnsupportedKeyScheme
from sidecar.ledger import model, retention
from sidecar.ledger.model import KEY_SCHEME_V1, KEY_SCHEMES, CallRef, Effect
from sidecar.ledger.policy import FixedPolicy
from sidecar.ledger.validation import Limits
from sidecar.services.ledger import LedgerService
from sidecar.services.recovery import RecoveryService
from sidecar.services.retention import RetentionService
from sidecar.storage import keys, records, tombstones
from sidecar.storage.api import Table, WriteView
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore
from tests.ledger.builders import committed, prepared, spec, started

FUTURE = max(KEY_SCHEMES) + 1


def test_scheme_1_is_run_id_colon_call_id() -> None:
    """ADR-010 D2: scheme 1 is exactly `${runId}:${callId}`."""
    ref = CallRef("ns", "run", "call")
    assert model.idempotency_key(ref, KEY_SCHEME_V1) == "run:call"
    assert prepared(Effect.IDEMPOTENT_WRITE).idempotency_key == "run-1:call-1"


def test_an_unknown_scheme_has_no_key() -> None:
    """No key is computed for a scheme this daemon does not know (issue 10
    item C17: fails before the fix: scheme 1's key was given for any)."""
    call = dataclasses.replace(prepared(Effect.IDEMPOTENT_WRITE), key_scheme=FUTURE)
    with pytest.raises(UnsupportedKeyScheme) as refused:
        _ = call.idempotency_key
    assert refused.value.metadata == {"keyScheme": str(FUTURE)}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LmdbStore]:
    s = LmdbStore(tmp_path / "data", LmdbOptions(map_size=64 << 20, sync=False))
    yield s
    s.close()


def _stored(store: LmdbStore, write: Callable[[WriteView], None]) -> None:
    store.submit(write).result()


def _raw(store: LmdbStore, table: Table, key: bytes) -> bytes | None:
    return store.read(lambda view: view.get(table, key))


def refusals(store: LmdbStore) -> list[str]:
    """Every path that acts on the future-scheme call `run-1:call-1` or hands
    out its key, and the tombstone `run-1:gone`: what each answered, and
    whether the rows changed."""
    clock = ManualClock()
    ledger = LedgerService(store, clock, Limits(), FixedPolicy())
    recovery = RecoveryService(store, clock, Limits(), FixedPolicy())
    call = prepared(Effect.IDEMPOTENT_WRITE)
    before = _raw(store, Table.CALLS, keys.call_key(call.ref))
    gone = CallRef(call.ref.namespace, call.ref.run_id, "gone")
    attempts: dict[str, Callable[[], Any]] = {
        "prepare": lambda: asyncio.run(
            ledger.prepare(spec(Effect.IDEMPOTENT_WRITE, start=True))
        ),
        "start": lambda: asyncio.run(
            ledger.start(call.ref, lease_ms=0, retry=False, expected_revision=None)
        ),
        "get": lambda: asyncio.run(ledger.get(call.ref)),
        "list": lambda: asyncio.run(
            ledger.list(
                frozenset({call.ref.namespace}),
                run_id="",
                states=frozenset(),
                page_size=10,
                page_token="",
            )
        ),
        "recover": lambda: asyncio.run(
            recovery.recover(call.ref.namespace, call.ref.run_id)
        ),
        "prepare the tombstone": lambda: asyncio.run(
            ledger.prepare(dataclasses.replace(spec(Effect.IDEMPOTENT_WRITE), ref=gone))
        ),
    }
    found = []
    for name, attempt in attempts.items():
        try:
            attempt()
        except UnsupportedKeyScheme:
            continue
        except EffectdError as exc:
            found.append(f"{name} was refused with {exc.reason}")
            continue
        found.append(f"{name} was answered")
    if _raw(store, Table.CALLS, keys.call_key(call.ref)) != before:
        found.append("the record changed")
    return found


def _future_scheme(store: LmdbStore) -> None:
    call = dataclasses.replace(prepared(Effect.IDEMPOTENT_WRITE), key_scheme=FUTURE)
    _stored(store, lambda view: records.save_call(view, None, call))
    done = dataclasses.replace(
        committed(Effect.IDEMPOTENT_WRITE),
        ref=CallRef(call.ref.namespace, call.ref.run_id, "gone"),
        key_scheme=FUTURE,
    )
    tomb = retention.tombstone(done, done.updated_ns)
    _stored(store, lambda view: records.save_call(view, None, done))
    _stored(store, lambda view: tombstones.compact(view, done, tomb))


def test_a_record_of_an_unknown_scheme_is_refused_and_left_alone(
    store: LmdbStore,
) -> None:
    """Prepare, start, get, list, recover of a record of an unknown scheme,
    and a prepare of such a tombstone, are UNSUPPORTED_KEY_SCHEME, and the
    record is unchanged (issue 10 item C17: fails before the fix: the call
    was started and handed out with a key of scheme 1)."""
    _future_scheme(store)
    assert refusals(store) == []


def test_negative_control_a_daemon_that_ignores_the_scheme_is_caught(
    store: LmdbStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: with the scheme not consulted, the same check finds
    the call started and its key handed out."""
    _future_scheme(store)
    monkeypatch.setattr(model, "KEY_SCHEMES", frozenset({KEY_SCHEME_V1, FUTURE}))
    found = refusals(store)
    assert "prepare was answered" in found
    assert "the record changed" in found


def test_sweeps_at_start_and_compaction_leave_such_calls_alone(
    store: LmdbStore,
) -> None:
    """The start-up settlement of STARTED calls and the compaction pass walk
    past calls of an unknown scheme without failing and without touching
    them: one such call must not stop the daemon or its retention (issue 10
    item C17: fails before the fix: they were settled and compacted as
    scheme 1 calls)."""
    clock = ManualClock()
    old = dataclasses.replace(started(Effect.SIDE_EFFECT), key_scheme=FUTURE)
    done = dataclasses.replace(
        committed(Effect.READ),
        ref=CallRef("default", "run-1", "done"),
        key_scheme=FUTURE,
    )
    for call in (old, done):
        _stored(store, functools.partial(records.save_call, old=None, new=call))
    before = store.read(lambda view: list(view.scan(Table.CALLS, b"")))
    ledger = LedgerService(store, clock, Limits(), FixedPolicy())
    clock.advance(10 * 365 * 86_400)
    retention_pass = RetentionService(store, clock, FixedPolicy())

    async def sweeps() -> tuple[int, int]:
        settled = await ledger.settle_earlier_incarnations()
        return settled, (await retention_pass.compact()).compacted

    assert asyncio.run(sweeps()) == (0, 0)
    assert store.read(lambda view: list(view.scan(Table.CALLS, b""))) == before
