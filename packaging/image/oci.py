"""A short writer of container images as files: layer tars, config, manifest, one tarball.

No container daemon, no registry. The tarball is an OCI image layout (``oci-layout``,
``index.json``, ``blobs/sha256/...``; image-spec v1.1 "image-layout.md") and at the same time a
``docker save`` archive (``manifest.json`` with ``RepoTags``, naming the same blobs), the shape
``docker save`` itself writes since Docker 25. ``ctr -n k8s.io images import`` reads the OCI
index and names the image from its ``io.containerd.image.name`` annotation; ``docker load`` and
``podman load`` read either half.

Reproducible by construction: every tar member has mtime 0, uid/gid 0, no user or group names,
PAX headers only where USTAR cannot hold a field; members are sorted by path with every parent
directory present; JSON is rendered canonically; layers are uncompressed (gzip output differs
between zlib versions). Same entries in, same bytes out, so the same digest.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import posixpath
import tarfile
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

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
    source: Path | None = None  # a file's bytes come from here ...
    data: bytes | None = None  # ... or are given
    target: str = ""  # a symlink's target
    uid: int = 0
    gid: int = 0

    def content_digest(self) -> str:
        if self.kind != "file":
            return ""
        if self.data is not None:
            return hashlib.sha256(self.data).hexdigest()
        return file_sha256(self.file_source)

    @property
    def file_source(self) -> Path:
        if self.source is None:
            raise ValueError(f"{self.path}: a file entry needs data or a source")
        return self.source


def directory(path: str, mode: int = 0o755) -> Entry:
    return Entry(path, "dir", mode)


def file_from(path: str, source: Path, mode: int | None = None) -> Entry:
    """``source``'s bytes at ``path``; mode 0755 if it is executable, else 0644, unless given."""
    if mode is None:
        mode = 0o755 if source.stat().st_mode & 0o111 else 0o644
    return Entry(path, "file", mode, source=source)


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


