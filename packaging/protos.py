"""Regenerate the Python modules of the wire schemas in meshctl/proto, or check they are current.

The `.proto` files are the source; the generated `*_pb2.py`, `*_pb2.pyi`, `*_pb2_grpc.py` and
`*_pb2_grpc.pyi` beside them are committed, never edited. Generation uses the pinned grpcio-tools
(its bundled protoc) and mypy-protobuf from the `dev` extra, so the output is byte-for-byte
reproducible; `--check` (run by CI) regenerates into a temp dir and fails on any difference.

Usage: python packaging/protos.py [--check]
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "meshctl" / "proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generate(out_root: Path) -> list[Path]:
    """Compile every .proto under meshctl/proto into out_root (same relative layout)."""
    import grpc_tools  # the bundled protoc and the well-known types' .proto files

    includes = Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(p.relative_to(ROOT) for p in PROTO_DIR.glob("*.proto"))
    (out_root / "meshctl" / "proto").mkdir(parents=True, exist_ok=True)
    bindir = Path(sys.executable).parent
    argv = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"-I{includes}",
        f"--plugin=protoc-gen-mypy={bindir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bindir / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *map(str, protos),
    ]
    subprocess.run(argv, check=True, cwd=ROOT, stderr=subprocess.DEVNULL)
    # protoc writes (empty) gRPC modules for every file; keep them only where a service exists.
    for proto in protos:
        if not re.search(r"^service ", (ROOT / proto).read_text(), re.MULTILINE):
            for suffix in ("_pb2_grpc.py", "_pb2_grpc.pyi"):
                (out_root / proto.parent / f"{proto.stem}{suffix}").unlink()
    return sorted(
        p.relative_to(out_root)
        for p in (out_root / "meshctl" / "proto").iterdir()
        if p.name.endswith(GENERATED_SUFFIXES)
    )


def committed() -> list[Path]:
    return sorted(
        p.relative_to(ROOT) for p in PROTO_DIR.iterdir() if p.name.endswith(GENERATED_SUFFIXES)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed files differ")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        fresh = generate(out)
        if args.check:
            stale = {str(p) for p in committed() if p not in fresh}
            for p in fresh:
                if not (ROOT / p).exists() or not filecmp.cmp(out / p, ROOT / p, shallow=False):
                    stale.add(str(p))
            if stale:
                names = ", ".join(sorted(stale))
                print(f"generated protobuf modules are stale: {names}", file=sys.stderr)
                print("regenerate with: python packaging/protos.py", file=sys.stderr)
                return 1
            print(f"{len(fresh)} generated protobuf modules are current")
            return 0
        for p in committed():
            if p not in fresh:
                (ROOT / p).unlink()
        for p in fresh:
            shutil.copyfile(out / p, ROOT / p)
        print(f"wrote {len(fresh)} modules under meshctl/proto")
        return 0


if __name__ == "__main__":
    sys.exit(main())
