"""The data directory at start: a daemon creates a ledger only when asked
(`--init`), and says so in its log; a directory that holds none is refused
without it, before anything is created; a place that cannot hold one is
refused with exit 2 and `effectd: --data-dir: <why>`, never a traceback.

`effectd serve` runs in this process (`sidecar.cli.main`) with a daemon that
stops as soon as it has started, raising `Served`: a test that expects a
refusal fails on `Served` if the daemon would have served instead."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from effectd_client import Client, Decision
from sidecar.cli import main
from sidecar.config import ConfigError, ServeConfig
from sidecar.server import Daemon, Endpoints
from sidecar.testing import running_daemon

CREATED = "created a new, empty ledger at"


class Served(Exception):
    """The daemon started: it would have served."""


class StartsThenStops(Daemon):
    async def start(self) -> Endpoints:
        endpoints = await super().start()
        await self.stop(grace=0)
        raise Served(endpoints.unix)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No EFFECTD_* setting from the environment; the umask `main` sets is
    put back."""
    for name in list(os.environ):
        if name.startswith("EFFECTD_"):
            monkeypatch.delenv(name)
    umask = os.umask(0o077)
    os.umask(umask)
    yield
    os.umask(umask)


def serve(*argv: str) -> int:
    return main(["serve", "--log-format", "text", *argv], daemon_class=StartsThenStops)


def last_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.splitlines()[-1]


