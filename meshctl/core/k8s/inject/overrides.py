"""A user's own ``istio-proxy`` / ``istio-init`` container: Istio's way to override fields of the
injected one (https://istio.io/latest/docs/setup/additional-setup/sidecar-injection/).

Owns taking such containers out of the pod (where they were, for the undo record), merging each
over the container injection renders with the API server's strategic-merge rules for a
container (mappings merge key by key; ``env``, ``ports``, ``volumeMounts`` and ``volumeDevices``
merge by their keys; other lists and scalars are replaced; ``image: auto`` keeps the injected
image), and Istio's ``proxy.istio.io/overrides`` annotation. Pure: copies in, copies out.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Literal, TypeAlias, cast

from meshctl.structured import InputError, load_json

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Container, PodSpec

ANNOTATION = "proxy.istio.io/overrides"
AUTO_IMAGE = "auto"
NAMES = ("istio-proxy", "istio-init", "istio-validation")
# Lists merged element by element, by this key (the container's patchMergeKey fields).
_MERGE_KEYS = {
    "env": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
}

ContainerList = Literal["initContainers", "containers"]
CONTAINER_LISTS: tuple[ContainerList, ...] = ("initContainers", "containers")
# Where a container was: its list, its index.
Taken: TypeAlias = "tuple[ContainerList, int, Container]"


def take(spec: PodSpec) -> list[Taken]:
    """Removes the user's ``istio-*`` containers from ``spec`` (in place): (field, index, it)."""
    taken: list[Taken] = []
    for field in CONTAINER_LISTS:
        items = spec.get(field)
        if not isinstance(items, list):
            continue
        for index, item in enumerate(items):
            if item.get("name") in NAMES:
                taken.append((field, index, item))
        spec[field] = [i for i in items if i.get("name") not in NAMES]
    return taken


def put_back(spec: PodSpec, taken: Iterable[Taken]) -> None:
    """Puts containers ``take`` removed back where they were (in place)."""
    for field, index, item in sorted(taken, key=lambda t: (t[0], t[1])):
        items = spec.get(field)
        if items is None:
            if field in spec:
                continue  # null in the user's YAML: stays as written
            items = spec[field] = []
        items.insert(min(index, len(items)), item)


def taken_from_record(value: object) -> list[Taken]:
    """The ``[field, index, container]`` entries an undo record kept (what ``take`` returned);
    an entry of another shape (the record was edited) is passed over."""
    out: list[Taken] = []
    for entry in value if isinstance(value, list) else ():
        if not isinstance(entry, list) or len(entry) != 3:
            continue
        field, index, item = entry
        if field in CONTAINER_LISTS and isinstance(index, int) and isinstance(item, dict):
            out.append((field, index, cast("Container", item)))
    return out


def merge(injected: Container, user: Mapping[str, object]) -> Container:
    """``injected`` with the user's fields merged over it."""
    # Field by field, whatever the user wrote: the container as the JSON it is.
    out = cast("dict[str, object]", copy.deepcopy(injected))
    for key, value in user.items():
        if key == "name" or (key == "image" and value in (AUTO_IMAGE, "", None)):
            continue
        out[key] = _merged(key, out.get(key), value)
    return cast("Container", out)


def _merged(key: str, base: object, patch: object) -> object:
    if isinstance(patch, dict) and isinstance(base, dict):
        merged = dict(base)
        for k, v in patch.items():
            merged[k] = _merged(k, base.get(k), v)
        return merged
    merge_key = _MERGE_KEYS.get(key)
    if merge_key and isinstance(patch, list) and isinstance(base, list):
        result: list[object] = [dict(b) if isinstance(b, dict) else b for b in base]
        for item in patch:
            found = next(
                (
                    i
                    for i, b in enumerate(result)
                    if isinstance(b, dict)
                    and isinstance(item, dict)
                    and b.get(merge_key) == item.get(merge_key)
                ),
                None,
            )
            if found is None:
                result.append(copy.deepcopy(item))
            else:
                result[found] = _merged("", result[found], item)
        return result
    return copy.deepcopy(patch)


def annotation(taken: Iterable[Taken], injected_names: set[str]) -> str:
    """Istio's record of the overrides applied, so a re-injection can apply them again."""
    record: dict[str, list[dict[str, object]]] = {}
    for field, _, item in taken:
        if item.get("name") not in injected_names:
            continue
        shown = {k: v for k, v in item.items() if not (k == "image" and v == AUTO_IMAGE)}
        record.setdefault("containers" if field == "containers" else "initContainers", [])
        record["containers" if field == "containers" else "initContainers"].append(shown)
    return json.dumps(record, separators=(",", ":"))


def from_annotation(text: str) -> list[Taken]:
    """The overrides an Istio-injected pod recorded, to put back at the end of their lists."""
    try:
        record = load_json(text, ANNOTATION)
    except (InputError, TypeError):
        return []
    if not isinstance(record, dict):
        return []
    out: list[Taken] = []
    for field in CONTAINER_LISTS:
        for item in record.get(field) or ():
            if isinstance(item, dict) and item.get("name") in NAMES:
                out.append((field, 1 << 30, cast("Container", item)))
    return out
