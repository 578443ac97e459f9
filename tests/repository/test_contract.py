"""docs/contract.md is the document the code is written against, and its
citations hold: code, tests and docs cite it as `contract §4.2` (or
`contract §3, §11`, `contract §4-§5`), and every such citation in the
repository's .py, .pyi, .js, .mjs, .ts, .md and .proto files must name a
section the contract has; so must the contract's own `§N` references. A
citation of the design document the contract replaced is reported wherever it
is left. Failures name the file and the line.

The contract also names what the protos declare: every service and RPC in its
section 2, and every value of the enums a client reads (states, decisions,
recovery actions, error reasons, ...) in the section that explains it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from effectd.v1 import (
    admin_pb2,
    checkpoints_pb2,
    errors_pb2,
    ledger_pb2,
    provider_pb2,
    recovery_pb2,
    retry_pb2,
)
from google.protobuf.descriptor import EnumDescriptor

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "docs" / "contract.md"

SCANNED = frozenset({".py", ".pyi", ".js", ".mjs", ".cjs", ".ts", ".md", ".proto"})
# Directories that are not the repository's own text: tools' caches,
# installed packages, build output.
SKIPPED = frozenset({"node_modules", "__pycache__", "build", "dist"})

SIGN = "§"
NUMBER = r"\d+(?:\.\d+)*"
HEADING = re.compile(rf"^(#{{2,6}})\s+({NUMBER})\.?\s", re.MULTILINE)
# `contract §4.2`, also wrapped onto the next line of a comment, and the
# sections listed after it (`§3, §11`, `§4-§5`, `§4 and §5`).
CITATION = re.compile(
    rf"\bcontract\s*(?:(?:#|//|\*)\s*)?{SIGN}({NUMBER})"
    rf"((?:\s*(?:,|-|–|and|or)\s*{SIGN}{NUMBER})*)"
)
LISTED = re.compile(rf"{SIGN}({NUMBER})")
# Inside the contract a bare `§N` is a section of its own; another
# document's are named (`provider-retries §10.5`, `RFC 8785 §3.2`).
OWN = re.compile(rf"{SIGN}({NUMBER})")
OTHER_DOCUMENT = re.compile(rf"(?:\b[a-z]+-[a-z-]+|RFC \d+) {SIGN}{NUMBER}")
LEFTOVER = re.compile(rf"\bDESIGN(?:\s*{SIGN}|\.md\b)")


def sections(text: str) -> frozenset[str]:
    """The section numbers of the contract's headings (`## 4.`, `### 4.2`)."""
    return frozenset(m.group(2) for m in HEADING.finditer(text))


def outline_problems(text: str) -> list[str]:
    """Headings numbered out of order, twice, or at the wrong depth."""
    found: list[str] = []
    seen: dict[tuple[int, ...], str] = {}
    for m in HEADING.finditer(text):
        name = m.group(2)
        number = tuple(int(n) for n in name.split("."))
        line = _line(text, m.start())
        if len(m.group(1)) != len(number) + 1:
            found.append(f"line {line}: §{name} is at the wrong heading depth")
        if number in seen:
            found.append(f"line {line}: §{name} is numbered twice")
        elif seen and number < max(seen):
            found.append(f"line {line}: §{name} comes after §{seen[max(seen)]}")
        if len(number) > 1 and number[:-1] not in seen:
            found.append(f"line {line}: §{name} has no section above it")
        seen[number] = name
    return found


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def citations(text: str, *, own: bool = False) -> Iterator[tuple[int, str]]:
    """(line, section) of every section of the contract that `text` cites;
    `own`: `text` is the contract, whose bare `§N` are its own."""
    for m in CITATION.finditer(text):
        yield _line(text, m.start(1)), m.group(1)
        for listed in LISTED.finditer(m.group(2)):
            yield _line(text, m.start(2) + listed.start()), listed.group(1)
    if own:
        others = {o.end() for o in OTHER_DOCUMENT.finditer(text)}
        for m in OWN.finditer(text):
            if m.end() not in others:
                yield _line(text, m.start()), m.group(1)


