"""The committed ``meshctl/proto/*_pb2`` modules are what protobuf's compiler makes of the
``.proto`` files beside them (never edited by hand). ``python -m tests.unit.test_proto_generated``
regenerates them in place after a ``.proto`` change."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROTO = Path(__file__).resolve().parents[2] / "meshctl" / "proto"
SOURCES = sorted(PROTO.glob("*.proto"))


def generate(out: Path) -> None:
    argv = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO}"]
    argv += [f"--python_out={out}", f"--pyi_out={out}", *map(str, SOURCES)]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)


@pytest.mark.parametrize("source", [s.name for s in SOURCES])
def test_generated_modules_match_their_proto(source: str, tmp_path: Path):
    generate(tmp_path)
    stem = source.removesuffix(".proto")
    for suffix in ("_pb2.py", "_pb2.pyi"):
        fresh = (tmp_path / f"{stem}{suffix}").read_text()
        committed = (PROTO / f"{stem}{suffix}").read_text()
        assert committed == fresh, (
            f"{stem}{suffix} is stale: python -m tests.unit.test_proto_generated"
        )


if __name__ == "__main__":
    generate(PROTO)
