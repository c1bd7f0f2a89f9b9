"""An image as data, and the OCI documents that describe it (image-spec v1.1).

Entries, layers and the image's run-time config are plain values; ``complete`` orders a layer's
entries (every parent directory present, sorted by path components), and the ``*_document``
functions render the config, manifest, index and ``docker save`` manifest canonically (sorted
keys, no spaces), so equal inputs give equal bytes and so equal digests. Writing tars and reading
files is meshctl.image.oci's.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

EPOCH = "1970-01-01T00:00:00Z"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
NAME_ANNOTATION = "io.containerd.image.name"  # containerd's (and Docker 25's) full image name
REF_ANNOTATION = "org.opencontainers.image.ref.name"  # the OCI spec's: the tag


@dataclass(frozen=True, slots=True)
class Entry:
    """One member of a layer: an absolute path in the image and what is there."""

    path: str
    kind: Literal["dir", "file", "symlink"]
    mode: int = 0o755
    source: str | None = None  # a file's bytes come from this file on the build machine ...
    data: bytes | None = None  # ... or are given
    target: str = ""  # a symlink's target
    uid: int = 0
    gid: int = 0


def directory(path: str, mode: int = 0o755) -> Entry:
    return Entry(path, "dir", mode)


def file_bytes(path: str, data: bytes, mode: int = 0o644) -> Entry:
    return Entry(path, "file", mode, data=data)


def symlink(path: str, target: str) -> Entry:
    return Entry(path, "symlink", 0o777, target=target)


@dataclass(frozen=True, slots=True)
class Layer:
    comment: str  # the history entry's created_by
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Image:
    repository: str  # e.g. localhost/meshctl
    tag: str
    layers: tuple[Layer, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    user: str = ""
    workdir: str = "/"
    labels: dict[str, str] = field(default_factory=dict)
    # Further full references (repository:tag) of the same image: a test image that must answer to
    # every name upstream manifests use for it.
    aliases: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"

    @property
    def refs(self) -> tuple[str, ...]:
        """Every name the tarball gives the image, ``ref`` first."""
        return (self.ref, *(a for a in self.aliases if a != self.ref))


@dataclass(frozen=True, slots=True)
class Written:
    ref: str
    digest: str  # the manifest's: what `ctr images ls` and the kubelet's imageID show
    config: str
    size: int


@dataclass(frozen=True, slots=True)
class Blob:
    """A descriptor's three facts (image-spec descriptor.md)."""

    media_type: str
    digest: str  # sha256:<hex>
    size: int

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


def canonical(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def complete(entries: Iterable[Entry]) -> list[Entry]:
    """The entries sorted by path, every missing parent directory added (0755), duplicates
    refused unless identical; ``ValueError`` for relative paths."""
    by_path: dict[str, Entry] = {}
    for entry in entries:
        if not entry.path.startswith("/") or entry.path != posixpath.normpath(entry.path):
            raise ValueError(f"image path {entry.path!r} is not absolute and normalised")
        if entry.path == "/":
            continue
        known = by_path.get(entry.path)
        if known is not None and known != entry and not (known.kind == entry.kind == "dir"):
            raise ValueError(f"{entry.path} is given twice, differently")
        by_path[entry.path] = entry
    for path in list(by_path):
        parent = posixpath.dirname(path)
        while parent != "/" and parent not in by_path:
            by_path[parent] = directory(parent)
            parent = posixpath.dirname(parent)
    for path in by_path:
        parent = posixpath.dirname(path)
        if parent != "/" and by_path[parent].kind != "dir":
            raise ValueError(f"{path}: its parent {parent} is a {by_path[parent].kind}")
    # Sorting by path components puts every directory before what it holds.
    return [by_path[p] for p in sorted(by_path, key=lambda p: p.split("/"))]


def tag_of(ref: str) -> str:
    """The tag of ``repository:tag`` (a registry's ``host:port/`` is not one)."""
    repository, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag or not repository:
        raise ValueError(f"image reference {ref!r} has no tag")
    return tag


def config_fields(image: Image) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "Entrypoint": list(image.entrypoint),
        "Env": list(image.env),
        "WorkingDir": image.workdir,
        "Labels": dict(sorted(image.labels.items())),
    }
    if image.cmd:
        fields["Cmd"] = list(image.cmd)
    if image.user:
        fields["User"] = image.user
    return fields


