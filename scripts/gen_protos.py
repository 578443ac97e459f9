"""Regenerates the Python code of the protos, or checks that it is fresh.

The `.proto` files under `protos/effectd/v1/` are the single source. The
generated modules (messages, gRPC stubs and their `.pyi` type stubs) live in
the `effectd.v1` package of the client distribution, `clients/python/src/`,
which holds nothing hand-written. `--check` generates into a temporary
directory and fails when anything differs from the committed files.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT_ROOT = ROOT / "clients" / "python" / "src"
PACKAGE = Path("effectd") / "v1"
INIT_TEXT = (
    '"""Generated from protos/effectd/v1 by scripts/gen_protos.py; do not edit."""\n'
)


def generate(out_root: Path) -> None:
    """Writes the generated package `effectd.v1` under `out_root`."""
    bin_dir = Path(sys.executable).parent
    protos = sorted(
        str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PACKAGE).glob("*.proto")
    )
    include = Path(protoc.__file__).parent / "_proto"
    # google/rpc/status.proto, imported by the session stream's answers: the
    # copy the Node client loads; its Python module comes from
    # googleapis-common-protos, so only effectd's own protos are generated.
    google_rpc = ROOT / "clients" / "node" / "protos"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"-I{google_rpc}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *protos,
    ]
    out_root.mkdir(parents=True, exist_ok=True)
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for package in (out_root / "effectd", out_root / PACKAGE):
        (package / "__init__.py").write_text(INIT_TEXT)
        (package / "py.typed").write_text("")


def differences(expected: Path, actual: Path) -> list[str]:
    """Names the files that differ between two generated trees."""

    def files(root: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(root)): p.read_bytes()
            for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }

    want, have = files(expected), files(actual)
    found = [f"missing: {name}" for name in want.keys() - have.keys()]
    found += [f"not generated: {name}" for name in have.keys() - want.keys()]
    found += [f"stale: {n}" for n in want.keys() & have.keys() if want[n] != have[n]]
    return sorted(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="fail when the committed code is stale"
    )
    options = parser.parse_args()
    target = OUT_ROOT / "effectd"
    if not options.check:
        shutil.rmtree(target, ignore_errors=True)
        generate(OUT_ROOT)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        problems = (
            differences(Path(tmp) / "effectd", target)
            if target.exists()
            else ["missing: effectd"]
        )
    for problem in problems:
        print(f"generated code {problem} (run `make protos`)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
