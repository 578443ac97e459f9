"""The client's build: the synchronous modules written from the asyncio ones.

Everything else about the package is in pyproject.toml. The synchronous
client (`_client.py`, `_safe.py`, `_operator.py`) is build output, not kept in
git: every build (a wheel, an sdist, an editable install) writes it first with
`unasync.py` beside this file, so an installed client holds it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import unasync


class BuildPy(build_py):
    def run(self) -> None:
        unasync.write()
        super().run()


class Sdist(sdist):
    def run(self) -> None:
        unasync.write()
        super().run()


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
