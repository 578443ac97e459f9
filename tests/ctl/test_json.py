"""`effectd ctl --json` prints one documented shape (issue 25 item 12,
docs/operations.md "JSON for scripts"): every record its protobuf message
with every field, enum names without their prefix, 64-bit integers as
numbers, times in RFC 3339 UTC; and `--json` is accepted after the command
as well as before it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from effectd.v1 import admin_pb2, ledger_pb2, recovery_pb2
from effectd.v1 import ledger_pb2 as pb
from google.protobuf.descriptor import FileDescriptor

from effectd_client import Client
from sidecar.ctl.schema import record
from tests.ctl.conftest import Ctl
from tests.ctl.support import RUN, awaiting, committed, unknown

RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def _prefixed_enum_names() -> set[str]:
    """Every enum value name as generated, prefix included."""
    files: list[FileDescriptor] = [
        ledger_pb2.DESCRIPTOR,
        admin_pb2.DESCRIPTOR,
        recovery_pb2.DESCRIPTOR,
    ]
    return {
        v.name for f in files for e in f.enum_types_by_name.values() for v in e.values
    }


def _walk(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            # An audit entry's details are a map<string, string>.
            if k != "details":
                yield from _walk(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v, key)
    else:
        yield key, value


def _check_shape(doc: Any) -> None:
    prefixed = _prefixed_enum_names()
    for key, value in _walk(doc):
        assert value not in prefixed, (key, value)
        if key.endswith("_at") or key == "unknown_since":
            assert value is None or RFC3339.fullmatch(value), (key, value)
        if key in ("revision", "attempt", "sequence", "incarnation", "open_calls"):
            assert isinstance(value, int), (key, value)


def _calls(ctl: Ctl, *args: str) -> list[dict[str, Any]]:
    code, out, err = ctl(*args)
    assert code == 0, err
    found: list[dict[str, Any]] = json.loads(out)["calls"]
    return found


def test_every_command_prints_one_shape(
    ctl: Ctl, agent: Client, short_tmp: Path, store_kind: str
) -> None:
    """Each command's JSON follows the rules, and a tool call has the same
    keys in `list`, `show`, `recover` and the answers of `approve` and
    `reconcile` (fails before the fix: `show` printed CALL_STATE_ names and
    revisions as strings, `list` another set of keys). `backup` copies
    LMDB's data directory; the shared store refuses it."""
    awaiting(agent, "a")
    unknown(agent, "b")
    committed(agent, "c")
    docs = {}
    for args in (
        ["list"],
        ["show", RUN, "a"],
        ["recover", RUN],
        ["approve", RUN, "a", "--reason", "ok"],
        [
            "reconcile",
            RUN,
            "b",
            "--result",
            '{"id": 1}',
            "--reason",
            "r",
            "--evidence",
            "e",
        ],
        ["audit", "list"],
        ["audit", "verify"],
        ["stats"],
        ["daemons"],
        ["enter-reconciliation", "search", "--reason", "r"],
        *([["backup", str(short_tmp / "copy")]] if store_kind == "lmdb" else []),
    ):
        code, out, err = ctl("--json", *args)
        assert code == 0, (args, err)
        docs[args[0] + (f" {args[1]}" if args[0] == "audit" else "")] = json.loads(out)
    for doc in docs.values():
        _check_shape(doc)
    shapes = {
        "list": docs["list"]["calls"][0],
        "show": docs["show"],
        "recover": docs["recover"]["items"][0]["call"],
        "approve": docs["approve"],
        "reconcile": docs["reconcile"],
    }
    keys = {name: frozenset(c) for name, c in shapes.items()}
    assert len(set(keys.values())) == 1, keys
    assert docs["show"]["revision"] == 1
    assert docs["approve"]["state"] == "PREPARED"
    assert docs["audit list"]["entries"][0]["action"] == "APPROVE"
    assert docs["audit verify"]["entries_checked"] == 2


def test_json_is_accepted_after_the_command(ctl: Ctl, agent: Client) -> None:
    """`ctl list --json` prints what `ctl --json list` prints, for a nested
    command too (fails before the fix: exit 2, unrecognized arguments)."""
    awaiting(agent, "a")
    assert ctl("list", "--json") == ctl("--json", "list")
    assert ctl("audit", "verify", "--json") == ctl("--json", "audit", "verify")
    assert ctl("show", RUN, "a", "--json")[1] == ctl("--json", "show", RUN, "a")[1]
    code, out, _ = ctl("list")
    assert code == 0
    assert out.startswith("NAMESPACE")


def test_the_rules_hold_at_the_edges() -> None:
    """The largest uint64 stays a number, an unspecified enum and an unset
    time or message are null, bytes are base64."""
    call = pb.ToolCall(revision=2**64 - 1, kept_input=pb.Payload(raw=b"\x00\xff"))
    call.created_at.FromNanoseconds(1_700_000_000_123_456_789)
    doc = record(call)
    assert doc["revision"] == 2**64 - 1
    assert json.loads(json.dumps(doc))["revision"] == 2**64 - 1
    assert (doc["state"], doc["effect"], doc["result"]) == (None, None, None)
    assert doc["created_at"] == "2023-11-14T22:13:20.123456Z"
    assert doc["updated_at"] is None
    assert doc["kept_input"] == {"json": None, "raw": "AP8="}
    assert doc["display_state"] == "-"


@pytest.mark.parametrize("document", ["docs/operations.md"])
def test_the_schema_is_documented(document: str) -> None:
    """The operator's guide states the rules the code follows."""
    text = (Path(__file__).resolve().parents[2] / document).read_text()
    section = text.split("### JSON for scripts", 1)[1].split("\n## ", 1)[0]
    for rule in ("without", "JSON numbers", "RFC 3339", "display_state", "null"):
        assert rule in section, rule
