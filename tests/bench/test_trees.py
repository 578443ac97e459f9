"""The A/B benchmarks' source trees: a new checkout or worktree holds no
synchronous Python client modules (build output), so a tree is given them
before its daemon or callers import its client."""

from __future__ import annotations

import shutil
from pathlib import Path

import hotpath

ROOT = Path(__file__).resolve().parents[2]
CLIENT = Path("clients/python/src/effectd_client")
GENERATED = ("_client.py", "_safe.py", "_operator.py")


def test_a_tree_without_its_sync_client_gets_it_written(tmp_path: Path) -> None:
    (tmp_path / CLIENT).mkdir(parents=True)
    shutil.copy(ROOT / "clients/python/unasync.py", tmp_path / "clients/python")
    for source in ("_aio.py", "_safe_aio.py", "_operator_aio.py"):
        shutil.copy(ROOT / CLIENT / source, tmp_path / CLIENT)
    env = hotpath.tree_env(tmp_path)
    for name in GENERATED:
        assert (tmp_path / CLIENT / name).read_text() == (
            ROOT / CLIENT / name
        ).read_text()
    assert str(tmp_path / "clients/python/src") in env["PYTHONPATH"]


def test_a_tree_from_before_the_generator_is_left_as_it_is(tmp_path: Path) -> None:
    """Its sync modules are committed: nothing is run, nothing written."""
    (tmp_path / CLIENT).mkdir(parents=True)
    hotpath.write_client(tmp_path)
    assert list((tmp_path / CLIENT).iterdir()) == []