def test_a_data_directory_that_does_not_exist_is_refused_and_not_created(
    short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped --data-dir: exit 2, naming --init, and the tree is not
    created (issue 25 item 2: fails before the fix: the daemon created the
    whole tree and served a new, empty ledger, without a log line)."""
    path = short_tmp / "nonexistent" / "deep" / "dir"
    assert serve("--data-dir", str(path)) == 2
    assert last_line(capsys) == (
        f"effectd: --data-dir: {path} does not exist: pass --init to create a "
        "new, empty ledger there; to serve an existing ledger, name its directory"
    )
    assert not (short_tmp / "nonexistent").exists()
    with pytest.raises(Served):
        serve("--data-dir", str(path), "--init")
    assert f"{CREATED} {path}" in capsys.readouterr().err
    assert (path / "data.mdb").stat().st_size > 0


def _empty(path: Path) -> None:
    path.mkdir(mode=0o700)


def _lock_files_only(path: Path) -> None:
    """What a refused daemon, or one serving --store, leaves behind."""
    _empty(path)
    for name in ("effectd.lock", "effectd.sock.lock", "lock.mdb"):
        (path / name).write_bytes(b"")


def _empty_data_file(path: Path) -> None:
    """Created, never written."""
    _empty(path)
    (path / "data.mdb").write_bytes(b"")


@pytest.mark.parametrize(
    ("make", "found"),
    [
        (_empty, "no data.mdb"),
        (_lock_files_only, "no data.mdb"),
        (_empty_data_file, "an empty data.mdb"),
    ],
    ids=["empty-directory", "lock-files-only", "empty-data-file"],
)
def test_a_directory_without_a_ledger_needs_init(
    short_tmp: Path,
    capsys: pytest.CaptureFixture[str],
    make: Callable[[Path], None],
    found: str,
) -> None:
    """What does not count as a ledger is refused without --init, left as it
    was, and made a new ledger with it, logged (issue 25 item 2)."""
    path = short_tmp / "data"
    make(path)
    before = sorted(p.name for p in path.iterdir())
    assert serve("--data-dir", str(path)) == 2
    assert last_line(capsys) == (
        f"effectd: --data-dir: {path} holds no ledger ({found}): pass --init to "
        "create a new, empty ledger there; to serve an existing ledger, name its "
        "directory"
    )
    assert sorted(p.name for p in path.iterdir()) == before
    assert not (path / "data.mdb").exists() or not (path / "data.mdb").stat().st_size
    with pytest.raises(Served):
        serve("--data-dir", str(path), "--init")
    assert f"{CREATED} {path}" in capsys.readouterr().err


def test_the_environment_and_the_file_ask_for_a_new_ledger_too(
    short_tmp: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """EFFECTD_INIT=true and `init = true` in the --config file."""
    monkeypatch.setenv("EFFECTD_INIT", "true")
    with pytest.raises(Served):
        serve("--data-dir", str(short_tmp / "by-env"))
    monkeypatch.delenv("EFFECTD_INIT")
    config = short_tmp / "effectd.toml"
    config.write_text("init = true\n")
    with pytest.raises(Served):
        serve("--data-dir", str(short_tmp / "by-file"), "--config", str(config))
    assert capsys.readouterr().err.count(CREATED) == 2


def test_init_on_an_existing_ledger_opens_it_and_logs_no_creation(
    short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--init is harmless on a ledger: the calls it holds are there after a
    start with it, and nothing says a ledger was created; a start without it
    serves the ledger as well."""
    path = short_tmp / "data"
    with (
        running_daemon(ServeConfig(data_dir=path, init=True)) as daemon,
        Client(daemon.target) as client,
    ):
        held = client.prepare_tool("run-1", "call-1", "pay", {"n": 1}, start=True)
        client.commit_tool("run-1", "call-1", held.call.attempt, {"paid": True})
    capsys.readouterr()
    with pytest.raises(Served):
        serve("--data-dir", str(path), "--init")
    with pytest.raises(Served):
        serve("--data-dir", str(path))
    assert CREATED not in capsys.readouterr().err
    with (
        running_daemon(ServeConfig(data_dir=path)) as daemon,
        Client(daemon.target) as client,
    ):
        again = client.prepare_tool("run-1", "call-1", "pay", {"n": 1})
        assert again.decision is Decision.RETURN_RESULT


def test_a_daemon_in_process_refuses_too(short_tmp: Path) -> None:
    """`Daemon` itself, not only the command line: its configuration's
    default is no new ledger."""
    with (
        pytest.raises(ConfigError, match="pass --init"),
        running_daemon(ServeConfig(data_dir=short_tmp / "data")),
    ):
        pass
    assert not (short_tmp / "data").exists()


# --- places that cannot hold a ledger (issue 25 item 11) ----------------------


def _a_file(short_tmp: Path) -> tuple[Path, str]:
    path = short_tmp / "a-file"
    path.write_text("")
    return path, f"{path} is not a directory"


def _under_a_file(short_tmp: Path) -> tuple[Path, str]:
    path, _ = _a_file(short_tmp)
    return (
        path / "data",
        f"{path / 'data'} cannot be a directory: a path above it is a file",
    )


def _proc_nope(short_tmp: Path) -> tuple[Path, str]:
    path = Path("/proc/nope")
    return path, f"cannot create the directory {path}: No such file or directory"


def _data_file_a_directory(short_tmp: Path) -> tuple[Path, str]:
    path = short_tmp / "data"
    (path / "data.mdb").mkdir(parents=True)
    path.chmod(0o700)
    return path, f"{path / 'data.mdb'} is not a file"


@pytest.mark.parametrize(
    "place", [_a_file, _under_a_file, _proc_nope, _data_file_a_directory]
)
@pytest.mark.parametrize("init", [False, True], ids=["", "init"])
def test_a_data_directory_that_cannot_hold_a_ledger_exits_2(
    short_tmp: Path,
    capsys: pytest.CaptureFixture[str],
    place: Callable[[Path], tuple[Path, str]],
    init: bool,
) -> None:
    """A file, a path under a file, a place nothing can be created: exit 2
    and `effectd: --data-dir: <why>` (issue 25 item 11: fails before the
    fix: a traceback, exit 1)."""
    path, why = place(short_tmp)
    code = serve("--data-dir", str(path), *(["--init"] if init else []))
    line = last_line(capsys)
    assert code == 2
    if place is _proc_nope and not init:
        why = f"{path} does not exist: pass --init"
    assert line.startswith(f"effectd: --data-dir: {why}")


def test_a_data_directory_nothing_can_be_written_in_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """/proc is a directory, owned by root, 0555, and takes no file."""
    assert serve("--data-dir", "/proc", "--init") == 2
    assert last_line(capsys).startswith("effectd: --data-dir: cannot create /proc/")


def test_a_socket_where_nothing_can_be_created_exits_2(
    short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    socket = Path("/proc/nope/effectd.sock")
    argv = ["--data-dir", str(short_tmp / "data"), "--init", "--socket", str(socket)]
    assert serve(*argv) == 2
    assert last_line(capsys) == (
        f"effectd: --socket: cannot create the directory {socket.parent}: "
        "No such file or directory"
    )
