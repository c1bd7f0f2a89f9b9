"""meshctl/image/oci.py (packaging/image/build.py and `meshctl image build` write with it):
reproducible layer tars and one tarball that is both OCI layout and
``docker save`` archive, read back member by member."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from meshctl.image import oci


@pytest.fixture
def image(tmp_path: Path):
    source = tmp_path / "prog"
    source.write_bytes(b"\x7fELF" + os.urandom(5000))
    source.chmod(0o700)
    long_name = "/opt/app/" + "x" * 150 + "/data.bin"  # beyond USTAR's 100-byte name field
    entries = (
        oci.file_from("/usr/local/bin/prog", source),
        oci.file_bytes("/etc/motd", b"hello\n"),
        oci.symlink("/usr/bin/prog", "/usr/local/bin/prog"),
        oci.directory("/tmp", 0o1777),
        oci.file_bytes(long_name, b"\0" * 10),
    )
    return oci.Image(
        repository="localhost/t",
        tag="1.2",
        layers=(oci.Layer("one", entries), oci.Layer("two", (oci.file_bytes("/a", b"a"),))),
        entrypoint=("/usr/local/bin/prog",),
        cmd=("serve",),
        env=("PATH=/usr/bin",),
        user="1:2",
        labels={"b": "2", "a": "1"},
    )


def test_the_same_image_written_twice_is_the_same_bytes(image, tmp_path):
    first = oci.write_archive(image, tmp_path / "one.tar")
    os.utime(image.layers[0].entries[0].source, (1, 1))  # mtimes of inputs never leak in
    second = oci.write_archive(image, tmp_path / "two.tar")
    assert first == second
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()
    assert first.size == (tmp_path / "one.tar").stat().st_size
    assert oci.recipe(image, b"w") == oci.recipe(image, b"w") != oci.recipe(image, b"v")


def test_layer_members_are_sorted_rooted_and_anonymous(image, tmp_path):
    oci.write_archive(image, tmp_path / "i.tar")
    read = oci.read_archive(tmp_path / "i.tar")
    names = [m.name for m in read["layers"][0]]
    assert names == sorted(names, key=lambda n: n.split("/"))
    for parent in ("opt", "opt/app", "usr", "usr/local", "usr/local/bin", "etc"):
        assert parent in names  # every parent directory is present, before what it holds
    for member in read["layers"][0]:
        assert (member.mtime, member.uid, member.gid, member.uname, member.gname) == (
            0,
            0,
            0,
            "",
            "",
        )
    by_name = {m.name: m for m in read["layers"][0]}
    assert by_name["usr/local/bin/prog"].mode == 0o755  # executable: 0755 whatever the umask
    assert by_name["etc/motd"].mode == 0o644
    assert by_name["tmp"].mode == 0o1777
    assert by_name["usr/bin/prog"].issym()
    assert by_name["usr/bin/prog"].linkname == "/usr/local/bin/prog"
    assert any(len(n) > 150 for n in names)


def test_the_tarball_is_an_oci_layout_and_a_docker_archive_of_the_same_blobs(image, tmp_path):
    written = oci.write_archive(image, tmp_path / "i.tar")
    read = oci.read_archive(tmp_path / "i.tar")
    assert read["oci-layout"] == {"imageLayoutVersion": "1.0.0"}
    (entry,) = read["index"]["manifests"]
    assert entry["annotations"] == {
        "io.containerd.image.name": "localhost/t:1.2",
        "org.opencontainers.image.ref.name": "1.2",
    }
    assert entry["digest"] == written.digest
    assert entry["platform"] == {"architecture": oci.architecture(), "os": "linux"}
    manifest = read["manifest"]
    assert [layer["mediaType"] for layer in manifest["layers"]] == [oci.MEDIA_LAYER] * 2
    (docker,) = read["docker"]
    assert docker["RepoTags"] == ["localhost/t:1.2"]
    assert docker["Config"] == f"blobs/sha256/{manifest['config']['digest'][7:]}"
    assert docker["Layers"] == [
        f"blobs/sha256/{layer['digest'][7:]}" for layer in manifest["layers"]
    ]
    config = read["config"]
    assert config["config"] == {
        "Entrypoint": ["/usr/local/bin/prog"],
        "Cmd": ["serve"],
        "Env": ["PATH=/usr/bin"],
        "User": "1:2",
        "WorkingDir": "/",
        "Labels": {"a": "1", "b": "2"},
    }
    # Uncompressed layers: the diff_id is the layer blob's own digest.
    assert config["rootfs"]["diff_ids"] == [layer["digest"] for layer in manifest["layers"]]
    assert [h["created_by"] for h in config["history"]] == ["one", "two"]


def test_extract_unpacks_the_layers_in_order(image, tmp_path):
    oci.write_archive(image, tmp_path / "i.tar")
    root = tmp_path / "root"
    root.mkdir()
    oci.extract(tmp_path / "i.tar", root)
    assert (root / "etc" / "motd").read_bytes() == b"hello\n"
    assert (root / "a").read_bytes() == b"a"
    assert str((root / "usr" / "bin" / "prog").readlink()) == "/usr/local/bin/prog"


def test_a_blob_that_does_not_match_its_digest_is_refused(image, tmp_path):
    oci.write_archive(image, tmp_path / "i.tar")
    with tarfile.open(tmp_path / "i.tar") as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar]
    index = json.loads(next(d for m, d in members if m.name == "index.json"))
    bad = f"blobs/sha256/{index['manifests'][0]['digest'][7:]}"
    with tarfile.open(tmp_path / "bad.tar", "w") as out:
        for member, data in members:
            changed = (
                data.replace(b"schemaVersion", b"schemaVersioN") if member.name == bad else data
            )
            out.addfile(member, io.BytesIO(changed) if changed is not None else None)
    with pytest.raises(ValueError, match="does not match its digest"):
        oci.read_archive(tmp_path / "bad.tar")


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        ([oci.file_bytes("etc/x", b"")], "not absolute"),
        ([oci.file_bytes("/etc/../x", b"")], "not absolute and normalised"),
        ([oci.file_bytes("/x", b"1"), oci.file_bytes("/x", b"2")], "twice"),
        ([oci.file_bytes("/x", b""), oci.file_bytes("/x/y", b"")], "its parent /x is a file"),
    ],
)
def test_inconsistent_entries_are_refused(entries, says):
    with pytest.raises(ValueError, match=says):
        oci.complete(entries)


def test_recipe_follows_file_content_not_file_names(tmp_path):
    one, two = tmp_path / "1", tmp_path / "2"
    one.write_bytes(b"same")
    two.write_bytes(b"same")

    def image_of(path: Path):
        return oci.Image(
            repository="r",
            tag="t",
            layers=(oci.Layer("l", (oci.file_from("/f", path, 0o644),)),),
            entrypoint=("/f",),
        )

    assert oci.recipe(image_of(one), b"") == oci.recipe(image_of(two), b"")
    two.write_bytes(b"diff")
    assert oci.recipe(image_of(one), b"") != oci.recipe(image_of(two), b"")
    assert oci.content_digest(oci.file_from("/f", one)) == hashlib.sha256(b"same").hexdigest()


def test_an_image_with_aliases_is_one_manifest_under_every_name(image, tmp_path):
    names = ("localhost/t:1.2", "registry.example:5000/up/t:v9", "localhost/t:1.3")
    aliased = dataclasses.replace(image, aliases=names[1:])
    written = oci.write_archive(aliased, tmp_path / "a.tar")
    read = oci.read_archive(tmp_path / "a.tar")
    entries = read["index"]["manifests"]
    assert [e["annotations"]["io.containerd.image.name"] for e in entries] == list(names)
    assert [e["annotations"]["org.opencontainers.image.ref.name"] for e in entries] == [
        "1.2",
        "v9",
        "1.3",
    ]
    assert {e["digest"] for e in entries} == {written.digest}
    assert read["docker"][0]["RepoTags"] == list(names)
    assert written.ref == "localhost/t:1.2"
    # The image itself (manifest, config, layers) is the one without aliases.
    plain = oci.write_archive(image, tmp_path / "p.tar")
    assert plain.digest == written.digest
    assert oci.recipe(aliased, b"w") != oci.recipe(image, b"w")


def test_an_alias_without_a_tag_is_refused(image, tmp_path):
    with pytest.raises(ValueError, match="has no tag"):
        oci.write_archive(
            dataclasses.replace(image, aliases=("registry.example:5000/t",)), tmp_path / "x.tar"
        )
