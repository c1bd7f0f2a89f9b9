"""The one-dir tree: its manifest (meshctl.core.tree) and placing verified copies (meshctl.tree)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshctl import tree as trees
from meshctl.core.tree import MANIFEST_NAME, File, Link, Manifest, ManifestError, parse
from meshctl.errors import MeshctlError

_names = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyz0123456789_.-", min_size=1, max_size=12
).filter(lambda n: n not in (".", "..") and n != MANIFEST_NAME)
_paths = st.lists(_names, min_size=1, max_size=4).map("/".join)
_files = st.builds(
    File,
    _paths,
    st.sampled_from([0o755, 0o644]),
    st.integers(0, 2**40),
    st.binary(min_size=32, max_size=32).map(bytes.hex),
)


@st.composite
def manifests(draw: st.DrawFn) -> Manifest:
    files = draw(st.lists(_files, min_size=1, max_size=8, unique_by=lambda f: f.path))
    exe = File("meshctl", 0o755, 10, "0" * 64)
    files = [f for f in files if f.path != exe.path and not f.path.startswith("meshctl/")]
    taken = {f.path for f in files} | {exe.path}
    links = [
        Link(p, "meshctl")
        for p in draw(st.lists(_paths, max_size=3, unique=True))
        if p not in taken and not any(t.startswith(p + "/") or p.startswith(t + "/") for t in taken)
    ]
    return Manifest(version="0.1.0", executable="meshctl", files=(exe, *files), links=tuple(links))


@given(manifests())
def test_a_manifest_renders_canonically_and_parses_back(manifest: Manifest):
    data = manifest.render()
    again = parse(data)
    assert again.render() == data
    assert again.digest == manifest.digest == hashlib.sha256(data).hexdigest()
    assert sorted(again.files, key=lambda f: f.path) == sorted(manifest.files, key=lambda f: f.path)


def test_the_digest_names_the_content():
    one = Manifest(version="1", executable="x", files=(File("x", 0o755, 1, "a" * 64),))
    two = Manifest(version="1", executable="x", files=(File("x", 0o755, 1, "b" * 64),))
    assert one.digest != two.digest
    assert one.name == f"1-{one.digest[:16]}"


def _body(**change: object) -> bytes:
    manifest = Manifest(version="1", executable="x", files=(File("x", 0o755, 1, "a" * 64),))
    text = manifest.render().decode()
    for old, new in change.items():
        text = text.replace(old, str(new))
    return text.encode()


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"not json", "malformed"),
        (b'{"format": 2}', "format-1"),
        (_body(**{'"mode":493': '"mode":511'}), "not 0755 or 0644"),
        (
            _body(**{'"path":"x"': '"path":"../x"', '"executable":"x"': '"executable":"../x"'}),
            "plain",
        ),
        (_body(**{'"path":"x"': '"path":"/x"', '"executable":"x"': '"executable":"/x"'}), "plain"),
        (_body(**{'"executable":"x"': '"executable":"y"'}), "not an executable"),
        (_body(**{'"links":[]': '"links":[{"path":"l","target":"../../etc"}]'}), "leaves"),
        (_body(**{'"links":[]': '"links":[{"path":"x","target":"x"}]'}), "twice"),
        (_body(**{'"size":1': '"size":-1'}), "byte count"),
        (_body(**{"a" * 64: "z" * 64}), "hex digest"),
        (_body(**{",": ", "}), "canonical"),
    ],
)
def test_a_bad_manifest_is_refused_with_a_reason(data: bytes, says: str):
    with pytest.raises(ManifestError, match=says):
        parse(data)


# --- on disk -----------------------------------------------------------------------------------


@pytest.fixture
def source(tmp_path: Path) -> tuple[Path, Manifest]:
    root = tmp_path / "src"
    (root / "_internal" / "pkg").mkdir(parents=True)
    (root / "meshctl").write_bytes(b"#!/bin/sh\necho tree\n")
    (root / "meshctl").chmod(0o700)  # a narrow build umask must not reach the node
    (root / "_internal" / "libx.so.1").write_bytes(os.urandom(300_000))
    (root / "_internal" / "pkg" / "data.json").write_text("{}")
    (root / "_internal" / "libx.so").symlink_to("libx.so.1")
    manifest = trees.scan(root, executable="meshctl", version="9.9")
    (root / MANIFEST_NAME).write_bytes(manifest.render())
    return root, manifest


def test_scan_records_every_file_with_a_umask_proof_mode(source):
    _, manifest = source
    assert {f.path: f.mode for f in manifest.files} == {
        "meshctl": 0o755,
        "_internal/libx.so.1": 0o644,
        "_internal/pkg/data.json": 0o644,
    }
    assert manifest.links == (Link("_internal/libx.so", "libx.so.1"),)


def test_place_copies_a_verified_tree_and_keeps_a_good_copy(source, tmp_path):
    root, manifest = source
    old_umask = os.umask(0o077)
    try:
        target, copied = trees.place(root, manifest, tmp_path / "bin" / ".trees")
    finally:
        os.umask(old_umask)
    assert copied
    assert target.name == manifest.name
    assert trees.problems(target, manifest, content=True) == []
    assert (target / "meshctl").stat().st_mode & 0o777 == 0o755
    assert target.stat().st_mode & 0o777 == 0o755
    assert parse((target / MANIFEST_NAME).read_bytes()) == manifest
    assert [p.name for p in target.parent.iterdir()] == [manifest.name]  # no temp dir left
    assert trees.place(root, manifest, target.parent) == (target, False)


def test_a_damaged_copy_is_found_and_replaced(source, tmp_path):
    root, manifest = source
    target, _ = trees.place(root, manifest, tmp_path / "trees")
    lib = target / "_internal" / "libx.so.1"
    data = bytearray(lib.read_bytes())
    data[1000] ^= 0xFF
    lib.write_bytes(bytes(data))
    assert trees.problems(target, manifest, content=False) == []  # same size and mode
    assert trees.problems(target, manifest, content=True) == [
        "_internal/libx.so.1 does not match its sha256"
    ]
    (target / "_internal" / "pkg" / "data.json").unlink()
    assert "_internal/pkg/data.json is missing" in trees.problems(target, manifest, content=False)
    assert trees.place(root, manifest, target.parent) == (target, True)
    assert trees.problems(target, manifest, content=True) == []


def test_a_source_that_differs_from_its_manifest_places_nothing(source, tmp_path):
    root, manifest = source
    (root / "_internal" / "pkg" / "data.json").write_text("[]")  # same size, other bytes
    parent = tmp_path / "trees"
    with pytest.raises(MeshctlError, match="does not match this build's tree manifest"):
        trees.place(root, manifest, parent)
    assert list(parent.iterdir()) == []
