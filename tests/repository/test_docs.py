"""The docs run as written (issue 10 item 31): every shell, Python,
JavaScript and TOML block of README.md, docs/operations.md and the Node
README runs against a real daemon that the test starts in a temporary
directory, unless a marker in the Markdown says why it cannot run on one
machine (Kubernetes, systemd, podman, the network). A block added later runs
by default. How blocks run and the markers: `tests.support.docs`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import docs
from tests.support.processes import ROOT

pytestmark = pytest.mark.slow

DOCUMENTS = (
    "README.md",
    "docs/operations.md",
    "clients/node/README.md",
    "docs/mcp.md",
    "docs/pydantic-ai.md",
    "docs/langgraph.md",
    "docs/openai-agents.md",
    "docs/ai-sdk.md",
    "docs/openai-agents-js.md",
    "docs/agent-framework.md",
    "docs/langgraph-js.md",
)
# The documents that start their daemon themselves, as a reader does on a
# fresh clone: the README's first block is `make run`.
SERVES_ITSELF = {"README.md"}
# Files a document's blocks write that are the reader's own code, to keep.
SOURCES = {"docs/mcp.md": ("mail_server.py",)}
# Blocks each document must run here, so that no marker or parser slip can
# quietly turn the test off.
AT_LEAST = {
    "README.md": 9,
    "docs/operations.md": 6,
    "clients/node/README.md": 0,
    "docs/mcp.md": 4,
    "docs/pydantic-ai.md": 2,
    "docs/langgraph.md": 3,
    "docs/openai-agents.md": 2,
    "docs/ai-sdk.md": 2,
    "docs/openai-agents-js.md": 2,
    "docs/agent-framework.md": 3,
    "docs/langgraph-js.md": 2,
}


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("document", DOCUMENTS)
def test_the_documents_blocks_run_as_written(short_tmp: Path, document: str) -> None:
    """Each runnable block exits 0 in document order (issue 10 item 31:
    fails before the fix: the backup's parent did not exist, the restore
    started a daemon on the backup, the ctl examples reconciled one call
    twice, and none of the blocks was run by any test; issue 25 item 14: the
    README's blocks run on what its own blocks made, from its `make run`
    on, without a daemon or calls of the test's)."""
    with docs.sandbox(short_tmp, daemon=document not in SERVES_ITSELF) as box:
        before = {p.name for p in short_tmp.iterdir()}
        report = docs.run_document(ROOT / document, box)
        made = sorted(
            p.name + ("/" if p.is_dir() else "")
            for p in short_tmp.iterdir()
            if p.name not in before | docs.HARNESS_FILES
        )
    print(f"{document}: ran blocks at lines {report.ran}; made {made}")
    for skipped in report.skipped:
        print(f"skipped {skipped}")
    assert report.failures == []
    assert len(report.ran) >= AT_LEAST[document]
    # Run in a checkout, the same commands would leave these beside the
    # sources: tokens, backups, data directories (issue 25 item 16: fails
    # before the fix: operator.token, tokens.toml and backups/ were not
    # ignored).
    kept = [name for name in made if not ignored_by_git(name)]
    assert kept == list(SOURCES.get(document, ()))


def ignored_by_git(name: str) -> bool:
    """Whether the checkout's .gitignore ignores `name` at its top."""
    done = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "-q", "--no-index", name],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return done.returncode == 0


def test_the_ignore_check_can_fail() -> None:
    """The negative control: a source file is not ignored."""
    assert ignored_by_git(".effectd-any/")
    assert not ignored_by_git("README.md")
    assert not ignored_by_git("sidecar/")


def test_the_readme_needs_no_fixture_of_the_tests() -> None:
    """What the README's blocks need, its blocks make: none says `given`
    (issue 25 item 14: fails before the fix, its `effectd ctl` block was
    given calls it never made)."""
    markers = [b.marker for b in docs.blocks((ROOT / "README.md").read_text())]
    assert "given" not in markers
    assert markers[0] == "serves"


