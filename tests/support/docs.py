"""Runs the fenced code blocks of a Markdown document as a reader would.

Each document gets a sandbox: a temporary directory (the reader's checkout,
installed) holding the `Makefile`, `.venv` (this checkout's virtual
environment, entry by entry, with the marker `make` leaves once it has
installed it, so that `make run` starts the daemon at once), `home/` (HOME)
and, for JavaScript, `clients/node/` (the Node package). A document that
starts its daemon itself, as README.md does with `make run`, gets nothing
more; any other gets `.effectd/`, the data directory of a real daemon
started for it (its socket is the `.effectd/effectd.sock` that `make run`
serves, its policy file `policy.toml`).
Blocks run in document order, each in its own process with the sandbox as
the working directory and the virtual environment first on PATH:

- `sh`, `bash`, `shell`: `bash -e -o pipefail -c BLOCK`, so any failing
  command fails the block;
- `python`: the virtual environment's Python; it must write nothing to
  stderr (a warning every reader of the example would see);
- `js`, `javascript`: saved as `clients/node/example.js` (inside the
  package, as the Node README says) and run by `node` from the sandbox;
  it must also write nothing to stderr (the example reports refusals
  there and exits 0);
- `toml`: parsed with `tomllib`.

Other blocks (diagrams, output) are not code. A block runs unless an HTML
comment on the line before it says otherwise (`MARKER`):

- `<!-- docs-test: skip (WHY) -->`: never runs here (Kubernetes, systemd,
  podman, the network); the reason is required;
- `<!-- docs-test: needs TOOL -->`: runs where TOOL is on PATH;
- `<!-- docs-test: given FIXTURE -->`: the daemon holds FIXTURE's records
  (`FIXTURES`) before the block runs;
- `<!-- docs-test: serves -->`: the block ends by starting a daemon in the
  foreground (`effectd serve`, or `make run`); it must say it is ready,
  serves the blocks after it, and must stop cleanly at the end of the
  document: SIGTERM to the daemon (the processes of the block other than
  its first, or the first when alone), then exit 0.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import tomllib
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from effectd_client import Channel, Client
from sidecar.config import ServeConfig
from sidecar.testing import RunningDaemon, running_daemon
from tests.support.processes import ROOT

MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<kind>\S+)\s*(?P<arg>.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
_SHELL = ("sh", "bash", "shell")
_JS = ("js", "javascript")
# What running the blocks leaves that the harness, not a block, made.
HARNESS_FILES = frozenset({".block-out", ".block-err", "clients"})
BLOCK_TIMEOUT = 60.0
READY_TIMEOUT = 30.0
_NODE_PACKAGE = ROOT / "clients" / "node"


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced block: where it starts, its language, code and marker."""

    line: int
    lang: str
    code: str
    marker: str = ""
    arg: str = ""


class MarkerError(ValueError):
    """A `docs-test` comment the runner does not understand."""


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, each with the marker on the
    nearest non-blank line before it."""
    lines = text.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        indent, start = fence["indent"], i
        end = start + 1
        while end < len(lines) and lines[end].rstrip() != f"{indent}```":
            end += 1
        code = textwrap.dedent("\n".join(lines[start + 1 : end])) + "\n"
        kind, arg = _marker(lines, start)
        found.append(Block(start + 1, fence["lang"].lower(), code, kind, arg))
        i = end + 1
    return found


def _marker(lines: list[str], fence: int) -> tuple[str, str]:
    before = fence - 1
    while before >= 0 and not lines[before].strip():
        before -= 1
    if before < 0 or "docs-test" not in lines[before]:
        return "", ""
    match = MARKER.match(lines[before])
    kind = match["kind"] if match else ""
    arg = match["arg"] if match else ""
    if kind not in ("skip", "needs", "given", "serves") or (
        kind in ("skip", "needs", "given") and not arg
    ):
        raise MarkerError(f"line {before + 1}: not a docs-test marker: {lines[before]}")
    return kind, arg


def _calls_to_handle(daemon: RunningDaemon) -> None:
    """run-1: call-7 and call-8 await approval; call-9 and call-11 are
    UNKNOWN (reported), call-10's attempt held a lease of 1 ms that ran out
    (the calls the ctl examples approve, reject and reconcile). "Never
    executed" waits out a quarantine of 3 leases after the outcome became
    unknown: call-10's (3 ms from its lease's end) is over before a reader's
    command can run; call-11's (90 s) is not, so its example confirms that
    the attempt is dead."""
    with Client(daemon.target) as client:
        for call_id in ("call-7", "call-8"):
            client.prepare_tool(
                "run-1",
                call_id,
                "send_payment",
                {"cents": 1200, "call": call_id},
                require_approval=True,
            )
        for call_id in ("call-9", "call-11"):
            held = client.prepare_tool(
                "run-1", call_id, "charge", {"cents": 500, "call": call_id}, start=True
            )
            client.report_unknown("run-1", call_id, held.call.attempt, "lost")
        client.prepare_tool(
            "run-1", "call-10", "charge", {"cents": 500}, start=True, lease_ms=1
        )


def _unknown(
    daemon: RunningDaemon,
    run_id: str,
    tool: str,
    inputs: list[Any],
    channel: Channel = Channel.TOOL,
) -> None:
    """Calls call-1, call-2... of `run_id`, one per input, UNKNOWN after
    their attempt 1 (reported: their agent lost the connection)."""
    with Client(daemon.target) as client:
        for n, value in enumerate(inputs, start=1):
            call_id = f"call-{n}"
            held = client.prepare_tool(
                run_id, call_id, tool, value, start=True, channel=channel
            )
            client.report_unknown(run_id, call_id, held.call.attempt, "lost")


def _mcp_calls_unknown(daemon: RunningDaemon) -> None:
    """mcp-run-2: MCP calls of `send` on the server the operator names
    `mail`, UNKNOWN, for the MCP page's reconcile examples."""
    inputs = [
        {"server": "mail", "tool": "send", "arguments": {"to": to}}
        for to in ("ann", "bo")
    ]
    _unknown(daemon, "mcp-run-2", "mcp://mail/send", inputs, Channel.MCP)


