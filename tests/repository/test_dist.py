"""`make dist` builds the packages a user installs from this checkout
(issue 25 item 14; none is published): the daemon's and the Python client's
wheels and sdists, and the Node client's npm tarball. Each wheel installs
into a fresh virtual environment and works there from its own files; the
tarball carries the protos the Node client loads."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import venv
from pathlib import Path

import pytest

from tests.support.processes import ROOT

pytestmark = pytest.mark.slow


def _make_dist(out: Path) -> None:
    """`make dist` into `out` (the installed venv is used as it is, not
    installed again)."""
    prefix = Path(sys.prefix)
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            f"VENV={prefix}",
            "-o",
            str(prefix / ".dev-installed"),
            "-o",
            str(prefix / ".installed"),
            "dist",
            f"DIST={out}",
        ],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_make_dist_builds_packages_that_install_and_work(tmp_path: Path) -> None:
    """One test, so that a single `make dist` runs at a time (it builds in
    the checkout's build/)."""
    dist = tmp_path / "dist"
    _make_dist(dist)
    _every_package(dist)
    _client_wheel(dist, tmp_path / "client")
    _daemon_wheel(dist, tmp_path / "daemon")
    _npm_tarball(dist)


def _every_package(dist: Path) -> None:
    assert sorted(p.name for p in dist.iterdir()) == [
        "effectd-0.1.0-py3-none-any.whl",
        "effectd-0.1.0.tar.gz",
        "effectd-client-0.1.0.tgz",
        "effectd_client-0.1.0-py3-none-any.whl",
        "effectd_client-0.1.0.tar.gz",
    ]


def _fresh(directory: Path) -> Path:
    """A new virtual environment whose own site-packages comes first; the
    dependencies (grpcio, protobuf, ...) are found after it, in this test's
    environment, so that nothing is downloaded."""
    venv.create(directory, with_pip=False)
    python = directory / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = next(p for p in sys.path if p.endswith("site-packages"))
    (Path(site) / "zz-dependencies.pth").write_text(ours + "\n")
    return python


def _install(python: Path, wheel: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )


def _client_wheel(dist: Path, tmp_path: Path) -> None:
    """Installed alone, it imports from its own files."""
    tmp_path.mkdir()
    python = _fresh(tmp_path / "venv")
    _install(python, dist / "effectd_client-0.1.0-py3-none-any.whl")
    done = subprocess.run(
        [
            str(python),
            "-c",
            "import effectd_client, effectd.v1.ledger_pb2 as pb\n"
            "print(effectd_client.__file__)\n"
            "print(pb.__file__)\n"
            "print(effectd_client.Client.__name__, pb.ToolCall.__name__)\n",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    client, stubs, names = done.stdout.splitlines()
    assert client.startswith(str(tmp_path / "venv"))
    assert stubs.startswith(str(tmp_path / "venv"))
    assert names == "Client ToolCall"


def _daemon_wheel(dist: Path, tmp_path: Path) -> None:
    """Installed, `effectd` runs and the console's static files are there."""
    tmp_path.mkdir()
    python = _fresh(tmp_path / "venv")
    _install(python, dist / "effectd_client-0.1.0-py3-none-any.whl")
    _install(python, dist / "effectd-0.1.0-py3-none-any.whl")
    effectd = tmp_path / "venv" / "bin" / "effectd"
    version = subprocess.run(
        [str(effectd), "--version"], capture_output=True, text=True, check=True
    )
    assert version.stdout.strip() == "effectd 0.1.0"
    where = subprocess.run(
        [str(python), "-c", "import sidecar.web; print(sidecar.web.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    package = Path(where.stdout.strip()).parent
    assert package.is_relative_to(tmp_path / "venv")
    assert (package / "static" / "live.js").is_file()


def _npm_tarball(dist: Path) -> None:
    """It carries the sources and the protos the client loads."""
    with tarfile.open(dist / "effectd-client-0.1.0.tgz") as tar:
        names = set(tar.getnames())
    for name in (
        "package/package.json",
        "package/src/index.js",
        "package/src/index.d.ts",
        "package/protos/effectd/v1/ledger.proto",
        "package/protos/effectd/v1/errors.proto",
        "package/protos/google/rpc/status.proto",
    ):
        assert name in names, name