def problems(files: Iterable[tuple[str, str]], known: frozenset[str]) -> list[str]:
    """'path:line: ...' for each citation of a section not in `known`, and
    for each citation of the design document the contract replaced."""
    found: list[str] = []
    for path, text in files:
        own = path == "docs/contract.md"
        for line, section in citations(text, own=own):
            if section not in known:
                found.append(f"{path}:{line}: contract §{section} does not exist")
        for m in LEFTOVER.finditer(text):
            found.append(
                f"{path}:{_line(text, m.start())}: cites DESIGN; "
                "cite docs/contract.md (contract §N) instead"
            )
    return sorted(set(found), key=lambda p: (p.split(":")[0], int(p.split(":")[1])))


def repository_files() -> Iterator[tuple[str, str]]:
    """(path from the root, text) of every scanned file of the repository."""
    for path in sorted(ROOT.rglob("*")):
        relative = path.relative_to(ROOT)
        if any(
            part.startswith(".") or part in SKIPPED or part.endswith(".egg-info")
            for part in relative.parts[:-1]
        ):
            continue
        if path.suffix in SCANNED and path.is_file():
            yield relative.as_posix(), path.read_text(encoding="utf-8")


def test_the_contract_has_numbered_sections_in_order() -> None:
    text = CONTRACT.read_text(encoding="utf-8")
    assert {"1", "2", "2.1", "4.2", "11", "11.2"} <= sections(text)
    assert outline_problems(text) == []


def test_an_outline_out_of_order_is_reported() -> None:
    """The negative control of the outline check."""
    text = "## 1. A\n### 1.1 B\n## 3. C\n### 2.1 D\n## 3. E\n#### 3.1 F\n"
    assert outline_problems(text) == [
        "line 4: §2.1 comes after §3",
        "line 4: §2.1 has no section above it",
        "line 5: §3 is numbered twice",
        "line 6: §3.1 is at the wrong heading depth",
    ]


def test_every_citation_of_the_contract_names_a_section_it_has() -> None:
    """Scans the repository: a citation of a section the contract does not
    have, or of the design document it replaced, is reported as file:line."""
    files = list(repository_files())
    paths = {path for path, _ in files}
    # The scan reaches every kind of file that cites the contract.
    assert {
        "docs/contract.md",
        "docs/ledger.md",
        "protos/effectd/v1/admin.proto",
        "sidecar/ledger/machine.py",
        "tests/ledger/test_rules.py",
        "clients/node/src/client.js",
        "clients/node/src/index.d.ts",
    } <= paths
    assert not any(p.startswith("clients/node/node_modules/") for p in paths)
    known = sections(CONTRACT.read_text(encoding="utf-8"))
    found = problems(files, known)
    assert not found, "\n" + "\n".join(found)
    cited = {s for _, text in files for _, s in citations(text)}
    assert len(cited) > 30, cited


def test_a_citation_of_a_missing_section_is_reported() -> None:
    """The negative control: planted citations of sections that do not exist,
    in each form a citation takes, and of the replaced design document, are
    each reported at their line; citations that resolve are not."""
    known = frozenset({"3", "3.1", "4", "4.2", "5", "11"})
    design = "DESIGN"
    python = (
        '"""The rules (contract §4.2, §5).\n'
        f"No such rule (contract {SIGN}4.9).\n"
        '"""\n'
        f"# A list: contract §3, {SIGN}12 and §11.\n"
        f"# A range: contract §4-{SIGN}6.\n"
        "# Wrapped: the rule of the contract\n"
        f"# {SIGN}7 is cited on this line.\n"
        f"# Left over: {design} {SIGN}4, and {design}.md.\n"
        "# Another document's section: provider-retries §10.5.\n"
    )
    contract = f"## 3. A\nSee §4.2 and {SIGN}8; provider-retries §10.2 is theirs.\n"
    missing = "contract " + SIGN + "{} does not exist"
    assert problems(
        [("sidecar/x.py", python), ("docs/contract.md", contract)], known
    ) == [
        "docs/contract.md:2: " + missing.format("8"),
        "sidecar/x.py:2: " + missing.format("4.9"),
        "sidecar/x.py:4: " + missing.format("12"),
        "sidecar/x.py:5: " + missing.format("6"),
        "sidecar/x.py:7: " + missing.format("7"),
        "sidecar/x.py:8: cites DESIGN; cite docs/contract.md (contract §N) instead",
    ]


