"""``meshctl image build``: the frozen tree builds the very image packaging/image/build.py builds
(one recipe, one digest), the one-file binary builds a runnable image, the same bytes each time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshctl.image import oci
from tests.harness.cli import run_meshctl
from tests.harness.frozen import frozen_binary, frozen_tree

pytestmark = pytest.mark.packaging
ROOT = Path(__file__).resolve().parents[2]


def _packaging_digest(tree: Path, tmp_path: Path) -> str:
    """The meshctl image's digest as packaging/image/build.py gives it (CI's images.json when it
    is there, else a build of it now)."""
    configured = os.environ.get("MESHCTL_IMAGE_DIR")
    if configured and (Path(configured) / "images.json").is_file():
        return str(json.loads((Path(configured) / "images.json").read_text())["meshctl"]["digest"])
    done = subprocess.run(
        [sys.executable, str(ROOT / "packaging/image/build.py"), "--out", str(tmp_path / "pk"),
         "--tree", str(tree), "meshctl"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return str(json.loads((tmp_path / "pk" / "images.json").read_text())["meshctl"]["digest"])


def _build(executable: Path, archive: Path, *args: str) -> dict[str, str]:
    done = subprocess.run(
        [str(executable), "image", "build", "--archive", str(archive), "-o", "json", *args],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, str] = json.loads(done.stdout)
    return result


def test_the_frozen_tree_builds_itself_into_the_image_packaging_builds(tmp_path):
    tree = frozen_tree()
    built = _build(tree / "meshctl", tmp_path / "self.tar")
    assert built["source"] == f"tree {tree}"
    assert built["digest"] == _packaging_digest(tree, tmp_path)
    read = oci.read_archive(tmp_path / "self.tar")
    assert read["digest"] == built["digest"]
    assert read["index"]["manifests"][0]["annotations"][oci.NAME_ANNOTATION] == built["ref"]
    # The unfrozen CLI given the same tree: the same image again.
    unfrozen = run_meshctl(
        "image", "build", "--tree", str(tree), "--archive", str(tmp_path / "venv.tar"),
        "-o", "json", timeout=600,
    )  # fmt: skip
    assert unfrozen.returncode == 0, unfrozen.stderr
    assert json.loads(unfrozen.stdout)["digest"] == built["digest"]


def test_the_one_file_binary_builds_the_same_runnable_image_twice(tmp_path):
    binary = frozen_binary()
    first = _build(binary, tmp_path / "one.tar")
    second = _build(binary, tmp_path / "two.tar")
    assert first["source"] == f"one-file {binary}"
    assert first["digest"] == second["digest"]
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()
    if os.geteuid() != 0:
        pytest.skip("running the image's entrypoint in a chroot needs root")
    root = tmp_path / "root"
    root.mkdir()
    oci.extract(tmp_path / "one.tar", root)
    ran = subprocess.run(
        ["chroot", str(root), "/usr/local/bin/meshctl", "version", "-o", "json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["frozen"] is True


def test_a_push_without_an_archive_builds_this_binarys_image_and_pushes_it(tmp_path):
    from tests.harness.registry import start_registry

    tree = frozen_tree()
    with start_registry(tmp_path / "registry") as registry:
        done = subprocess.run(
            [str(tree / "meshctl"), "image", "push", f"{registry.host}/meshctl:self",
             "--insecure", "-o", "json"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["digest"] == _packaging_digest(tree, tmp_path)
