"""A short writer of container images as files: layer tars, config, manifest, one tarball.

No container daemon, no registry. The tarball is an OCI image layout (``oci-layout``,
``index.json``, ``blobs/sha256/...``; image-spec v1.1 "image-layout.md") and at the same time a
``docker save`` archive (``manifest.json`` with ``RepoTags``, naming the same blobs), the shape
``docker save`` itself writes since Docker 25. ``ctr -n k8s.io images import`` reads the OCI
index and names the image from its ``io.containerd.image.name`` annotation; ``docker load`` and
``podman load`` read either half.

Reproducible by construction: every tar member has mtime 0, uid/gid 0, no user or group names,
PAX headers only where USTAR cannot hold a field; members are sorted by path with every parent
directory present; JSON is rendered canonically (meshctl.core.image.layout); layers are
uncompressed (gzip output differs between zlib versions). Same entries in, same bytes out, so the
same digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import platform
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from meshctl.core.image.layout import (
    LAYOUT_DOCUMENT,
    MEDIA_CONFIG,
    MEDIA_LAYER,
    NAME_ANNOTATION,
    REF_ANNOTATION,
    Blob,
    Entry,
    Image,
    Layer,
    Parsed,
    Written,
    canonical,
    complete,
    config_document,
    directory,
    docker_document,
    file_bytes,
    index_document,
    manifest_document,
    parse_index,
    parse_manifest,
    recipe_body,
    symlink,
)

__all__ = [
    "NAME_ANNOTATION",
    "REF_ANNOTATION",
    "Entry",
    "Image",
    "Layer",
    "Written",
    "architecture",
    "canonical",
    "complete",
    "content_digest",
    "directory",
    "extract",
    "file_bytes",
    "file_from",
    "open_layout",
    "read_archive",
    "recipe",
    "symlink",
    "write_archive",
    "write_layer",
]


def architecture() -> str:
    """The OCI/Go name of this machine's architecture (the binaries in the image are native)."""
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def file_from(path: str, source: Path, mode: int | None = None) -> Entry:
    """``source``'s bytes at ``path``; mode 0755 if it is executable, else 0644, unless given."""
    if mode is None:
        mode = 0o755 if source.stat().st_mode & 0o111 else 0o644
    return Entry(path, "file", mode, source=str(source))


def file_sha256(path: Path) -> str:
    with path.open("rb") as src:
        return hashlib.file_digest(src, "sha256").hexdigest()


def content_digest(entry: Entry) -> str:
    if entry.kind != "file":
        return ""
    if entry.data is not None:
        return hashlib.sha256(entry.data).hexdigest()
    return file_sha256(_source(entry))


def _source(entry: Entry) -> Path:
    if entry.source is None:
        raise ValueError(f"{entry.path}: a file entry needs data or a source")
    return Path(entry.source)


def recipe(image: Image, writer: bytes) -> str:
    """A digest of everything the tarball is made of: equal recipes give equal tarballs.

    ``writer`` is the source of the code that writes it (this module and the image definitions),
    so a change to the writer is a new recipe too. Files are hashed by content.
    """
    content = [[content_digest(e) for e in complete(layer.entries)] for layer in image.layers]
    body = recipe_body(image, hashlib.sha256(writer).hexdigest(), architecture(), content)
    return hashlib.sha256(canonical(body)).hexdigest()


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
                source = _source(entry)
                size = source.stat().st_size
                info = _info(name, kind=tarfile.REGTYPE, mode=entry.mode, size=size, **ids)
                with source.open("rb") as src:
                    tar.addfile(info, src)


