"""packaging/image/Containerfile describes the image packaging/image/build.py builds.

The Containerfile is parsed (a strict subset: any instruction or RUN command this test does not
know fails it, so the two cannot drift apart unnoticed) and held against the image definition
``build.meshctl_image`` returns: entrypoint, user, working dir, environment, labels; the files
COPY puts under /opt/meshctl and the links RUN makes are exactly the app layer; the packages it
installs are the base layer's roots; the user it creates is the image's; FROM names the Debian
release whose packages fill the base. Built from the real tree when ``MESHCTL_FROZEN_TREE`` is
set (CI), else from a small stand-in tree with a manifest.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import sys
from pathlib import Path
from types import ModuleType

import pytest

from meshctl import __version__
from meshctl import tree as trees
from meshctl.core.tree import MANIFEST_NAME

ROOT = Path(__file__).resolve().parents[3]
IMAGE_DIR = ROOT / "packaging" / "image"
KNOWN = {"FROM", "RUN", "COPY", "ENV", "LABEL", "USER", "WORKDIR", "ENTRYPOINT"}


def load_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("meshctl_image_build", IMAGE_DIR / "build.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def key_values(rest: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in shlex.split(rest))


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.environ.get("MESHCTL_FROZEN_TREE"):
        return Path(os.environ["MESHCTL_FROZEN_TREE"]).resolve()
    root = tmp_path_factory.mktemp("tree")
    (root / "_internal").mkdir()
    (root / "meshctl").write_text("#!/bin/sh\n")
    (root / "meshctl").chmod(0o755)
    (root / "_internal" / "base_library.zip").write_bytes(b"PK")
    manifest = trees.scan(root, executable="meshctl")
    (root / MANIFEST_NAME).write_bytes(manifest.render())
    return root


def test_the_containerfile_describes_the_image_the_builder_makes(tree: Path):
    builder = load_builder()
    image = builder.meshctl_image(tree)
    base, app = image.layers
    app_entries = {e.path: e for e in app.entries}
    base_entries = {e.path: e for e in base.entries}
    steps = instructions((IMAGE_DIR / "Containerfile").read_text())
    assert {word for word, _ in steps} <= KNOWN, steps

    env: list[str] = []
    labels: dict[str, str] = {}
    explained: set[str] = set()
    for word, rest in steps:
        if word == "FROM":
            release = dict(
                line.split("=", 1)
                for line in Path("/etc/os-release").read_text().split()
                if "=" in line
            )
            assert rest == f"docker.io/library/debian:{release['VERSION_CODENAME']}-slim"
        elif word == "ENTRYPOINT":
            assert json.loads(rest) == list(image.entrypoint)
        elif word == "USER":
            assert rest == image.user
        elif word == "WORKDIR":
            assert rest == image.workdir
        elif word == "ENV":
            env += [f"{k}={v}" for k, v in key_values(rest).items()]
        elif word == "LABEL":
            labels.update(key_values(rest))
        elif word == "COPY":
            source, dest = rest.split()
            # The builder's default tree, as the build context (the repository root) names it.
            assert ROOT / source.rstrip("/") == builder.ROOT / "dist" / "meshctl-tree"
            copied = {
                f"{dest.rstrip('/')}/{p.relative_to(tree).as_posix()}"
                for p in tree.rglob("*")
                if not p.is_dir()
            }
            files = {p for p, e in app_entries.items() if e.kind != "dir"}
            assert copied <= files, copied - files
            explained |= copied
        elif word == "RUN":
            explained |= run_step(rest, builder, image, app_entries, base_entries)
    assert env == list(image.env)
    assert labels == image.labels
    assert {p for p, e in app_entries.items() if e.kind != "dir"} == explained
    # bookworm's iptables package makes iptables-nft the default; so does the builder's base.
    assert base_entries["/usr/sbin/iptables"].target == "/usr/sbin/iptables-nft"


def run_step(command: str, builder, image, app_entries, base_entries) -> set[str]:
    """Check one RUN against the image; return the app-layer paths it accounts for."""
    made: set[str] = set()
    for part in command.split("&&"):
        words = shlex.split(part)
        if words[:2] == ["apt-get", "update"] or words[:3] == ["rm", "-rf", "/var/lib/apt/lists/*"]:
            continue
        if words[:3] == ["apt-get", "install", "-y"]:
            packages = [w for w in words[3:] if not w.startswith("-")]
            assert tuple(packages) == builder.rootfs.ROOTS
        elif words[0] in ("groupadd", "useradd"):
            options, name, rest = {}, words[-1], words[1:-1]
            while rest:
                flag = rest.pop(0)
                options[flag] = "" if flag == "--no-create-home" else rest.pop(0)
            table = "/etc/group" if words[0] == "groupadd" else "/etc/passwd"
            lines = base_entries[table].data.decode().splitlines()
            rows = {line.split(":")[0]: line.split(":") for line in lines}
            assert name in rows, f"{name} is not in the image's {table}"
            if words[0] == "groupadd":
                assert rows[name][2] == options["--gid"]
            else:
                assert rows[name][2:4] == [options["--uid"], options["--gid"]]
                assert rows[name][5:7] == [options["--home-dir"], options["--shell"]]
                assert image.user == f"{options['--uid']}:{options['--gid']}"
        elif words[:2] == ["ln", "-s"]:
            target, link = words[2:]
            assert app_entries[link].kind == "symlink"
            assert app_entries[link].target == target
            made.add(link)
        else:
            pytest.fail(f"RUN step this test does not know: {part.strip()!r}")
    return made


def test_the_image_is_tagged_with_the_package_version(tree: Path):
    image = load_builder().meshctl_image(tree)
    assert image.ref == f"localhost/meshctl:{__version__}"
    assert image.labels["org.opencontainers.image.version"] == __version__
