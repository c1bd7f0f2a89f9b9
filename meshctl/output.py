"""Rendering data for stdout: ``-o json|yaml|table|name``, the same four on every command.

Invariants: the same data renders the same text. Printed YAML never holds anchors or aliases
(a shared object is written out in full each time), puts an object's ``apiVersion``, ``kind``,
``metadata`` first and ``status`` last (metadata's own keys in ObjectMeta's order) and keeps
every other key where it was; several documents are separated by ``---``. JSON keeps the same
key order; several Kubernetes objects in JSON are one ``v1 List``, as kubectl prints them.
A table is built from a mapping (two columns) or a list of mappings (one column per key).
``name`` prints one name a line (``kind.group/name`` for Kubernetes objects, as kubectl does).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class OutputFormat(enum.StrEnum):
    """The formats a data-printing command accepts with ``-o``/``--output``."""

    JSON = "json"
    YAML = "yaml"
    TABLE = "table"
    NAME = "name"


FORMATS = tuple(f.value for f in OutputFormat)

# Where Kubernetes' own types put their fields (TypeMeta, ObjectMeta, then spec..., status).
_OBJECT_FIRST = ("apiVersion", "kind", "metadata")
_OBJECT_LAST = ("status",)
_METADATA_ORDER = (
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
)


def is_object(value: Any) -> bool:
    """Whether ``value`` looks like a Kubernetes object (a mapping with apiVersion and kind)."""
    return isinstance(value, Mapping) and "apiVersion" in value and "kind" in value


def kubernetes_order(value: Any) -> Any:
    """``value`` with every Kubernetes object in it (a List's items too) in Kubernetes' key order;
    anything else is returned as it is."""
    if not is_object(value):
        return value
    first = [k for k in _OBJECT_FIRST if k in value]
    last = [k for k in _OBJECT_LAST if k in value]
    middle = [k for k in value if k not in first and k not in last]
    out = {k: value[k] for k in (*first, *middle, *last)}
    metadata = out.get("metadata")
    if isinstance(metadata, Mapping):
        known = [k for k in _METADATA_ORDER if k in metadata]
        out["metadata"] = {
            k: metadata[k] for k in (*known, *(k for k in metadata if k not in known))
        }
    items = out.get("items")
    if str(out.get("kind", "")).endswith("List") and isinstance(items, list):
        out["items"] = [kubernetes_order(item) for item in items]
    return out


def yaml_text(value: Any) -> str:
    """One YAML document (no ``---``), Kubernetes key order, no anchors, long lines kept whole."""
    return yaml_documents([value])


def yaml_documents(values: Sequence[Any], tick: Callable[[], None] | None = None) -> str:
    """YAML documents separated by ``---`` lines; ``tick`` is called after each (progress)."""
    writer = YamlWriter()
    parts = []
    for value in values:
        parts.append(writer.document(value))
        if tick is not None:
            tick()
    return "---\n".join(parts)


class YamlWriter:
    """Writes one YAML document at a time as ``yaml_documents`` does, remembering how each
    scalar was written (for a stream of documents: ``inject -f``)."""

    def __init__(self) -> None:
        from meshctl.yamlwriter import BlockWriter  # deferred: only YAML output needs PyYAML

        self._writer = BlockWriter()

    def document(self, value: Any) -> str:
        """``value`` as one YAML document (no ``---``), Kubernetes key order, no anchors."""
        from meshctl.yamlwriter import reference

        ordered = kubernetes_order(value)
        text = self._writer.block_yaml(ordered)
        return text if text is not None else reference(ordered)


def object_name(obj: Mapping[str, Any]) -> str:
    """``kind.group/name`` as ``kubectl -o name`` prints it (``deployment.apps/web``; core
    kinds have no group: ``serviceaccount/web``)."""
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    kind = str(obj.get("kind", "")).lower()
    metadata = obj.get("metadata")
    name = metadata.get("name", "") if isinstance(metadata, Mapping) else ""
    return f"{kind}.{group}/{name}" if group else f"{kind}/{name}"


def flatten_lists(objects: Sequence[Any]) -> list[Any]:
    """The objects with every ``v1 List`` replaced by its items (what ``-o name`` lists)."""
    out: list[Any] = []
    for obj in objects:
        items = obj.get("items") if isinstance(obj, Mapping) else None
        if is_object(obj) and str(obj.get("kind", "")).endswith("List") and isinstance(items, list):
            out.extend(flatten_lists(items))
        else:
            out.append(obj)
    return out


def objects_table(objects: Sequence[Any]) -> list[dict[str, str | None]]:
    """KIND / NAME (/ NAMESPACE when any has one) rows for Kubernetes objects."""
    flat = flatten_lists(objects)
    rows = []
    for obj in flat:
        if not is_object(obj):
            continue
        kind, _, name = object_name(obj).partition("/")
        metadata = obj.get("metadata")
        namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
        rows.append({"kind": kind, "name": name, "namespace": namespace})
    if not any(row["namespace"] for row in rows):
        for row in rows:
            del row["namespace"]
    return rows


def render_objects(objects: Sequence[Any], fmt: OutputFormat | str) -> str:
    """Kubernetes objects (manifests) in ``fmt``: YAML documents, one JSON object (a ``v1 List``
    when there are several), a KIND/NAME table, or their names."""
    fmt = OutputFormat(fmt)
    if fmt is OutputFormat.YAML:
        return yaml_documents(objects)
    if fmt is OutputFormat.JSON:
        if len(objects) == 1:
            return json_text(objects[0])
        return json_text({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    if fmt is OutputFormat.NAME:
        return "".join(object_name(o) + "\n" for o in flatten_lists(objects) if is_object(o))
    return render_table(objects_table(objects))


def json_text(value: Any) -> str:
    return json.dumps(kubernetes_order(value), indent=2, ensure_ascii=False) + "\n"


def render(
    data: Any,
    fmt: OutputFormat | str,
    *,
    table: Any = None,
    names: Sequence[str] | None = None,
) -> str:
    """``data`` (JSON-compatible values) as text in ``fmt``, ending with a newline.

    ``table`` is what the table shows when it is not ``data`` itself: a flatter view, or text
    already laid out for people; ``names`` are the lines ``-o name`` prints (default: ``data``'s
    ``name`` keys, or its object names).
    """
    fmt = OutputFormat(fmt)
    if fmt is OutputFormat.JSON:
        return json_text(data)
    if fmt is OutputFormat.YAML:
        return yaml_text(data)
    if fmt is OutputFormat.NAME:
        return "".join(f"{n}\n" for n in (names if names is not None else _names(data)))
    if isinstance(table, str):
        return table if table.endswith("\n") else table + "\n"
    return render_table(data if table is None else table)


def _names(data: Any) -> list[str]:
    records = data if isinstance(data, list) else [data]
    out = []
    for record in records:
        if is_object(record):
            out.append(object_name(record))
        elif isinstance(record, Mapping) and "name" in record:
            out.append(str(record["name"]))
    return out


def render_table(data: Any) -> str:
    """A plain aligned table: mappings as KEY/VALUE rows, lists of mappings as columns."""
    if isinstance(data, Mapping):
        rows = [[str(k).upper(), _cell(v)] for k, v in data.items()]
        return _align(rows)
    if isinstance(data, Sequence) and not isinstance(data, str):
        records = [r for r in data if isinstance(r, Mapping)]
        if len(records) != len(data):
            return "".join(_cell(item) + "\n" for item in data)
        columns: list[str] = []
        for record in records:
            columns.extend(k for k in record if k not in columns)
        rows = [[c.upper() for c in columns]]
        rows.extend([_cell(r.get(c, "")) for c in columns] for r in records)
        return _align(rows)
    return _cell(data) + "\n"


def _cell(value: Any) -> str:
    if isinstance(value, Mapping):
        return ",".join(f"{k}={_cell(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ",".join(_cell(v) for v in value)
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _align(rows: list[list[str]]) -> str:
    if not rows:
        return ""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = (
        "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
    return "\n".join(lines) + "\n"
