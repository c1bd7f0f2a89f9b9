"""The undo record injection leaves on a pod (``inject.meshctl.io/undo``): written, and read back.

Owns the record's JSON: the prior value of each label and annotation injection set (null: it did
not exist), the paths of the fields injection created (``absent``) or filled in for a null
(``null``), the probes as the user wrote them where the probers differ, the user's ``istio-*``
containers, the annotations' order when one was removed, and the gateway's sysctl. ``Recorder``
collects it while merging; ``read`` and ``restore`` put a pod back on uninject. A record read
back is the user's text (it may have been edited): every field is checked before it is used,
and a field injection created is removed only while it is still empty.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypedDict, TypeVar, cast

from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject import render
from meshctl.core.k8s.inject.errors import InvalidAnnotationError
from meshctl.core.k8s.inject.overrides import Taken

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import PodTemplate, Probe

_Field = TypeVar("_Field")


class UndoRecord(TypedDict, total=False):
    """The record as written (keys in this order; empty ones left out)."""

    labels: dict[str, str | None]
    annotations: dict[str, str | None]
    absent: list[str]
    null: list[str]
    probes: dict[str, Probe]
    overrides: list[Taken]  # [field, index, container]
    annotationOrder: list[str]
    sysctl: str


class Recorder:
    """Collects what merging changes, to write into the undo annotation."""

    def __init__(self) -> None:
        self.labels: dict[str, str | None] = {}
        self.annotations: dict[str, str | None] = {}
        self.absent: list[str] = []
        self.null: list[str] = []
        # Probes as written where the probers differ (a named port), by the path they now use.
        self.probes: dict[str, Probe] = {}
        self.order: list[str] = []  # the annotations' order, when injection removed one
        self.overrides: list[Taken] = []  # the user's istio-* containers
        self.sysctl = False  # the gateway's unprivileged-ports sysctl was added

    def field(self, holder: Mapping[str, object], key: str, path: str, empty: _Field) -> _Field:
        """``holder[key]``, created as ``empty`` (and remembered) when absent or null; a value
        already there is the user's, taken as the view the caller names."""
        fields = cast("dict[str, object]", holder)
        if key not in fields:
            self.absent.append(path)
            fields[key] = empty
        elif fields[key] is None:
            self.null.append(path)
            fields[key] = empty
        return cast(_Field, fields[key])

    def set(
        self, target: dict[str, str], record: dict[str, str | None], key: str, value: str
    ) -> None:
        if key not in record:
            record[key] = target.get(key)
        target[key] = value

    def remove(self, target: dict[str, str], record: dict[str, str | None], key: str) -> None:
        """Drops ``target[key]``, remembering its value and (once) the order of ``target``."""
        if not self.order:
            self.order = list(target)
        if key not in record:
            record[key] = target.get(key)
        target.pop(key, None)

    def to_json(self) -> str:
        data: UndoRecord = {}
        if self.labels:
            data["labels"] = self.labels
        if self.annotations:
            data["annotations"] = self.annotations
        if self.absent:
            data["absent"] = self.absent
        if self.null:
            data["null"] = self.null
        if self.probes:
            data["probes"] = self.probes
        if self.overrides:
            data["overrides"] = self.overrides
        if self.order:
            data["annotationOrder"] = self.order
        if self.sysctl:
            data["sysctl"] = render.GATEWAY_SYSCTL["name"]
        return json.dumps(data, separators=(",", ":"))


def read(text: str) -> dict[str, object]:
    """The record in the annotation's ``text``; ``InvalidAnnotationError`` when it is no JSON
    object."""
    record = ann.json_object(text)
    if record is None:
        raise InvalidAnnotationError(
            ann.UNDO, text, expected="the JSON meshctl wrote; remove it to inject afresh"
        )
    return record


def restore(pod: PodTemplate, record: Mapping[str, object]) -> None:
    """Puts back the labels, annotations (in their order), sysctls and empty fields ``record``
    says injection changed (``pod``: our own copy, changed in place)."""
    metadata = pod.get("metadata")
    for section in ("labels", "annotations"):
        target = metadata.get(section) if isinstance(metadata, dict) else None
        if not isinstance(target, dict):
            continue
        for key, previous in _mapping(record.get(section)).items():
            if previous is None:
                target.pop(key, None)
            else:
                target[key] = previous
    order = record.get("annotationOrder")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if isinstance(order, list) and isinstance(annotations, dict):
        # Keys injection removed come back where they were; keys added since go last.
        rank = {key: i for i, key in enumerate(order)}
        items = sorted(annotations.items(), key=lambda kv: rank.get(kv[0], len(rank)))
        annotations.clear()
        annotations.update(items)
    if record.get("sysctl"):
        spec = pod.get("spec")
        context = spec.get("securityContext") if isinstance(spec, dict) else None
        if isinstance(context, dict) and isinstance(context.get("sysctls"), list):
            context["sysctls"] = [s for s in context["sysctls"] if s != render.GATEWAY_SYSCTL]
    # Deepest first, so "metadata" goes only after "metadata.labels" has.
    for path in sorted(_list(record.get("absent")), key=lambda p: -str(p).count(".")):
        _restore_field(pod, str(path), absent=True)
    for path in _list(record.get("null")):
        _restore_field(pod, str(path), absent=False)


def _restore_field(pod: PodTemplate, path: str, *, absent: bool) -> None:
    """Deletes (or nulls) a field injection created, unless something is in it now."""
    *parents, last = path.split(".")
    holder: object = pod
    for part in parents:
        holder = holder.get(part) if isinstance(holder, dict) else None
    if isinstance(holder, dict) and last in holder and not holder[last]:
        if absent:
            del holder[last]
        else:
            holder[last] = None


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) and value else []
