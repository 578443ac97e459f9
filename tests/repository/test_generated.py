"""The committed generated code matches the .proto files; the synchronous
client, build output, is what its asyncio source makes, and a build of the
client writes it."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from scripts import gen_protos

ROOT = Path(__file__).resolve().parents[2]
_GENERATOR = ROOT / "clients" / "python" / "unasync.py"
_spec = importlib.util.spec_from_file_location("unasync", _GENERATOR)
assert _spec is not None
assert _spec.loader is not None
unasync = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(unasync)


@pytest.mark.slow
def test_generated_code_is_fresh() -> None:
    """`make protos` would change nothing."""
    run = subprocess.run(
        [sys.executable, "scripts/gen_protos.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr


@pytest.mark.slow
def test_negative_control_stale_code_is_detected(tmp_path: Path) -> None:
    """An edited or missing generated file is reported as stale."""
    committed = ROOT / "clients" / "python" / "src" / "effectd"
    copy = tmp_path / "effectd"
    shutil.copytree(committed, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "v1" / "ledger_pb2.py").write_text("# edited\n")
    (copy / "v1" / "errors_pb2.pyi").unlink()
    found = gen_protos.differences(committed, copy)
    assert "stale: v1/ledger_pb2.py" in found
    assert "missing: v1/errors_pb2.pyi" in found


# -- the synchronous client, written from the asyncio one (clients/python/unasync.py)


@pytest.mark.slow
def test_the_synchronous_client_is_fresh() -> None:
    """`clients/python/unasync.py` would change no synchronous module (`make`
    writes them before it tests)."""
    run = subprocess.run(
        [sys.executable, str(_GENERATOR), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr


@pytest.mark.slow
def test_negative_control_a_hand_edit_or_a_drifted_source_is_stale(
    tmp_path: Path,
) -> None:
    """A synchronous module edited by hand, or an asyncio source changed
    without regenerating, is reported by `--check`'s comparison."""
    client = tmp_path / "effectd_client"
    shutil.copytree(
        unasync.CLIENT, client, ignore=shutil.ignore_patterns("__pycache__")
    )
    assert unasync.stale(client) == []
    sync = client / "_client.py"
    fresh = sync.read_text()
    sync.write_text(fresh.replace("time.sleep(wait)", "time.sleep(wait * 2)"))
    assert unasync.stale(client) == ["_client.py"]
    sync.write_text(fresh)
    source = client / "_aio.py"
    source.write_text(source.read_text().replace("tries += 1", "tries += 2"))
    assert unasync.stale(client) == ["_client.py"]
    (client / "_safe.py").unlink()
    assert unasync.stale(client) == ["_client.py", "_safe.py"]
    assert unasync.write(client) == ["_client.py", "_safe.py"]
    assert unasync.stale(client) == []
    assert unasync.write(client) == []


def test_the_synchronous_client_is_not_kept_in_git() -> None:
    """The synchronous modules are build output: ignored, never tracked, so
    no copy of the asyncio code lives in the repository. The control: their
    asyncio sources are tracked, and a file git does not ignore is seen as
    such."""
    client = "clients/python/src/effectd_client/"
    synchronous = [client + target for _, target in unasync.PAIRS]
    sources = [client + source for source, _ in unasync.PAIRS]

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout

    assert git("ls-files", "--", *synchronous) == ""
    assert git("check-ignore", *synchronous).split() == synchronous
    assert sorted(git("ls-files", "--", *sources).split()) == sorted(sources)
    assert git("check-ignore", *sources) == ""


@pytest.mark.slow
def test_a_build_of_the_client_alone_writes_the_synchronous_client(
    tmp_path: Path,
) -> None:
    """A wheel built from the client's sources with no synchronous module in
    them (a clean checkout, an sdist) holds each one, as its asyncio source
    makes it: an installed client needs no step of its own."""
    tree = tmp_path / "python"
    shutil.copytree(
        ROOT / "clients" / "python",
        tree,
        ignore=shutil.ignore_patterns(
            "__pycache__",
            "*.egg-info",
            "build",
            *(target for _, target in unasync.PAIRS),
        ),
    )
    client = tree / "src" / "effectd_client"
    assert not any((client / target).exists() for _, target in unasync.PAIRS)
    run = subprocess.run(
        [
            sys.executable,
            *("-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"),
            *("--wheel-dir", str(tmp_path / "dist"), str(tree)),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    (wheel,) = (tmp_path / "dist").glob("effectd_client-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        for source, target in unasync.PAIRS:
            text = (client / source).read_text()
            held = archive.read("effectd_client/" + target).decode()
            assert held == unasync.generated(source, target, text)


@pytest.mark.parametrize(
    ("source", "sync"),
    [
        ("async def f() -> None:\n", "def f() -> None:\n"),
        ("    x = await g()\n", "    x = g()\n"),
        ("    async with a as b:\n", "    with a as b:\n"),
        ("    y = [p async for p in q]\n", "    y = [p for p in q]\n"),
        ("c: Callable[..., Awaitable[T]]\n", "c: Callable[..., T]\n"),
        ("await asyncio.sleep(1)\n", "time.sleep(1)\n"),
        ("AsyncClient(AsyncSession())\n", "Client(Session())\n"),
        ("def __aenter__(self): ...\n", "def __enter__(self): ...\n"),
        ('describe("AsyncClient")\n', 'describe("Client")\n'),
        # Strings and comments are text: only a string that is just a name.
        ('s = "await AsyncClient()"\n', 's = "await AsyncClient()"\n'),
        ("x = 1  # awaits AsyncClient\n", "x = 1  # awaits AsyncClient\n"),
        ("t: float = 1,  # noqa: ASYNC109 - why\n", "t: float = 1,\n"),
        ('"""Doc: async def f."""\n', '"""Doc: async def f."""\n'),
        (
            "a()\n# unasync: async-only\nawait b()\n# unasync: end\nc()\n",
            "a()\nc()\n",
        ),
        (
            "a()\n# unasync: sync-only\n# d(AsyncClient)\n# unasync: end\n",
            "a()\nd(Client)\n",
        ),
    ],
)
def test_each_rule_writes_the_synchronous_line(source: str, sync: str) -> None:
    assert unasync.unasync(source) == sync
