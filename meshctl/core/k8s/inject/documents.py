"""Manifests as text: YAML documents in, the same documents out, pod templates transformed.

Owns multi-document YAML, ``v1 List`` objects and the error positions users see. Invariants:
documents come out in input order, each as one YAML document; objects that carry no pod template
(Services, ConfigMaps, unknown kinds and custom resources) come out equal to what went in; a
failure anywhere raises before any text is produced, naming the source, the line and the object.
Timestamps stay strings (as the API server reads YAML), so dates round-trip unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from meshctl.core.k8s.inject import kinds
from meshctl.core.k8s.inject.errors import InjectError, ManifestError
from meshctl.core.k8s.inject.pipeline import Injected, inject_pod, uninject_pod
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.output import yaml_documents

# libyaml's C loader is several times faster than the pure-Python one (the 1,000-Deployment
# benchmark depends on it); PyYAML's wheels ship it, source builds may not.
try:
    from yaml import CSafeLoader as _BaseLoader
except ImportError:  # pragma: no cover -- PyYAML built without libyaml
    from yaml import SafeLoader as _BaseLoader  # type: ignore[assignment]

_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"


class _Loader(_BaseLoader):
    """Safe loading without the timestamp resolver: ``2024-01-01`` stays the string it is."""

    yaml_implicit_resolvers = {  # noqa: RUF012 -- PyYAML's per-class table, replaced whole
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
        for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
    }


# A transform of one pod template: (template, workload name, namespace) -> result.
PodTransform = Callable[[Mapping[str, Any], str, str | None], Injected]
# Called once per document done, for a progress display (the CLI's; the core only counts).
Tick = Callable[[], None]


@dataclass(frozen=True, slots=True)
class Document:
    """One YAML document: its parsed object and the 1-based line it starts on."""

    data: Any
    line: int
    item_lines: tuple[int, ...] = ()  # for a List: where each item starts


@dataclass(frozen=True, slots=True)
class Skipped:
    """A workload left uninjected, and why, or (``warning``) injected with something the user
    should know, such as an annotation without effect (for the CLI to report)."""

    where: str
    reason: str
    warning: bool = False


def load(text: str, source: str, tick: Tick | None = None) -> list[Document]:
    """Parses every YAML document of ``text``; empty documents are dropped.

    Raises ``ManifestError`` with ``source``, line and column on a syntax error.
    """
    loader = _Loader(text)
    documents: list[Document] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            data = loader.construct_document(node)
            if data is None:
                continue
            documents.append(Document(data, node.start_mark.line + 1, _item_lines(node)))
            if tick is not None:
                tick()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "syntax error"
        raise ManifestError(
            f"{source}: invalid YAML{where}: {problem}",
            hint="fix the YAML there (the mistake may be just before that point)",
        ) from exc
    except yaml.YAMLError as exc:  # reader errors: control characters and the like
        raise ManifestError(f"{source}: invalid YAML: {exc}", hint="fix the YAML") from exc
    finally:
        loader.dispose()
    return documents


def _item_lines(node: yaml.Node) -> tuple[int, ...]:
    if not isinstance(node, yaml.MappingNode):
        return ()
    for key, value in node.value:
        if (
            isinstance(key, yaml.ScalarNode)
            and key.value == "items"
            and isinstance(value, yaml.SequenceNode)
        ):
            return tuple(item.start_mark.line + 1 for item in value.value)
    return ()


def dump(objects: list[Any], tick: Tick | None = None) -> str:
    """The objects as YAML documents separated by ``---``, as every command prints YAML
    (``meshctl.output``: Kubernetes key order, no anchors)."""
    return yaml_documents(objects, tick)


def transform(
    documents: list[Document], source: str, pod_transform: PodTransform, tick: Tick | None = None
) -> tuple[list[Any], list[Skipped]]:
    """Every document with its pod templates transformed; the others as they were."""
    results: list[Any] = []
    skipped: list[Skipped] = []
    for number, document in enumerate(documents, start=1):
        where = (
            f"{source}:{document.line}"
            if len(documents) == 1
            else f"{source}:{document.line} (document {number})"
        )
        results.append(
            _object(document.data, where, source, document.item_lines, pod_transform, skipped)
        )
        if tick is not None:
            tick()
    return results, skipped


def _object(
    obj: Any,
    where: str,
    source: str,
    item_lines: tuple[int, ...],
    pod_transform: PodTransform,
    skipped: list[Skipped],
) -> Any:
    if not isinstance(obj, dict):
        raise ManifestError(
            f"{where}: expected a Kubernetes object (a mapping), found a {_kind_of_value(obj)}",
            hint="each YAML document must be one object with apiVersion, kind and metadata",
        )
    if kinds.is_list(obj):
        items = obj.get("items")
        if items is None:
            return obj
        if not isinstance(items, list):
            raise ManifestError(f"{where}: List items is not a list", hint="fix its YAML")
        new_items = [
            _object(
                item,
                f"{source}:{item_lines[i]}" if i < len(item_lines) else f"{where} item {i + 1}",
                source,
                (),
                pod_transform,
                skipped,
            )
            for i, item in enumerate(items)
        ]
        return {**obj, "items": new_items}
    path = kinds.template_path(obj)
    if path is None:
        return obj
    what = kinds.describe(obj)
    template = _get(obj, path)
    if not isinstance(template, dict):
        raise ManifestError(
            f"{where}: {what}: no pod template at {'.'.join(path)}",
            hint="a workload needs a pod template with containers",
        )
    metadata = obj.get("metadata")
    namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    # A Pod that names its controller (generateName and a controlling owner) belongs to that
    # workload, as for the webhook; any other object is its own workload.
    name = kinds.object_name(obj)
    if not path and isinstance(metadata, dict) and metadata.get("generateName"):
        name = kinds.workload_name_of_pod(obj)
    try:
        outcome = pod_transform(template, name, namespace if isinstance(namespace, str) else None)
    except InjectError as exc:
        raise ManifestError(f"{where}: {what}: {exc.message}", hint=exc.hint) from exc
    if outcome.skipped is not None:
        skipped.append(Skipped(f"{where}: {what}", outcome.skipped))
    skipped.extend(Skipped(f"{where}: {what}", w, warning=True) for w in outcome.warnings)
    return _replace(obj, path, outcome.pod)


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _replace(obj: dict[str, Any], path: tuple[str, ...], value: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` with ``value`` at ``path``: only the mappings on the path are copied."""
    if not path:
        return value
    head, *rest = path
    return {**obj, head: _replace(obj[head], tuple(rest), value)}


def _kind_of_value(value: Any) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def inject_documents(
    parsed: list[Document],
    source: str,
    settings: InjectSettings,
    *,
    uninject: bool = False,
    tick: Tick | None = None,
) -> tuple[list[Any], list[Skipped]]:
    """The documents' objects with every pod template injected (or uninjected), and the skips."""

    def inject(template: Mapping[str, Any], name: str, namespace: str | None) -> Injected:
        return inject_pod(template, settings, workload_name=name, namespace=namespace)

    def remove(template: Mapping[str, Any], name: str, namespace: str | None) -> Injected:
        return Injected(uninject_pod(template))

    return transform(parsed, source, remove if uninject else inject, tick)


def inject_text(
    text: str, source: str, settings: InjectSettings, *, uninject: bool = False
) -> tuple[str, list[Skipped]]:
    """``text`` with every pod template injected (or uninjected), as YAML, and what was skipped."""
    objects, skipped = inject_documents(load(text, source), source, settings, uninject=uninject)
    return dump(objects), skipped
