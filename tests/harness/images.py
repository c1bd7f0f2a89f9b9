"""Container images for the test node, made locally and imported into its containerd.

Owns: a reproducible docker-save tarball writer (manifest.json, config JSON with diff_ids,
uncompressed layer tars: what ``ctr images import`` reads) and the stand-in images the node needs
until the image half of issue #10 provides ``packaging/image``: the sandbox (pause) image, a
busybox workload image (Debian's busybox-static: sh, nc, httpd, wget), and a meshctl image around
the frozen binary.
Invariants: same inputs, same bytes (entries sorted, mtime 0, root-owned); tarballs are cached by
a digest of their inputs under the test cache, never inside the repo.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from meshctl import __version__

HERE = Path(__file__).resolve().parent
PAUSE_SOURCE = HERE / "pause.c"
PAUSE_IMAGE = "localhost/pause:meshctl-test"
BUSYBOX_IMAGE = "localhost/busybox:meshctl-test"
# The tag the image half of #10 gives the real image; DEFAULT_IMAGE is what manifests say today.
MESHCTL_IMAGE = f"localhost/meshctl:{__version__}"
BUSYBOX_BINARY = Path("/bin/busybox")
# glibc as the frozen binary's bootloader and PyInstaller's excluded system libraries need it.
GLIBC = (
    "ld-linux-x86-64.so.2",
    "libc.so.6",
    "libdl.so.2",
    "libm.so.6",
    "libpthread.so.0",
    "librt.so.1",
    "libutil.so.1",
    "libz.so.1",
)
LIB_DIR = Path("/lib/x86_64-linux-gnu")


@dataclass(frozen=True, slots=True)
class Entry:
    """One file system entry of a layer: a file (data), a directory, or a symlink (target)."""

    path: str
    data: bytes | None = None
    mode: int = 0o644
    target: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Image:
    """An image to write: tags, one layer, and the process config."""

    tags: tuple[str, ...]
    entries: tuple[Entry, ...]
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ("PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",)
    labels: dict[str, str] = field(default_factory=dict)


def _layer(entries: Iterable[Entry]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for entry in sorted(entries, key=lambda e: e.path):
            parts = entry.path.strip("/").split("/")
            # Parents first, each once: some unpackers refuse a file whose directory is missing.
            for depth in range(1, len(parts)):
                parent = "/".join(parts[:depth])
                if parent not in dirs:
                    dirs.add(parent)
                    tar.addfile(_info(parent, tarfile.DIRTYPE, 0o755))
            name = "/".join(parts)
            if entry.target is not None:
                info = _info(name, tarfile.SYMTYPE, 0o777)
                info.linkname = entry.target
                tar.addfile(info)
            elif entry.data is None:
                if name not in dirs:
                    dirs.add(name)
                    tar.addfile(_info(name, tarfile.DIRTYPE, entry.mode))
            else:
                info = _info(name, tarfile.REGTYPE, entry.mode)
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
    return out.getvalue()


def _info(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime, info.uid, info.gid = kind, mode, 0, 0, 0
    return info


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_archive(image: Image, path: Path) -> str:
    """Writes a docker-save tarball of ``image`` to ``path``; returns the config digest (its ID)."""
    layer = _layer(image.entries)
    layer_digest = _sha256(layer)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": list(image.entrypoint) or None,
            "Cmd": list(image.cmd) or None,
            "Env": list(image.env),
            "WorkingDir": "/",
            "Labels": dict(sorted(image.labels.items())) or None,
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        "history": [{"created_by": "tests/harness/images.py"}],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_digest = _sha256(config_bytes)
    manifest = [
        {
            "Config": f"{config_digest}.json",
            "RepoTags": list(image.tags),
            "Layers": [f"{layer_digest}/layer.tar"],
        }
    ]
    members = {
        f"{config_digest}.json": config_bytes,
        f"{layer_digest}/layer.tar": layer,
        "manifest.json": json.dumps(manifest, separators=(",", ":")).encode(),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_info(layer_digest, tarfile.DIRTYPE, 0o755))
        for name, data in sorted(members.items()):
            info = _info(name, tarfile.REGTYPE, 0o644)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(path)  # atomic: a concurrent reader sees the old file or the whole new one
    return config_digest


def cached_archive(cache: Path, name: str, image: Image) -> Path:
    """The tarball for ``image`` under ``cache``, written once per distinct content."""
    key = hashlib.sha256()
    for tag in image.tags:
        key.update(tag.encode() + b"\0")
    key.update(_layer(image.entries))
    key.update(json.dumps([image.entrypoint, image.cmd, image.env, image.labels]).encode())
    path = cache / f"{name}-{key.hexdigest()[:16]}.tar"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        write_archive(image, path)
    return path


# ---------------------------------------------------------------------------------------------
# The node's images


def _tmp_dir() -> Entry:
    return Entry("tmp", mode=0o1777)


def pause_image(cache: Path) -> Path | str:
    """The sandbox image (a static pause binary built from pause.c), or why it cannot be made."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return "no gcc to build the sandbox (pause) binary: apt-get install gcc libc6-dev"
    source = PAUSE_SOURCE.read_bytes()
    binary = cache / f"pause-{_sha256(source)[:16]}"
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_name(f".{binary.name}.{os.getpid()}")
        built = subprocess.run(
            [gcc, "-static", "-Os", "-s", "-o", str(tmp), str(PAUSE_SOURCE)],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if built.returncode != 0:
            return f"gcc -static failed for {PAUSE_SOURCE}: {built.stderr.strip()[:300]}"
        tmp.replace(binary)
    entries = (Entry("pause", binary.read_bytes(), 0o755),)
    return cached_archive(
        cache, "pause", Image(tags=(PAUSE_IMAGE,), entries=entries, entrypoint=("/pause",))
    )


def busybox_image(cache: Path) -> Path | str:
    """A 2 MB workload image: Debian's static busybox with its applets linked under /bin."""
    if not os.access(BUSYBOX_BINARY, os.X_OK):
        return f"{BUSYBOX_BINARY} missing: apt-get install busybox-static"
    listed = subprocess.run(
        [str(BUSYBOX_BINARY), "--list"], capture_output=True, text=True, check=True, timeout=10
    )
    applets = sorted({a for a in listed.stdout.split() if a and "/" not in a} - {"busybox"})
    entries = [Entry("bin/busybox", BUSYBOX_BINARY.read_bytes(), 0o755), _tmp_dir()]
    entries += [Entry(f"bin/{a}", target="busybox") for a in applets]
    image = Image(tags=(BUSYBOX_IMAGE,), entries=tuple(entries), cmd=("sh",))
    return cached_archive(cache, "busybox", image)


def meshctl_image(cache: Path, frozen: Path, tags: Sequence[str]) -> Path | str:
    """meshctl's frozen one-file binary as /usr/local/bin/meshctl with the glibc it links."""
    if not os.access(frozen, os.X_OK):
        return f"frozen binary {frozen} missing: run bash packaging/build.sh"
    entries = [Entry("usr/local/bin/meshctl", frozen.read_bytes(), 0o755), _tmp_dir()]
    for lib in GLIBC:
        real = (LIB_DIR / lib).resolve()
        entries.append(Entry(f"lib/x86_64-linux-gnu/{lib}", real.read_bytes(), 0o755))
    entries.append(
        Entry("lib64/ld-linux-x86-64.so.2", target="/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
    )
    # Names for the mesh's uid/gid (1337) and root, for tools that look them up.
    entries.append(
        Entry(
            "etc/passwd", b"root:x:0:0::/:/sbin/nologin\nistio-proxy:x:1337:1337::/:/sbin/nologin\n"
        )
    )
    entries.append(Entry("etc/group", b"root:x:0:\nistio-proxy:x:1337:\n"))
    image = Image(tags=tuple(tags), entries=tuple(entries), entrypoint=("/usr/local/bin/meshctl",))
    return cached_archive(cache, "meshctl", image)