# -- the contract names what the protos declare ------------------------------

# Enum -> (the prefix its values carry, the section that must name them).
ENUMS: Mapping[EnumDescriptor, tuple[str, str]] = {
    ledger_pb2.Effect.DESCRIPTOR: ("EFFECT_", "4.1"),
    ledger_pb2.CallState.DESCRIPTOR: ("CALL_STATE_", "4.1"),
    ledger_pb2.CallChannel.DESCRIPTOR: ("CALL_CHANNEL_", "3.4"),
    ledger_pb2.Decision.DESCRIPTOR: ("DECISION_", "5.1"),
    ledger_pb2.Resolution.DESCRIPTOR: ("RESOLUTION_", "4.6"),
    recovery_pb2.RecoveryAction.DESCRIPTOR: ("RECOVERY_ACTION_", "6.1"),
    retry_pb2.RetryContext.DESCRIPTOR: ("RETRY_CONTEXT_", "7.1"),
    retry_pb2.FailureKind.DESCRIPTOR: ("FAILURE_KIND_", "7.1"),
    admin_pb2.DaemonStanding.DESCRIPTOR: ("DAEMON_STANDING_", "4.4"),
    errors_pb2.ErrorReason.DESCRIPTOR: ("", "11.2"),
}
MODULES = (
    ledger_pb2,
    recovery_pb2,
    retry_pb2,
    checkpoints_pb2,
    provider_pb2,
    admin_pb2,
)


def section_text(text: str, number: str) -> str:
    """The text of section `number`, its subsections included."""
    headings = list(HEADING.finditer(text))
    for i, m in enumerate(headings):
        if m.group(2) == number:
            depth = len(m.group(1))
            end = next(
                (h.start() for h in headings[i + 1 :] if len(h.group(1)) <= depth),
                len(text),
            )
            return text[m.start() : end]
    return ""


def unnamed(text: str) -> list[str]:
    """The proto names the contract `text` does not mention where it should:
    each service and RPC in §2, each enum value in its section."""
    found: list[str] = []
    services = section_text(text, "2")
    for module in MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            if f"`{service.full_name}`" not in services:
                found.append(f"§2 does not name {service.full_name}")
            for method in service.methods:
                if f"`{method.name}`" not in services:
                    found.append(f"§2 does not name {service.name}.{method.name}")
    for enum, (prefix, number) in ENUMS.items():
        body = section_text(text, number)
        for value in enum.values:
            name = value.name.removeprefix(prefix)
            if not name.endswith("UNSPECIFIED") and f"`{name}`" not in body:
                found.append(f"§{number} does not name {enum.name} {name}")
    return found


def test_the_contract_names_every_service_rpc_and_enum_value() -> None:
    found = unnamed(CONTRACT.read_text(encoding="utf-8"))
    assert not found, "\n" + "\n".join(found)


def test_a_name_missing_from_the_contract_is_reported() -> None:
    """The negative control: the contract without its QUOTA_EXCEEDED row and
    with ListDaemons' row renamed is caught."""
    text = CONTRACT.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `QUOTA_"))
    doctored = text.replace(row + "\n", "").replace("| `ListDaemons` |", "| daemons |")
    assert unnamed(doctored) == [
        "§2 does not name Admin.ListDaemons",
        "§11.2 does not name ErrorReason QUOTA_EXCEEDED",
    ]