def _langgraph_calls_unknown(daemon: RunningDaemon) -> None:
    """trip-2: two calls of `book`, UNKNOWN, for the LangGraph page."""
    _unknown(daemon, "trip-2", "book", [{"city": "Paris"}, {"city": "Rome"}])


def _agents_calls_unknown(daemon: RunningDaemon) -> None:
    """mail-run-3: two calls of `send_email`, UNKNOWN, for the Agents SDK
    page."""
    inputs = [{"to": "ann@example.com", "body": "Hi"}, {"to": "bo@example.com"}]
    _unknown(daemon, "mail-run-3", "send_email", inputs)


def _pydantic_ai_calls_unknown(daemon: RunningDaemon) -> None:
    """refund-order-b: two calls of `refund`, UNKNOWN, for the Pydantic AI
    page."""
    _unknown(daemon, "refund-order-b", "refund", [{"order": "b"}, {"order": "c"}])


FIXTURES: dict[str, Callable[[RunningDaemon], None]] = {
    "calls-to-handle": _calls_to_handle,
    "mcp-calls-unknown": _mcp_calls_unknown,
    "langgraph-calls-unknown": _langgraph_calls_unknown,
    "agents-calls-unknown": _agents_calls_unknown,
    "pydantic-ai-calls-unknown": _pydantic_ai_calls_unknown,
}


@dataclass(slots=True)
class Report:
    """What running one document did: blocks run, skipped, failed."""

    ran: list[int] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


class _Server:
    """A `serves` block: its process group and everything it printed."""

    def __init__(self, line: int, command: list[str], sandbox: Sandbox) -> None:
        self.line = line
        self.output: list[str] = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(
            command,
            cwd=sandbox.root,
            env=sandbox.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if " ready on " in line:
                self.ready.set()
        self.ready.set()  # ended: whoever waits looks at the process

    def stop(self) -> int:
        """SIGTERM to the daemon (the group's processes but its leader, a
        shell or `make` waiting for the daemon; the leader when alone); its
        exit status (-9 if it had to be killed)."""
        if self.proc.poll() is None:
            for pid in _group(self.proc.pid) or [self.proc.pid]:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=BLOCK_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                return -9
        self._reader.join(timeout=BLOCK_TIMEOUT)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


def _group(pgid: int) -> list[int]:
    """The processes of group `pgid` other than its leader."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError):
            # pid (comm) state ppid pgrp ...; comm may hold spaces.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            pid = int(stat.parent.name)
            if int(fields[2]) == pgid and pid != pgid:
                found.append(pid)
    return found


@dataclass(slots=True)
class Sandbox:
    """The reader's directory, environment and daemon for one document
    (None: the document starts its own)."""

    root: Path
    daemon: RunningDaemon | None
    env: dict[str, str]
    given: set[str] = field(default_factory=set)
    servers: list[_Server] = field(default_factory=list)


def _installed_checkout(root: Path) -> None:
    """`root` as a checkout `make` has installed: the Makefile, the files
    its install step depends on (older than its marker), and `.venv`, this
    environment's entries each linked, with the marker of its own."""
    shutil.copy(ROOT / "Makefile", root / "Makefile")
    for name in ("pyproject.toml", "clients/python/pyproject.toml"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
        os.utime(root / name, (0, 0))
    venv = root / ".venv"
    venv.mkdir()
    for entry in Path(sys.prefix).iterdir():
        if not entry.name.startswith("."):
            (venv / entry.name).symlink_to(entry)
    (venv / ".installed").touch()


@contextmanager
def sandbox(root: Path, *, daemon: bool = True) -> Iterator[Sandbox]:
    """`root` made into a reader's installed checkout, with a daemon serving
    `.effectd/effectd.sock` unless the document starts its own (`daemon`
    false); its daemons are stopped on the way out."""
    _installed_checkout(root)
    (root / "home").mkdir()
    policy = root / "policy.toml"
    policy.write_text("")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EFFECTD_", "GRPC_", "OTEL_", "PYTEST_"))
    }
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        HOME=str(root / "home"),
        USER="docs-reader",
    )
    config = ServeConfig(data_dir=root / ".effectd", init=True, policy_file=policy)
    with ExitStack() as stack:
        running = stack.enter_context(running_daemon(config)) if daemon else None
        box = Sandbox(root, running, env)
        try:
            yield box
        finally:
            for server in box.servers:
                server.stop()


