"""The manifest of a frozen one-dir tree: every file's path, mode, size and SHA-256, and symlinks.

The build writes it into the tree (``MANIFEST_NAME``, beside the executable); the CNI installer
verifies a tree against it before placing a copy on the node. Invariants: paths are relative,
normalised and never leave the tree; modes are 0755 or 0644 (what the build gives every file);
the rendering is canonical (sorted, fixed separators), so ``digest`` names the tree's content:
same files, same digest.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass
from typing import Any

MANIFEST_NAME = "meshctl-tree.json"
FORMAT = 1
MODES = (0o755, 0o644)


class ManifestError(ValueError):
    """The manifest is not one this code wrote (corrupt, or from an incompatible build)."""


@dataclass(frozen=True, slots=True)
class File:
    path: str
    mode: int
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class Link:
    path: str
    target: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    version: str
    executable: str
    files: tuple[File, ...]
    links: tuple[Link, ...] = ()

    def render(self) -> bytes:
        """The canonical bytes (what ``digest`` hashes and the tree holds)."""
        body = {
            "format": FORMAT,
            "version": self.version,
            "executable": self.executable,
            "files": [
                {"path": f.path, "mode": f.mode, "size": f.size, "sha256": f.sha256}
                for f in sorted(self.files, key=lambda f: f.path)
            ],
            "links": [
                {"path": link.path, "target": link.target}
                for link in sorted(self.links, key=lambda link: link.path)
            ],
        }
        return (json.dumps(body, sort_keys=True, separators=(",", ":")) + "\n").encode()

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.render()).hexdigest()

    @property
    def name(self) -> str:
        """A directory name for a copy of this tree: version and a digest prefix."""
        return f"{self.version}-{self.digest[:16]}"

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def file_mode(executable: bool) -> int:
    """The only two modes a tree's files have (umask-proof: every user may read and run them)."""
    return 0o755 if executable else 0o644


def check_path(path: str) -> str:
    """``path`` if it is a relative path inside the tree, else ``ManifestError``."""
    if (
        not path
        or path.startswith("/")
        or posixpath.normpath(path) != path
        or path.split("/", maxsplit=1)[0] == ".."
        or path == MANIFEST_NAME
    ):
        raise ManifestError(f"path {path!r} is not a plain relative path inside the tree")
    return path


def parse(data: bytes) -> Manifest:
    """The manifest ``data`` holds; ``ManifestError`` (one line) when it is not a valid one."""
    try:
        body = json.loads(data)
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise ManifestError(f"not a format-{FORMAT} tree manifest")
        files = tuple(_file(item) for item in body["files"])
        links = tuple(
            Link(check_path(str(item["path"])), _target(str(item["target"])))
            for item in body.get("links", [])
        )
        manifest = Manifest(
            version=str(body["version"]),
            executable=check_path(str(body["executable"])),
            files=files,
            links=links,
        )
    except (ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, ManifestError):
            raise
        raise ManifestError(f"malformed tree manifest: {type(exc).__name__}: {exc}") from exc
    paths = [f.path for f in files] + [link.path for link in links]
    if len(set(paths)) != len(paths):
        raise ManifestError("a path appears twice in the tree manifest")
    if manifest.executable not in {f.path for f in files if f.mode == 0o755}:
        raise ManifestError(f"the executable {manifest.executable!r} is not an executable file")
    if manifest.render() != data:
        raise ManifestError("the tree manifest is not in its canonical form")
    return manifest


def _file(item: dict[str, Any]) -> File:
    mode, size, sha = item["mode"], item["size"], str(item["sha256"])
    if mode not in MODES:
        raise ManifestError(f"mode {mode!r} of {item['path']!r} is not 0755 or 0644")
    if not isinstance(size, int) or size < 0:
        raise ManifestError(f"size {size!r} of {item['path']!r} is not a byte count")
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise ManifestError(f"sha256 of {item['path']!r} is not a hex digest")
    return File(check_path(str(item["path"])), mode, size, sha)


def _target(target: str) -> str:
    """A link target must stay inside the tree (resolved against the link's directory)."""
    if target.startswith("/") or ".." in target.split("/"):
        raise ManifestError(f"link target {target!r} leaves the tree")
    return target
