"""What the injection pipeline relies on in a pod, checked before anything is changed.

Owns ``validate``: a user's pod (or pod template) is refused with a ``ManifestError`` naming the
field unless its metadata's labels and annotations map strings to strings, its spec has a list
of uniquely named containers, and its volumes and pull secrets are lists of mappings; what passes
is returned as the ``PodTemplate`` view the rest of the pipeline reads. Also the reads of that
view every step shares (a null section reads as empty) and the names injection reserves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject import render
from meshctl.core.k8s.inject.errors import ManifestError

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import PodTemplate


def validate(pod: Mapping[str, object]) -> PodTemplate:
    """``pod`` as the view the pipeline reads; raises ``ManifestError`` naming the problem."""
    _validate_metadata(pod.get("metadata"))
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise ManifestError("the pod template has no spec", hint="add spec.containers")
    containers = spec.get("containers")
    if containers is not None and not isinstance(containers, list):
        raise ManifestError(
            f"spec.containers must be a list of containers, not {_a(containers)}",
            hint="write each container as a '- name: ...' item under containers:",
        )
    if not containers:
        raise ManifestError(
            "the pod spec has no containers", hint="a pod needs at least one container to mesh"
        )
    names: set[str] = set()
    for field in ("initContainers", "containers"):
        for name in _names(spec, field, what="container"):
            if name in names:
                raise ManifestError(
                    f"container name {name!r} is used twice", hint="container names must be unique"
                )
            names.add(name)
    for field in ("volumes", "imagePullSecrets"):
        items = spec.get(field)
        if items is not None and (
            not isinstance(items, list) or not all(isinstance(i, dict) for i in items)
        ):
            raise ManifestError(f"spec.{field} is not a list of mappings", hint="fix its YAML")
    return cast("PodTemplate", pod)


def annotations_of(pod: PodTemplate) -> dict[str, str]:
    """The pod's annotations (the pod's own dict, to change in place); a fresh empty one when
    metadata or its annotations are absent or null."""
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return annotations if isinstance(annotations, dict) else {}


def check_reserved_names(pod: PodTemplate) -> None:
    """Refuses a volume named as an injected one, and an undo record without an injection."""
    # A container named as an injected one is not refused: it overrides fields (overrides.py).
    for item in pod["spec"].get("volumes") or ():
        if item.get("name") in render.VOLUMES:
            raise ManifestError(
                f"volume name {item['name']!r} is reserved for the injected sidecar",
                hint="rename the volume (meshctl adds its own)",
            )
    if ann.UNDO in annotations_of(pod):
        raise ManifestError(
            f"annotation {ann.UNDO} without {ann.STATUS}",
            hint=f"remove the {ann.UNDO} annotation; meshctl writes it when it injects",
        )


def _validate_metadata(metadata: object) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise ManifestError(
            "metadata is not a mapping", hint="write metadata as 'key: value' lines"
        )
    for section in ("labels", "annotations"):
        values = metadata.get(section)
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ManifestError(
                f"metadata.{section} is not a mapping", hint="write it as 'key: value' lines"
            )
        for key, value in values.items():
            if not isinstance(key, str):
                raise ManifestError(
                    f"metadata.{section} has a key that is not a string: {key!r}",
                    hint="quote the key",
                )
            if not isinstance(value, str):
                raise ManifestError(
                    f"{section[:-1]} {key!r} has a {type(value).__name__} value, not a string",
                    hint=f'quote the value, e.g. {key}: "{_yaml_scalar(value)}"',
                )


def _names(spec: Mapping[str, object], field: str, *, what: str) -> list[str]:
    """The names of the entries of ``spec[field]`` (a list of named mappings, or absent)."""
    items = spec.get(field)
    if items is None:
        return []
    if not isinstance(items, list):
        raise ManifestError(f"spec.{field} is not a list", hint="write it as a YAML list")
    names = []
    for item in items:
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name:
            raise ManifestError(
                f"an entry of spec.{field} has no name", hint=f"every {what} needs a name"
            )
        names.append(name)
    return names


def _a(value: object) -> str:
    """What a value is, for messages: ``a string``, ``a mapping``, ``a number``."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return f"a string ({value[:30]!r})"
    return "null" if value is None else f"a {type(value).__name__}"


def _yaml_scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
