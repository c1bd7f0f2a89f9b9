"""Manifests as text: YAML documents in, the same documents out, pod templates transformed.

Owns multi-document YAML, ``v1 List`` objects and the error positions users see. Invariants:
documents come out in input order, each as one YAML document; objects that carry no pod template
(Services, ConfigMaps, unknown kinds and custom resources) come out equal to what went in; an
object without a ``kind`` is refused, as kubectl refuses it. Documents can be taken one at a time
(``read`` and ``transform_stream``: memory stays flat however long the input) or all at once;
either way a failure raises ``ManifestError`` naming the source, the line and the object, and the
input is read by the one bounded reader (``meshctl.yamlread``: alias bombs and runaway nesting
are refused). Timestamps stay strings (as the API server reads YAML), so dates round-trip.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

from meshctl import yamlread
from meshctl.core.k8s.inject import kinds
from meshctl.core.k8s.inject.errors import InjectError, ManifestError
from meshctl.core.k8s.inject.pipeline import Injected, inject_pod, uninject_pod
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.output import yaml_documents
from meshctl.structured import Document, InputError, Limits

# A transform of one pod template: (template, workload name, namespace) -> result.
PodTransform = Callable[[Mapping[str, object], str, str | None], Injected]
# Called once per document done, for a progress display (the CLI's; the core only counts).
Tick = Callable[[], None]


@dataclass(frozen=True, slots=True)
class Skipped:
    """A workload left uninjected, and why, or (``warning``) injected with something the user
    should know, such as an annotation without effect (for the CLI to report)."""

    where: str
    reason: str
    warning: bool = False


def read(
    data: str | BinaryIO,
    source: str,
    limits: Limits = Limits(),  # noqa: B008
) -> Iterator[Document]:
    """The non-empty documents of ``data`` (text, or a binary stream read as they come).

    Raises ``ManifestError`` with ``source`` and the line on a syntax error or a limit."""
    try:
        yield from yamlread.yaml_documents(data, source, limits)
    except InputError as exc:
        raise ManifestError(exc.message, hint=exc.hint) from exc


def load(text: str, source: str, tick: Tick | None = None) -> list[Document]:
    """Every document of ``text`` at once (``read`` one at a time); empty ones are dropped."""
    documents = []
    for document in read(text, source):
        documents.append(document)
        if tick is not None:
            tick()
    return documents


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
    for obj, notes in transform_stream(documents, source, pod_transform):
        results.append(obj)
        skipped.extend(notes)
        if tick is not None:
            tick()
    return results, skipped


def transform_stream(
    documents: Iterable[Document], source: str, pod_transform: PodTransform
) -> Iterator[tuple[Any, list[Skipped]]]:
    """Each document's object, transformed, with what was skipped in it, one at a time.

    Reads one document ahead: a source of one document is named ``SOURCE:LINE`` in messages,
    one of several ``SOURCE:LINE (document N)``."""
    iterator = iter(documents)
    current = next(iterator, None)
    if current is None:
        return
    following = next(iterator, None)
    several = following is not None
    number = 1
    while current is not None:
        where = f"{source}:{current.line}" + (f" (document {number})" if several else "")
        skipped: list[Skipped] = []
        obj = _object(current.data, where, source, current.item_lines, pod_transform, skipped)
        yield obj, skipped
        current, following = following, (next(iterator, None) if following is not None else None)
        number += 1


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
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        problem = "has no kind" if kind is None else f"has a kind that is a {_kind_of_value(kind)}"
        raise ManifestError(
            f"{where}: the object {problem}; kubectl would refuse it too",
            hint="every Kubernetes object names its kind and apiVersion, e.g. kind: Deployment "
            "and apiVersion: apps/v1",
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


def _replace(
    obj: Mapping[str, object], path: tuple[str, ...], value: Mapping[str, object]
) -> Mapping[str, object]:
    """A copy of ``obj`` with ``value`` at ``path``: only the mappings on the path are copied
    (each one ``_object`` walked to find the template)."""
    if not path:
        return value
    head, *rest = path
    return {**obj, head: _replace(cast("Mapping[str, object]", obj[head]), tuple(rest), value)}


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
    return transform(parsed, source, pod_transform(settings, uninject=uninject), tick)


def inject_text(
    text: str, source: str, settings: InjectSettings, *, uninject: bool = False
) -> tuple[str, list[Skipped]]:
    """``text`` with every pod template injected (or uninjected), as YAML, and what was skipped."""
    objects, skipped = inject_documents(load(text, source), source, settings, uninject=uninject)
    return dump(objects), skipped


def pod_transform(settings: InjectSettings, *, uninject: bool = False) -> PodTransform:
    """What ``inject -f`` does to each pod template: inject it, or remove an injection."""

    def inject(template: Mapping[str, object], name: str, namespace: str | None) -> Injected:
        return inject_pod(template, settings, workload_name=name, namespace=namespace)

    def remove(template: Mapping[str, object], name: str, namespace: str | None) -> Injected:
        return Injected(uninject_pod(template))

    return remove if uninject else inject
