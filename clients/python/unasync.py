"""Writes the synchronous client from the asyncio one, or checks that it is fresh.

The asyncio modules of `effectd_client` are the single source of each pair
in `PAIRS`; the synchronous module is written from it by explicit rules, as
httpcore writes its sync package, so the two cannot drift:

- in code (never inside a string or a comment) the names of `NAMES` become
  their synchronous twins, `async def`/`async with`/`async for` lose their
  `async`, `await` goes, `Awaitable[T]` becomes `T` and `grpc.aio.Channel`
  `grpc.Channel`;
- a comment `# noqa: ASYNC...` goes with the `async` it was about;
- lines between `# unasync: async-only` and `# unasync: end` are the asyncio
  module's own and are left out; lines between `# unasync: sync-only` and
  `# unasync: end` are comments in the asyncio module and code in the
  synchronous one (what only the synchronous side does is kept short there:
  a call of a hand-written module such as `effectd_client._client_sync`).

The result has unused imports removed, imports sorted and is formatted by
ruff, with settings of its own (the same on every machine, whatever the
configuration around it), and a first line saying where it comes from.

The synchronous modules are not kept in git (`.gitignore`): they are build
output. The client's build writes them (`setup.py`, so a wheel or sdist holds
them and an installed client needs no step of its own), and so does `make`
in a checkout, before it runs or checks anything, whenever an asyncio source
or this file changed. `--check` fails, naming the file, when a synchronous
module in the tree is not what its source makes.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Callable, Sequence
from pathlib import Path

CLIENT = Path(__file__).resolve().parent / "src" / "effectd_client"

# asyncio source -> the synchronous module written from it.
PAIRS: Sequence[tuple[str, str]] = (
    ("_aio.py", "_client.py"),
    ("_safe_aio.py", "_safe.py"),
    ("_operator_aio.py", "_operator.py"),
)

NAMES = {
    "_aio": "_client",
    "AsyncClient": "Client",
    "AsyncRun": "Run",
    "AsyncSafeTool": "SafeTool",
    "AbstractAsyncContextManager": "AbstractContextManager",
    "asynccontextmanager": "contextmanager",
    "AsyncSession": "Session",
    "AsyncIterator": "Iterator",
    "_session_aio": "_session",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "aio_channel": "channel",
    "_operator_aio": "_operator",
    "AsyncAdmin": "Admin",
    "AsyncOperator": "Operator",
    "AsyncSend": "Send",
    "ToolLedgerAsyncStub": "ToolLedgerStub",
    "RecoveryAsyncStub": "RecoveryStub",
}
CODE_RULES: Sequence[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = (
    (re.compile(r"\basync\s+(?=(def|with|for)\b)"), ""),
    (re.compile(r"\bawait\s+"), ""),
    (re.compile(r"\bAwaitable\[(\w+)\]"), r"\1"),
    (re.compile(r"\basyncio\.sleep\b"), "time.sleep"),
    (re.compile(r"\bgrpc\.aio\.Channel\b"), "grpc.Channel"),
    (
        re.compile(r"\b(" + "|".join(map(re.escape, NAMES)) + r")\b"),
        lambda m: NAMES[m.group(1)],
    ),
)
NOQA_ASYNC = re.compile(r"\s*#\s*noqa:\s*ASYNC\d+.*$")
MARKER = re.compile(r"^\s*# unasync: (async-only|sync-only|end)\s*$")
HEADER = (
    "# Generated from {source} by clients/python/unasync.py at build time:"
    " edit that file, not this.\n"
)
# ruff's settings for the generated text, given on the command line with no
# configuration file read (`--isolated`), so that a build of the client alone
# writes what a checkout's `make` writes.
RUFF_SETTINGS = (
    "line-length = 88",
    "target-version = 'py311'",
    "lint.isort.known-first-party = ['effectd_client']",
    "lint.isort.known-third-party = ['effectd']",
)


def _protected(source: str) -> dict[int, list[tuple[int, int]]]:
    """Line (1-based) -> the column spans of its strings (a span to -1 runs
    to the end of the line), but a string that is just a name of `NAMES`."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.STRING or token.string.strip("'\"") in NAMES:
            continue
        (row, col), (end_row, end_col) = token.start, token.end
        for line in range(row, end_row + 1):
            start = col if line == row else 0
            end = end_col if line == end_row else -1
            spans.setdefault(line, []).append((start, end))
    return spans


def _code(text: str) -> str:
    for pattern, replacement in CODE_RULES:
        text = pattern.sub(replacement, text)
    return text


def _line(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` with the rules applied outside its strings and its comment."""
    out, at = [], 0
    for start, end in sorted(spans):
        out.append(_code(text[at:start]))
        stop = len(text) if end == -1 else end
        out.append(text[start:stop])
        at = stop
    rest = text[at:]
    code, hash_, comment = rest.partition("#")
    out.append(_code(code))
    if hash_:
        out.append(NOQA_ASYNC.sub("", hash_ + comment))
    return "".join(out).rstrip() + ("\n" if text.endswith("\n") else "")


def unasync(source: str) -> str:
    """The synchronous module's text (before ruff) from the asyncio one's."""
    spans = _protected(source)
    out: list[str] = []
    block = ""
    for number, text in enumerate(source.splitlines(keepends=True), 1):
        marker = MARKER.match(text)
        if marker:
            block = "" if marker.group(1) == "end" else marker.group(1)
            continue
        if block == "async-only":
            continue
        if block == "sync-only":
            indent = text[: len(text) - len(text.lstrip())]
            body = text.lstrip()
            if not body.startswith("#"):
                raise SystemExit(f"line {number}: a sync-only line is a comment")
            out.append(_code(indent + body[2:] if body.startswith("# ") else "\n"))
            continue
        out.append(_line(text, spans.get(number, [])))
    return "".join(out)


def _ruff(text: str, name: str, *args: str) -> str:
    answer = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            *args,
            "--isolated",
            *(arg for setting in RUFF_SETTINGS for arg in ("--config", setting)),
            "--stdin-filename",
            name,
            "-",
        ],
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )
    if answer.returncode not in (0, 1) or not answer.stdout:
        raise SystemExit(f"ruff {args[0]} failed on {name}:\n{answer.stderr}")
    return answer.stdout


def generated(source_name: str, target_name: str, source: str) -> str:
    """The text of `target_name` that `source` makes."""
    text = HEADER.format(source=source_name) + unasync(source)
    name = str(CLIENT / target_name)
    text = _ruff(text, name, "check", "--fix", "--select", "F401,I", "--quiet")
    return _ruff(text, name, "format")


def stale(client: Path = CLIENT) -> list[str]:
    """The synchronous modules that are missing or differ from what their
    sources make."""
    return [
        target
        for source, target in PAIRS
        if not (client / target).is_file()
        or (client / target).read_text()
        != generated(source, target, (client / source).read_text())
    ]


def write(client: Path = CLIENT) -> list[str]:
    """Writes the synchronous modules of `client` that are missing or stale;
    returns their names. A fresh module is left as it is (its time too)."""
    written = []
    for source, target in PAIRS:
        text = generated(source, target, (client / source).read_text())
        path = client / target
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            written.append(target)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="fail when a generated file is stale"
    )
    args = parser.parse_args(argv)
    if args.check:
        old = stale()
        for target in old:
            print(f"{CLIENT / target}: stale, run make unasync", file=sys.stderr)
        return 1 if old else 0
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
