"""Between the boundary and the service, a request's work is done once: the
namespace the boundary resolved is not resolved again by the translation,
and each payload is canonicalized once (its fingerprint and its result
digest are hashed from the bytes validation made)."""

from __future__ import annotations

import pytest
from effectd.v1 import ledger_pb2 as pb

from sidecar.ledger import fingerprint
from sidecar.ledger.model import Outcome, Payload, PayloadKind
from sidecar.ledger.validation import Limits, Violations
from sidecar.rpc import caller, convert

INPUT = '{"b": 1, "a": [1.0, "x"]}'


def _prepare(namespace: str) -> pb.PrepareToolRequest:
    return pb.PrepareToolRequest(
        ref=pb.CallRef(namespace=namespace, run_id="r", call_id="c"),
        tool_name="t",
        input=pb.Payload(json=INPUT),
    )


def test_the_resolved_namespace_is_not_resolved_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The translation reads the ref's namespace from the Caller; another
    namespace named in the same request is still resolved (fails before:
    every ref was placed again)."""
    request = _prepare("team-a")
    who = caller.resolve(None, request)
    assert who.namespace == "team-a"
    placed: list[str] = []
    real = caller.place

    def counting(*args: object) -> str:
        placed.append(str(args[-1]))
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(caller, "place", counting)
    v = Violations()
    spec = convert.prepare_spec(v, who, request, Limits())
    v.require()
    assert spec.ref.namespace == "team-a"
    assert placed == []
    assert who.place(v, "namespace", "team-b") == "team-b"
    assert placed == ["team-b"]


def test_an_invalid_namespace_is_refused_at_its_field() -> None:
    """A namespace the boundary could not resolve is placed again by the
    translation, which names the field it is refused at."""
    request = _prepare("bad\x00name")
    who = caller.resolve(None, request)
    assert who.namespace == ""
    v = Violations()
    convert.prepare_spec(v, who, request, Limits())
    assert [f.field for f in v.items] == ["ref.namespace"]


def test_each_payload_is_canonicalized_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prepare's input and a commit's result are canonicalized once each,
    and hashed as before (fails before: validation and hashing each did)."""
    calls: list[bytes] = []
    real = fingerprint.canonical_json

    def counting(text: bytes) -> bytes:
        calls.append(text)
        return real(text)

    monkeypatch.setattr(fingerprint, "canonical_json", counting)
    v = Violations()
    who = caller.resolve(None, _prepare(""))
    spec = convert.prepare_spec(v, who, _prepare(""), Limits())
    msg = pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json=INPUT))
    result = convert.result(v, msg, Limits())
    v.require()
    assert len(calls) == 2
    payload = Payload(PayloadKind.JSON, INPUT.encode())
    monkeypatch.setattr(fingerprint, "canonical_json", real)
    assert spec.fingerprint == fingerprint.fingerprint(payload)
    assert result.digest == fingerprint.result_digest(Outcome.OK, payload, "", "")
