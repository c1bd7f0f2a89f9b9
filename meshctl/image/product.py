"""The meshctl image: this build's frozen tree (or one-file binary) over a Debian base layer.

``packaging/image/build.py`` and ``meshctl image build`` both call ``tree_image`` (one recipe,
so the same tree gives the same digest from either). Where the running meshctl comes from is
``own_source``: the frozen one-dir tree carries its manifest beside its executable, the one-file
binary is one file, and an unfrozen install has neither: it is frozen first with PyInstaller,
the way ``packaging/build.sh`` does (from a source checkout, with the ``build`` extra).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from meshctl import __version__
from meshctl import tree as trees
from meshctl.core.k8s.image import DEFAULT_REPOSITORY
from meshctl.core.tree import MANIFEST_NAME, Manifest, ManifestError, parse
from meshctl.errors import MeshctlError
from meshctl.image import oci, rootfs

TREE_DIR = "/opt/meshctl"
PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROXY_USER = "1337:1337"  # Istio's proxy uid/gid: the capture rules exempt its traffic
CHECKOUT = Path(__file__).resolve().parents[2]  # the source checkout of an editable install


def labels(title: str, description: str) -> dict[str, str]:
    return {
        "org.opencontainers.image.title": title,
        "org.opencontainers.image.description": description,
        "org.opencontainers.image.version": __version__,
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.vendor": "meshctl",
    }


def read_manifest(tree: Path) -> Manifest:
    """The manifest of the tree at ``tree``, checked to be this version's."""
    try:
        manifest = parse((tree / MANIFEST_NAME).read_bytes())
    except FileNotFoundError as exc:
        raise MeshctlError(
            f"{tree / MANIFEST_NAME} not found: {tree} is not a frozen one-dir tree",
            hint="run 'bash packaging/build.sh' in a checkout (it writes dist/meshctl-tree)",
        ) from exc
    except (OSError, ManifestError) as exc:
        raise MeshctlError(
            f"{tree / MANIFEST_NAME}: {exc}", hint="rebuild the tree (bash packaging/build.sh)"
        ) from exc
    if manifest.version != __version__:
        raise MeshctlError(
            f"{tree} is meshctl {manifest.version}, this is {__version__}",
            hint="run 'bash packaging/build.sh' to freeze this version",
        )
    return manifest


def _image(app: list[oci.Entry], base: list[oci.Entry], comment: str, listed: str) -> oci.Image:
    return oci.Image(
        repository=DEFAULT_REPOSITORY,
        tag=__version__,
        layers=(
            oci.Layer(f"debian files: {listed}", tuple(base)),
            oci.Layer(comment, tuple(app)),
        ),
        entrypoint=("/usr/local/bin/meshctl",),
        env=(PATH, "LANG=C.UTF-8"),
        user=PROXY_USER,
        labels=labels("meshctl", "A service mesh in one Python binary (frozen one-dir tree)."),
    )


def _base(tree: Path, files: list[str], executable: str) -> tuple[list[oci.Entry], str]:
    packages = rootfs.closure((*rootfs.linked_packages(tree, files, executable), *rootfs.ROOTS))
    base = rootfs.entries(packages)
    base += rootfs.alternatives({e.path for e in base}) + rootfs.system_files()
    return base, ", ".join(f"{p.name}={p.version}" for p in packages)


def tree_image(tree: Path) -> oci.Image:
    """The frozen tree at /opt/meshctl over the Debian base layer; the proxy's user by default."""
    manifest = read_manifest(tree)
    base, listed = _base(tree, [f.path for f in manifest.files], manifest.executable)
    app = [oci.file_from(f"{TREE_DIR}/{MANIFEST_NAME}", tree / MANIFEST_NAME, 0o644)]
    app += [oci.file_from(f"{TREE_DIR}/{f.path}", tree / f.path, f.mode) for f in manifest.files]
    app += [oci.symlink(f"{TREE_DIR}/{link.path}", link.target) for link in manifest.links]
    app.append(oci.symlink("/usr/local/bin/meshctl", f"{TREE_DIR}/{manifest.executable}"))
    return _image(app, base, f"meshctl {__version__} one-dir tree {manifest.name}", listed)