def architecture() -> str:
    """The OCI/Go name of this machine's architecture (the binaries in the image are native)."""
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def canonical(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def file_sha256(path: Path) -> str:
    with path.open("rb") as src:
        return hashlib.file_digest(src, "sha256").hexdigest()


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


def _info(
    name: str, *, kind: bytes, mode: int, size: int = 0, uid: int = 0, gid: int = 0
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.mtime = 0
    info.uid, info.gid = uid, gid
    info.uname = info.gname = ""
    return info


def write_layer(entries: Iterable[Entry], out: IO[bytes]) -> None:
    """The layer tar of ``entries`` (member names relative, as image-spec layer.md has them)."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in complete(entries):
            name = entry.path.lstrip("/")
            ids = {"uid": entry.uid, "gid": entry.gid}
            if entry.kind == "dir":
                tar.addfile(_info(name, kind=tarfile.DIRTYPE, mode=entry.mode, **ids))
            elif entry.kind == "symlink":
                info = _info(name, kind=tarfile.SYMTYPE, mode=0o777, **ids)
                info.linkname = entry.target
                tar.addfile(info)
            elif entry.data is not None:
                info = _info(
                    name, kind=tarfile.REGTYPE, mode=entry.mode, size=len(entry.data), **ids
                )
                tar.addfile(info, io.BytesIO(entry.data))
            else:
                size = entry.file_source.stat().st_size
                info = _info(name, kind=tarfile.REGTYPE, mode=entry.mode, size=size, **ids)
                with entry.file_source.open("rb") as src:
                    tar.addfile(info, src)


def recipe(image: Image, writer: bytes) -> str:
    """A digest of everything the tarball is made of: equal recipes give equal tarballs.

    ``writer`` is the source of the code that writes it (this module and the image definitions),
    so a change to the writer is a new recipe too. Files are hashed by content.
    """
    body = {
        "writer": hashlib.sha256(writer).hexdigest(),
        "ref": image.ref,
        "aliases": list(image.refs[1:]),
        "config": _config_fields(image),
        "arch": architecture(),
        "layers": [
            {
                "comment": layer.comment,
                "entries": [
                    [e.path, e.kind, e.mode, e.uid, e.gid, e.target, e.content_digest()]
                    for e in complete(layer.entries)
                ],
            }
            for layer in image.layers
        ],
    }
    return hashlib.sha256(canonical(body)).hexdigest()


def _tag_of(ref: str) -> str:
    """The tag of ``repository:tag`` (a registry's ``host:port/`` is not one)."""
    repository, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag or not repository:
        raise ValueError(f"image reference {ref!r} has no tag")
    return tag


def _config_fields(image: Image) -> dict[str, Any]:
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


def write_archive(image: Image, out: Path) -> Written:
    """Write ``image`` as one tarball at ``out`` (atomically: a temp file beside it, renamed)."""
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".oci-") as work:
        blobs: list[tuple[str, Path]] = []  # (hex digest, file)
        diff_ids, layer_descriptors = [], []
        for number, layer in enumerate(image.layers):
            path = Path(work, f"layer-{number}.tar")
            with path.open("wb") as dest:
                write_layer(layer.entries, dest)
            digest = file_sha256(path)
            blobs.append((digest, path))
            diff_ids.append(f"sha256:{digest}")
            layer_descriptors.append(
                {
                    "mediaType": MEDIA_LAYER,
                    "digest": f"sha256:{digest}",
                    "size": path.stat().st_size,
                }
            )
        config = canonical(
            {
                "architecture": architecture(),
                "os": "linux",
                "created": EPOCH,
                "config": _config_fields(image),
                "rootfs": {"type": "layers", "diff_ids": diff_ids},
                "history": [
                    {"created": EPOCH, "created_by": layer.comment} for layer in image.layers
                ],
            }
        )
        config_digest = hashlib.sha256(config).hexdigest()
        manifest = canonical(
            {
                "schemaVersion": 2,
                "mediaType": MEDIA_MANIFEST,
                "config": {
                    "mediaType": MEDIA_CONFIG,
                    "digest": f"sha256:{config_digest}",
                    "size": len(config),
                },
                "layers": layer_descriptors,
            }
        )
        manifest_digest = hashlib.sha256(manifest).hexdigest()
        # One descriptor per name, all of the same manifest: containerd's import names an image
        # after each descriptor's io.containerd.image.name.
        index = canonical(
            {
                "schemaVersion": 2,
                "mediaType": MEDIA_INDEX,
                "manifests": [
                    {
                        "mediaType": MEDIA_MANIFEST,
                        "digest": f"sha256:{manifest_digest}",
                        "size": len(manifest),
                        "platform": {"architecture": architecture(), "os": "linux"},
                        "annotations": {NAME_ANNOTATION: ref, REF_ANNOTATION: _tag_of(ref)},
                    }
                    for ref in image.refs
                ],
            }
        )
        docker = canonical(
            [
                {
                    "Config": f"blobs/sha256/{config_digest}",
                    "RepoTags": list(image.refs),
                    "Layers": [f"blobs/sha256/{d}" for d, _ in blobs],
                }
            ]
        )
        members: dict[str, bytes | Path | None] = {"blobs": None, "blobs/sha256": None}
        for digest, path in blobs:
            members[f"blobs/sha256/{digest}"] = path
        members[f"blobs/sha256/{config_digest}"] = config
        members[f"blobs/sha256/{manifest_digest}"] = manifest
        members["index.json"] = index
        members["manifest.json"] = docker
        members["oci-layout"] = canonical({"imageLayoutVersion": "1.0.0"})
        tmp = Path(work, "image.tar")
        with (
            tmp.open("wb") as dest,
            tarfile.open(fileobj=dest, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for name in sorted(members, key=lambda p: p.split("/")):
                value = members[name]
                if value is None:
                    tar.addfile(_info(name, kind=tarfile.DIRTYPE, mode=0o755))
                elif isinstance(value, bytes):
                    tar.addfile(
                        _info(name, kind=tarfile.REGTYPE, mode=0o644, size=len(value)),
                        io.BytesIO(value),
                    )
                else:
                    with value.open("rb") as src:
                        info = _info(
                            name, kind=tarfile.REGTYPE, mode=0o644, size=value.stat().st_size
                        )
                        tar.addfile(info, src)
        size = tmp.stat().st_size
        tmp.replace(out)
    return Written(image.ref, f"sha256:{manifest_digest}", f"sha256:{config_digest}", size)


def read_archive(path: Path) -> dict[str, Any]:
    """What a tarball written here holds: index, manifest, config, and each layer's members.

    For checks (smoke test, tests): ``{"index", "manifest", "config", "docker", "layers"}`` where
    each layer is a list of ``tarfile.TarInfo``. Reads the tarball, never trusts the file name.
    """
    with tarfile.open(path) as tar:

        def blob(digest: str) -> bytes:
            member = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            if member is None:
                raise ValueError(f"{path}: blob {digest} is missing")
            data = member.read()
            if hashlib.sha256(data).hexdigest() != digest.removeprefix("sha256:"):
                raise ValueError(f"{path}: blob {digest} does not match its digest")
            return data

        def document(name: str) -> Any:
            member = tar.extractfile(name)
            if member is None:
                raise ValueError(f"{path}: {name} is missing")
            return json.loads(member.read())

        index = document("index.json")
        manifest_digest = index["manifests"][0]["digest"]
        manifest = json.loads(blob(manifest_digest))
        config = json.loads(blob(manifest["config"]["digest"]))
        layers = []
        for descriptor in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO(blob(descriptor["digest"]))) as layer:
                layers.append(layer.getmembers())
        return {
            "index": index,
            "digest": manifest_digest,
            "manifest": manifest,
            "config": config,
            "docker": document("manifest.json"),
            "oci-layout": document("oci-layout"),
            "layers": layers,
        }


def extract(path: Path, dest: Path) -> None:
    """Unpack every layer of the tarball at ``path`` into ``dest`` in order (a root filesystem).

    For checks only: our layers have no whiteouts, and members are refused if they would land
    outside ``dest``.
    """
    with tarfile.open(path) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        name = f"blobs/sha256/{index['manifests'][0]['digest'].removeprefix('sha256:')}"
        manifest = json.load(tar.extractfile(name))  # type: ignore[arg-type]
        for descriptor in manifest["layers"]:
            member = tar.extractfile(f"blobs/sha256/{descriptor['digest'].removeprefix('sha256:')}")
            if member is None:
                raise ValueError(f"{path}: layer {descriptor['digest']} is missing")
            with tarfile.open(fileobj=member) as layer:
                layer.extractall(dest, filter="tar")