def recipe_body(
    image: Image, writer_digest: str, arch: str, content: Sequence[Sequence[str]]
) -> dict[str, Any]:
    """What a tarball is made of, for a cache key: ``content[i][j]`` is the content digest of
    the j-th entry of ``complete(image.layers[i].entries)`` ("" for non-files)."""
    return {
        "writer": writer_digest,
        "ref": image.ref,
        "aliases": list(image.refs[1:]),
        "config": config_fields(image),
        "arch": arch,
        "layers": [
            {
                "comment": layer.comment,
                "entries": [
                    [e.path, e.kind, e.mode, e.uid, e.gid, e.target, digest]
                    for e, digest in zip(complete(layer.entries), digests, strict=True)
                ],
            }
            for layer, digests in zip(image.layers, content, strict=True)
        ],
    }


def config_document(image: Image, diff_ids: Sequence[str], arch: str) -> bytes:
    """The image config (image-spec config.md): a fixed creation time, one history entry per
    layer; ``diff_ids`` are the uncompressed layers' digests (ours are never compressed)."""
    return canonical(
        {
            "architecture": arch,
            "os": "linux",
            "created": EPOCH,
            "config": config_fields(image),
            "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
            "history": [{"created": EPOCH, "created_by": layer.comment} for layer in image.layers],
        }
    )


def manifest_document(config: Blob, layers: Sequence[Blob]) -> bytes:
    return canonical(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": config.descriptor(),
            "layers": [layer.descriptor() for layer in layers],
        }
    )


def index_document(refs: Sequence[str], manifest: Blob, arch: str) -> bytes:
    """The layout's index.json: one descriptor per name, all of the same manifest (containerd's
    import names an image after each descriptor's io.containerd.image.name)."""
    return canonical(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                {
                    **manifest.descriptor(),
                    "platform": {"architecture": arch, "os": "linux"},
                    "annotations": {NAME_ANNOTATION: ref, REF_ANNOTATION: tag_of(ref)},
                }
                for ref in refs
            ],
        }
    )


def docker_document(refs: Sequence[str], config: Blob, layers: Sequence[Blob]) -> bytes:
    """``docker save``'s manifest.json naming the same blobs (what ``docker load`` reads)."""
    return canonical(
        [
            {
                "Config": f"blobs/sha256/{config.digest.removeprefix('sha256:')}",
                "RepoTags": list(refs),
                "Layers": [f"blobs/sha256/{b.digest.removeprefix('sha256:')}" for b in layers],
            }
        ]
    )


LAYOUT_DOCUMENT = canonical({"imageLayoutVersion": "1.0.0"})


@dataclass(frozen=True, slots=True)
class Parsed:
    """What a layout's index and manifest say: the names, the manifest and its blobs."""

    refs: tuple[str, ...]
    manifest: Blob
    config: Blob
    layers: tuple[Blob, ...]


def parse_index(index: bytes) -> tuple[Blob, tuple[str, ...]]:
    """The first manifest an index.json names, and every name given to it; ``ValueError`` if
    the index is not an image index of one manifest."""
    try:
        body = json.loads(index)
        found = body["manifests"]
        first = found[0]
        blob = Blob(str(first["mediaType"]), str(first["digest"]), int(first["size"]))
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"not an OCI image index ({exc.__class__.__name__}: {exc})") from exc
    if blob.media_type != MEDIA_MANIFEST:
        raise ValueError(f"the index names a {blob.media_type}, not an image manifest")
    refs = tuple(
        str(m["annotations"][NAME_ANNOTATION])
        for m in found
        if isinstance(m, dict)
        and m.get("digest") == blob.digest
        and NAME_ANNOTATION in (m.get("annotations") or {})
    )
    return blob, refs


def parse_manifest(manifest: bytes) -> tuple[Blob, tuple[Blob, ...]]:
    """The config and layer descriptors of an image manifest; ``ValueError`` otherwise."""
    try:
        body = json.loads(manifest)
        config = body["config"]
        blobs = tuple(
            Blob(str(d["mediaType"]), str(d["digest"]), int(d["size"])) for d in body["layers"]
        )
        return Blob(str(config["mediaType"]), str(config["digest"]), int(config["size"])), blobs
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not an OCI image manifest ({exc.__class__.__name__}: {exc})") from exc