def run_document(path: Path, box: Sandbox) -> Report:
    """Runs every block of the Markdown file `path` in `box`, in order."""
    report = Report()
    name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    for block in blocks(path.read_text()):
        where = f"{name}:{block.line}"
        problem = _run(block, box, report, where)
        if problem is not None:
            report.failures.append(f"{where} ({block.lang}): {problem}")
    for server in box.servers:
        status = server.stop()
        if status != 0:
            tail = "".join(server.output[-20:])
            report.failures.append(
                f"{name}:{server.line}: the daemon it started exited {status} "
                f"on SIGTERM:\n{tail}"
            )
    box.servers.clear()
    return report


def _run(block: Block, box: Sandbox, report: Report, where: str) -> str | None:
    """Runs one block; the problem, or None when it ran or was skipped."""
    command = _command(block)
    if command is None and block.lang != "toml":
        return None  # not code
    skipped = _skip_reason(block, box)
    if skipped is not None:
        report.skipped.append(f"{where}: {skipped}")
        return None
    report.ran.append(block.line)
    problem = _given(block, box)
    if problem is not None:
        return problem
    if command is None:
        return _toml_problem(block.code)
    if block.marker == "serves":
        return _serve(block, command, box)
    return _execute(block, command, box)


def _skip_reason(block: Block, box: Sandbox) -> str | None:
    if block.marker == "skip":
        return block.arg
    if block.marker == "needs" and shutil.which(block.arg) is None:
        return f"needs {block.arg}, not installed here"
    if block.lang in _JS and not _prepare_node(box.root):
        return "needs node and `npm ci` in clients/node"
    return None


def _given(block: Block, box: Sandbox) -> str | None:
    """Sets up the block's fixture, once per document."""
    if block.marker != "given" or block.arg in box.given:
        return None
    fixture = FIXTURES.get(block.arg)
    if fixture is None:
        return f"no fixture named {block.arg!r} (known: {', '.join(FIXTURES)})"
    if box.daemon is None:
        return f"{block.arg!r} needs the daemon of the test, and this document has none"
    fixture(box.daemon)
    box.given.add(block.arg)
    return None


def _toml_problem(code: str) -> str | None:
    try:
        tomllib.loads(code)
    except tomllib.TOMLDecodeError as exc:
        return f"not valid TOML: {exc}"
    return None


def _command(block: Block) -> list[str] | None:
    if block.lang in _SHELL:
        return ["bash", "-e", "-o", "pipefail", "-c", block.code]
    if block.lang == "python":
        return [sys.executable, "-c", block.code]
    if block.lang in _JS:
        return ["node", "clients/node/example.js"]
    return None


def _execute(block: Block, command: list[str], box: Sandbox) -> str | None:
    if block.lang in _JS:
        (box.root / "clients" / "node" / "example.js").write_text(block.code)
    out, err = box.root / ".block-out", box.root / ".block-err"
    # Files, not pipes: a command the block leaves running in the background
    # would hold a pipe open; its process group is ended below.
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            command,
            cwd=box.root,
            env=box.env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _end_group(proc.pid)
            proc.wait()
    output = out.read_text() + err.read_text()
    if code is None:
        return f"still running after {BLOCK_TIMEOUT:g} s:\n{output[-2000:]}"
    if code != 0:
        return f"exit {code}:\n{output[-2000:]}"
    if block.lang in (*_JS, "python") and err.read_text():
        return f"wrote to stderr:\n{err.read_text()[-2000:]}"
    return None


def _end_group(pgid: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)


def _serve(block: Block, command: list[str], box: Sandbox) -> str | None:
    server = _Server(block.line, command, box)
    server.ready.wait(timeout=READY_TIMEOUT)
    if server.proc.poll() is None and any(" ready on " in x for x in server.output):
        box.servers.append(server)
        return None
    server.stop()
    tail = "".join(server.output[-20:])
    return f"the daemon it starts did not get ready:\n{tail}"


def _prepare_node(root: Path) -> bool:
    """`clients/node/` in the sandbox as the package (package.json, src,
    node_modules of this checkout); False without node or `npm ci`."""
    if shutil.which("node") is None or not (_NODE_PACKAGE / "node_modules").is_dir():
        return False
    package = root / "clients" / "node"
    if not package.exists():
        package.mkdir(parents=True)
        shutil.copy(_NODE_PACKAGE / "package.json", package / "package.json")
        # The package finds the protos of this checkout from its real path.
        for name in ("src", "node_modules"):
            (package / name).symlink_to(_NODE_PACKAGE / name)
    return True