def write_archive(image: Image, out: Path) -> Written:
    """Write ``image`` as one tarball at ``out`` (atomically: a temp file beside it, renamed)."""
    arch = architecture()
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".oci-") as work:
        blobs: list[tuple[Blob, Path]] = []
        for number, layer in enumerate(image.layers):
            path = Path(work, f"layer-{number}.tar")
            with path.open("wb") as dest:
                write_layer(layer.entries, dest)
            digest = f"sha256:{file_sha256(path)}"
            blobs.append((Blob(MEDIA_LAYER, digest, path.stat().st_size), path))
        layers = [b for b, _ in blobs]
        config = config_document(image, [b.digest for b in layers], arch)
        config_blob = Blob(MEDIA_CONFIG, _digest(config), len(config))
        manifest = manifest_document(config_blob, layers)
        manifest_blob = Blob("", _digest(manifest), len(manifest))
        index = index_document(image.refs, _manifest_blob(manifest_blob), arch)
        members: dict[str, bytes | Path | None] = {"blobs": None, "blobs/sha256": None}
        for blob, path in blobs:
            members[_blob_name(blob.digest)] = path
        members[_blob_name(config_blob.digest)] = config
        members[_blob_name(manifest_blob.digest)] = manifest
        members["index.json"] = index
        members["manifest.json"] = docker_document(image.refs, config_blob, layers)
        members["oci-layout"] = LAYOUT_DOCUMENT
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
    return Written(image.ref, manifest_blob.digest, config_blob.digest, size)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _manifest_blob(blob: Blob) -> Blob:
    from meshctl.core.image.layout import MEDIA_MANIFEST

    return Blob(MEDIA_MANIFEST, blob.digest, blob.size)


def _blob_name(digest: str) -> str:
    algorithm, _, hexa = digest.partition(":")
    if algorithm != "sha256" or len(hexa) != 64 or not all(c in "0123456789abcdef" for c in hexa):
        raise ValueError(f"{digest!r} is not a sha256 digest")
    return f"blobs/sha256/{hexa}"


class Layout:
    """An image tarball opened for reading: its parsed documents and each blob as a stream."""

    def __init__(self, tar: tarfile.TarFile, path: Path) -> None:
        self._tar = tar
        self.path = path
        manifest_blob, refs = parse_index(self._member("index.json").read())
        self.manifest_bytes = self.blob(manifest_blob.digest).read()
        if _digest(self.manifest_bytes) != manifest_blob.digest:
            raise ValueError(f"{path}: the manifest does not match its digest")
        config, layers = parse_manifest(self.manifest_bytes)
        self.parsed = Parsed(refs, manifest_blob, config, layers)

    def _member(self, name: str) -> IO[bytes]:
        try:
            member = self._tar.extractfile(name)
        except KeyError:
            member = None
        if member is None:
            raise ValueError(f"{self.path}: {name} is missing (not an OCI image layout)")
        return member

    def blob(self, digest: str) -> IO[bytes]:
        """The blob's bytes as a stream (not checked here: the reader hashes what it reads)."""
        return self._member(_blob_name(digest))


@contextlib.contextmanager
def open_layout(path: Path) -> Iterator[Layout]:
    """The OCI image layout in the tarball at ``path``; ``ValueError`` when it is not one."""
    try:
        tar = tarfile.open(path)  # noqa: SIM115 (closed below, after the caller is done)
    except tarfile.TarError as exc:
        raise ValueError(f"{path}: not a tar archive ({exc})") from exc
    with tar:
        yield Layout(tar, path)


def read_archive(path: Path) -> dict[str, Any]:
    """What a tarball written here holds: index, manifest, config, and each layer's members.

    For checks (smoke test, tests): ``{"index", "manifest", "config", "docker", "layers"}`` where
    each layer is a list of ``tarfile.TarInfo``. Reads the tarball, never trusts the file name.
    """
    with tarfile.open(path) as tar:

        def blob(digest: str) -> bytes:
            member = tar.extractfile(_blob_name(digest))
            if member is None:
                raise ValueError(f"{path}: blob {digest} is missing")
            data = member.read()
            if _digest(data) != digest:
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
    with open_layout(path) as layout:
        for descriptor in layout.parsed.layers:
            with tarfile.open(fileobj=layout.blob(descriptor.digest)) as layer:
                layer.extractall(dest, filter="tar")
