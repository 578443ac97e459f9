"""`effectd ctl` and the web console reach the daemon only through the public
Python client (issue 28 item 2): no module of `sidecar/ctl` or `sidecar/web`
imports a generated `*_pb2_grpc` stub, opens a channel of its own, or builds
a request message (`*Request`, or the `CallRef` a request names a call by);
`effectd_client`'s `admin` and `operator` surfaces do that once for every
user. Each module is parsed; a planted module shows the check catches each
form."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
USERS = (ROOT / "sidecar" / "ctl", ROOT / "sidecar" / "web")


def raw_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) of every stub import, channel and request built."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [
                (node.lineno, f"imports {a.name}")
                for a in node.names
                if a.name.endswith("_pb2_grpc")
            ]
        elif isinstance(node, ast.ImportFrom):
            names = [
                node.module or "",
                *(f"{node.module}.{a.name}" for a in node.names),
            ]
            found += [
                (node.lineno, f"imports {n}") for n in names if n.endswith("_pb2_grpc")
            ]
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name.endswith("Request") or name == "CallRef":
                found.append((node.lineno, f"builds {name}"))
            elif name in (
                "channel",
                "aio_channel",
                "insecure_channel",
                "secure_channel",
            ):
                found.append((node.lineno, f"opens a channel ({name})"))
    return found


def test_ctl_and_the_console_use_only_the_public_client() -> None:
    """No module of `sidecar/ctl` or `sidecar/web` holds a raw stub, a
    channel or a request of its own (fails before: ctl/console.py imported
    admin_pb2_grpc, ledger_pb2_grpc and recovery_pb2_grpc, web/daemon.py the
    same, and ctl/requests.py built ReconcileRequest beside the client's)."""
    found = {
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for top in USERS
        for path in sorted(top.rglob("*.py"))
        for line, what in raw_uses(path.read_text())
    }
    assert not found, "\n".join(sorted(found))


@pytest.mark.parametrize(
    "planted",
    [
        "from effectd.v1 import admin_pb2_grpc\n",
        "import effectd.v1.ledger_pb2_grpc\n",
        "from effectd.v1.recovery_pb2_grpc import RecoveryStub\n",
        "r = pb.ReconcileRequest(ref=ref)\n",
        "r = GetToolCallRequest()\n",
        "ref = pb.CallRef(run_id='r')\n",
        "c = connection.channel()\n",
        "c = grpc.insecure_channel('unix:x')\n",
    ],
)
def test_the_check_catches_each_raw_use(planted: str) -> None:
    """Negative control: a module with one raw use is caught."""
    assert raw_uses(planted)
