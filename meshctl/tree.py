"""The frozen one-dir tree on disk: finding this process's own, hashing one, placing a copy.

The manifest format lives in ``meshctl.core.tree``; this module reads and writes files only.
Invariants: ``place`` never leaves a partial tree under its final name (it copies into a temp
directory, checks every byte against the manifest, fsyncs, then renames), and a tree that does not
match its manifest is never reported as placed.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import sys
from pathlib import Path

from meshctl import __version__
from meshctl.core.tree import MANIFEST_NAME, File, Link, Manifest, ManifestError, file_mode, parse
from meshctl.errors import MeshctlError

CHUNK = 1 << 20


def own() -> tuple[Path, Manifest] | None:
    """This process's tree and its manifest when it runs from one (the image's form), else None.

    The one-file binary has no manifest beside it (it unpacks into a fresh temp dir per start);
    an unfrozen install has no tree at all.
    """
    if not getattr(sys, "frozen", False):
        return None
    root = Path(sys.executable).resolve().parent
    try:
        data = (root / MANIFEST_NAME).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise MeshctlError(
            f"cannot read this build's tree manifest {root / MANIFEST_NAME}: {exc.strerror}",
            hint="reinstall meshctl (the image's /opt/meshctl is damaged)",
        ) from exc
    try:
        return root, parse(data)
    except ManifestError as exc:
        raise MeshctlError(
            f"{root / MANIFEST_NAME}: {exc}", hint="reinstall meshctl (rebuild the image)"
        ) from exc


def scan(root: Path, executable: str, version: str = __version__) -> Manifest:
    """The manifest of the tree at ``root`` as it is (the build calls this once, then writes it)."""
    files, links = [], []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST_NAME:
            continue
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            links.append(Link(rel, str(path.readlink())))
        elif stat.S_ISREG(info.st_mode):
            files.append(
                File(rel, file_mode(bool(info.st_mode & 0o111)), info.st_size, _hash(path))
            )
        elif not stat.S_ISDIR(info.st_mode):
            raise MeshctlError(f"{path}: not a file, directory or symlink", hint="rebuild the tree")
    return Manifest(version=version, executable=executable, files=tuple(files), links=tuple(links))


def problems(root: Path, manifest: Manifest, *, content: bool) -> list[str]:
    """How the tree at ``root`` differs from ``manifest``: sizes, modes, bytes if ``content``."""
    found = []
    for entry in manifest.files:
        path = root / entry.path
        try:
            info = path.lstat()
        except OSError:
            found.append(f"{entry.path} is missing")
            continue
        if not stat.S_ISREG(info.st_mode) or info.st_size != entry.size:
            found.append(f"{entry.path} is not the {entry.size}-byte file of the manifest")
        elif stat.S_IMODE(info.st_mode) != entry.mode:
            found.append(
                f"{entry.path} has mode {stat.S_IMODE(info.st_mode):o}, not {entry.mode:o}"
            )
        elif content and _hash(path) != entry.sha256:
            found.append(f"{entry.path} does not match its sha256")
    for link in manifest.links:
        try:
            if str((root / link.path).readlink()) != link.target:
                found.append(f"{link.path} does not point to {link.target}")
        except OSError:
            found.append(f"{link.path} is not a symlink")
    return found


def place(source: Path, manifest: Manifest, parent: Path) -> tuple[Path, bool]:
    """A verified copy of the tree ``source`` at ``parent/<manifest.name>``; True if it copied.

    An existing copy is kept when every byte matches. Otherwise the tree is copied into a temp
    directory beside it, each file checked against the manifest while it is written and fsynced,
    and renamed into place (a damaged copy of the same name is moved aside first and removed).
    """
    target = parent / manifest.name
    if target.is_dir() and not problems(target, manifest, content=True):
        return target, False
    if not parent.is_dir():
        parent.mkdir(parents=True)
        parent.chmod(0o755)  # the umask must not narrow it
    tmp = parent / f".tmp-{manifest.name}-{os.getpid()}"
    remove(tmp)
    try:
        _copy(source, manifest, tmp)
        if target.exists() or target.is_symlink():
            aside = parent / f".old-{manifest.name}-{os.getpid()}"
            target.rename(aside)
            remove(aside)
        tmp.rename(target)
        fsync_dir(parent)
    except BaseException:
        remove(tmp)
        raise
    return target, True


def _copy(source: Path, manifest: Manifest, tmp: Path) -> None:
    tmp.mkdir()
    tmp.chmod(0o755)
    directories = {tmp}
    for entry in manifest.files:
        dest = tmp / entry.path
        _mkdirs(dest.parent, directories)
        digest = hashlib.sha256()
        with (source / entry.path).open("rb") as src, _create(dest, entry.mode) as out:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != entry.sha256 or dest.stat().st_size != entry.size:
            raise MeshctlError(
                f"{source / entry.path} does not match this build's tree manifest",
                hint="the image's /opt/meshctl is damaged: rebuild or re-pull the image",
            )
    for link in manifest.links:
        dest = tmp / link.path
        _mkdirs(dest.parent, directories)
        dest.symlink_to(link.target)
    (tmp / MANIFEST_NAME).write_bytes(manifest.render())
    for directory in sorted(directories, key=lambda d: len(d.parts), reverse=True):
        fsync_dir(directory)


def _create(path: Path, mode: int) -> io.FileIO:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    os.fchmod(fd, mode)  # the umask must not narrow it
    return io.FileIO(fd, "wb")


def _mkdirs(directory: Path, made: set[Path]) -> None:
    if directory in made:
        return
    _mkdirs(directory.parent, made)
    directory.mkdir(mode=0o755, exist_ok=True)
    directory.chmod(0o755)
    made.add(directory)


def _hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as src:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove(path: Path) -> None:
    """Remove a tree, file or symlink at ``path`` if there is one."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)