def onefile_image(binary: Path) -> oci.Image:
    """The one-file binary at /usr/local/bin/meshctl (it unpacks itself into /tmp at each start;
    the CNI installer then copies itself instead of placing a tree)."""
    base, listed = _base(binary.parent, [binary.name], binary.name)
    app = [oci.file_from("/usr/local/bin/meshctl", binary, 0o755)]
    return _image(app, base, f"meshctl {__version__} one-file binary", listed)


@dataclass(frozen=True, slots=True)
class Source:
    """What the image is built from: a one-dir tree or a one-file binary."""

    kind: str  # "tree" | "one-file"
    path: Path

    def image(self) -> oci.Image:
        return tree_image(self.path) if self.kind == "tree" else onefile_image(self.path)


def own_source() -> Source | None:
    """This process's own frozen build, or None when it runs unfrozen (from a venv)."""
    if not getattr(sys, "frozen", False):
        return None
    found = trees.own()
    if found is not None:
        return Source("tree", found[0])
    return Source("one-file", Path(sys.executable).resolve())


def freeze(checkout: Path = CHECKOUT) -> Source:
    """Freeze this checkout with PyInstaller (``packaging/build.sh``): its dist/meshctl-tree."""
    script = checkout / "packaging" / "build.sh"
    if not script.is_file() or not (checkout / "packaging" / "meshctl.spec").is_file():
        raise MeshctlError(
            "this meshctl runs unfrozen from an install without its source checkout "
            "(no packaging/build.sh beside it), so it cannot freeze itself",
            hint="run a frozen meshctl (the release binary), or 'pip install -e .[build]' "
            "from a checkout, or pass --tree DIR",
        )
    if importlib.util.find_spec("PyInstaller") is None:
        raise MeshctlError(
            "PyInstaller is not installed in this Python, and an unfrozen meshctl needs it "
            "to freeze itself into the image",
            hint=f"{sys.executable} -m pip install -e '{checkout}[build]' (or pass --tree DIR)",
        )
    bash = shutil.which("bash")
    if bash is None:
        raise MeshctlError("bash not found (packaging/build.sh needs it)", hint="install bash")
    env_python = str(Path(sys.executable).parent)
    done = subprocess.run(
        [bash, str(script)],
        cwd=checkout,
        env={**os.environ, "PATH": f"{env_python}:{os.environ.get('PATH', '')}"},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise MeshctlError(
            f"packaging/build.sh failed (exit {done.returncode}): {last[0]}",
            hint=f"run 'bash {script}' yourself to see the whole log",
        )
    return Source("tree", checkout / "dist" / "meshctl-tree")


class BaseLayerError(MeshctlError):
    """The machine cannot provide the Debian base layer."""


def build(source: Source) -> oci.Image:
    """The image of ``source``; the base layer's failures become one-line errors with the fix."""
    try:
        return source.image()
    except rootfs.RootfsError as exc:
        raise BaseLayerError(
            f"the image's base layer: {exc}",
            hint="build on Debian 12 (the base layer is files of this machine's Debian packages)",
        ) from exc
    except subprocess.CalledProcessError as exc:
        raise BaseLayerError(
            f"the image's base layer: {exc.cmd[0]} failed (exit {exc.returncode})",
            hint="build on Debian 12 with a healthy dpkg database",
        ) from exc
    except FileNotFoundError as exc:
        raise BaseLayerError(
            f"the image's base layer needs {exc.filename or 'dpkg-query'}, which is missing",
            hint="build on Debian 12 with dpkg, binutils (objdump) and libc-bin (ldconfig)",
        ) from exc


def write(image: oci.Image, out: Path) -> oci.Written:
    try:
        return oci.write_archive(image, out)
    except OSError as exc:
        raise MeshctlError(
            f"cannot write {out}: {exc.strerror or exc}", hint="check the path and free space"
        ) from exc