FRAMEWORK_PAGES = (
    "docs/mcp.md",
    "docs/pydantic-ai.md",
    "docs/langgraph.md",
    "docs/openai-agents.md",
    "docs/ai-sdk.md",
    "docs/openai-agents-js.md",
    "docs/langgraph-js.md",
)


@pytest.mark.parametrize("document", FRAMEWORK_PAGES)
def test_each_framework_page_reconciles_in_a_block_that_runs(document: str) -> None:
    """Each framework's page shows how to reconcile its calls in a block the
    documents' test runs: the result found, and "never ran" with
    `--confirm-dead-attempt` (issue 25 item 15: fails before the fix: no
    framework page named the flag, and none ran a reconcile)."""
    runs = [
        block.code
        for block in docs.blocks((ROOT / document).read_text())
        if block.lang == "sh" and block.marker != "skip"
    ]
    assert any(
        "effectd ctl reconcile" in code
        and "--result" in code
        and "--not-executed --confirm-dead-attempt" in code
        for code in runs
    ), document


def test_every_marker_is_understood() -> None:
    """Each docs-test comment in the documents is a known marker, and each
    `given` names a fixture the runner has."""
    for document in DOCUMENTS:
        for block in docs.blocks((ROOT / document).read_text()):
            if block.marker == "given":
                assert block.arg in docs.FIXTURES, f"{document}:{block.line}"


BROKEN = {
    "sh": "```sh\neffectd ctl list\neffectd ctl lsit\n```\n",
    "python": "```python\nimport effectd_client\neffectd_client.Clinet\n```\n",
    "toml": '```toml\n[[token]]\nname = "x\n```\n',
    "serves": (
        "<!-- docs-test: serves -->\n```sh\n"
        "effectd serve --data-dir .effectd-x --tokens-file absent.toml\n```\n"
    ),
    "given": "<!-- docs-test: given no-such-fixture -->\n```sh\ntrue\n```\n",
}


@pytest.mark.parametrize("kind", BROKEN)
def test_a_broken_block_is_caught(short_tmp: Path, kind: str) -> None:
    """Negative control: a block that fails as written (a mistyped command,
    name or value, a daemon that cannot start, an unknown fixture) is a
    failure that names its line."""
    page = short_tmp / "page.md"
    page.write_text(f"# A page\n\nSome text.\n\n{BROKEN[kind]}")
    (short_tmp / "box").mkdir()
    with docs.sandbox(short_tmp / "box") as box:
        report = docs.run_document(page, box)
    assert len(report.failures) == 1
    assert report.failures[0].startswith(f"{page}:")


def test_a_new_block_runs_by_default_and_a_skipped_one_does_not(
    short_tmp: Path,
) -> None:
    """A block without a marker runs; `skip` and an absent `needs` tool keep
    a block from running, and say so."""
    page = short_tmp / "page.md"
    page.write_text(
        "```sh\ntouch ran\n```\n\n"
        "<!-- docs-test: skip (Kubernetes) -->\n```sh\ntouch skipped\n```\n\n"
        "<!-- docs-test: needs no-such-tool-here -->\n```sh\ntouch needed\n```\n"
    )
    (short_tmp / "box").mkdir()
    with docs.sandbox(short_tmp / "box") as box:
        report = docs.run_document(page, box)
    assert report.failures == []
    made = [n for n in ("ran", "skipped", "needed") if (short_tmp / "box" / n).exists()]
    assert made == ["ran"]
    assert [s.split(": ", 1)[1] for s in report.skipped] == [
        "(Kubernetes)",
        "needs no-such-tool-here, not installed here",
    ]


def test_an_unknown_marker_is_refused() -> None:
    """A misspelt marker is an error, not a block that silently runs."""
    with pytest.raises(docs.MarkerError, match="line 1"):
        docs.blocks("<!-- docs-test: skp (typo) -->\n```sh\ntrue\n```\n")
