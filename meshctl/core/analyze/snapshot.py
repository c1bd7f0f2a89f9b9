"""The objects the checks read: live ones listed from the cluster, files layered over them.

Owns ``Item`` (an object and, when it came from ``-f``, where), reading ``-f`` documents into
items (a ``v1 List`` unpacked, a namespaced object without a namespace put in the default one, as
``kubectl apply`` would), layering (a file's object replaces the live one of the same kind,
namespace and name, as applying it would), and the views the checks share: namespaces with their
labels, and workloads (pods and the pod templates of controllers) with their labels and ports.
Invariants: pure; an object lacking ``kind`` or ``metadata.name`` is refused with its file:line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from meshctl import yamlread
from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject.render import PROXY_CONTAINER
from meshctl.core.k8s.inject.webhook_config import NAMESPACE_NAME_LABEL
from meshctl.structured import InputError, Limits

from .findings import Origin, Subject

# Kinds that live outside namespaces (the ones a mesh analysis meets; others read as namespaced).
CLUSTER_SCOPED = frozenset(
    {
        "Namespace",
        "Node",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "PriorityClass",
        "StorageClass",
        "GatewayClass",
    }
)
# Controllers whose pod template becomes pods: (kind, path to the template).
TEMPLATES: Mapping[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def string_map(value: Any) -> dict[str, str]:
    """A label or annotation map; entries that are not strings are read as their text."""
    return {str(k): str(v) for k, v in mapping(value).items()}


def field(obj: Any, *path: str) -> Any:
    for key in path:
        obj = mapping(obj).get(key)
    return obj


def sequence(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


@dataclass(frozen=True, slots=True)
class Item:
    """One object; ``origin`` is None for a live one."""

    obj: Mapping[str, Any]
    origin: Origin | None = None

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind") or "")

    @property
    def group(self) -> str:
        return str(self.obj.get("apiVersion") or "").rpartition("/")[0]

    @property
    def namespace(self) -> str:
        return str(field(self.obj, "metadata", "namespace") or "")

    @property
    def name(self) -> str:
        return str(field(self.obj, "metadata", "name") or "")

    @property
    def labels(self) -> dict[str, str]:
        return string_map(field(self.obj, "metadata", "labels"))

    @property
    def annotations(self) -> dict[str, str]:
        return string_map(field(self.obj, "metadata", "annotations"))

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.group, self.kind, self.namespace, self.name)

    @property
    def subject(self) -> Subject:
        return Subject(self.kind, self.namespace, self.name, self.origin)


@dataclass(frozen=True, slots=True)
class Workload:
    """A pod, or a controller's pod template (``pod`` False): what selectors and ports see."""

    item: Item
    namespace: str
    labels: Mapping[str, str]
    ports: frozenset[int]  # container ports declared
    port_names: Mapping[str, int]  # named container ports
    pod: bool


@dataclass(frozen=True, slots=True)
class Snapshot:
    items: tuple[Item, ...]

    def of_kind(self, kind: str, group: str | None = None) -> list[Item]:
        return [i for i in self.items if i.kind == kind and (group is None or i.group == group)]

    def namespaces(self) -> dict[str, dict[str, str]]:
        """Every namespace the snapshot knows, with its labels (the API server's
        ``kubernetes.io/metadata.name`` included); a namespace only named by its objects has no
        other label."""
        out: dict[str, dict[str, str]] = {}
        for item in self.items:
            if item.namespace and item.kind not in CLUSTER_SCOPED:
                out.setdefault(item.namespace, {NAMESPACE_NAME_LABEL: item.namespace})
        for item in self.of_kind("Namespace"):
            out[item.name] = {**item.labels, NAMESPACE_NAME_LABEL: item.name}
        return out

    def workloads(self) -> list[Workload]:
        out = []
        for item in self.items:
            if item.kind == "Pod":
                out.append(_workload(item, item.obj, pod=True))
            elif item.kind in TEMPLATES:
                template = field(item.obj, *TEMPLATES[item.kind])
                if isinstance(template, Mapping):
                    out.append(_workload(item, template, pod=False))
        return out


def _workload(item: Item, template: Mapping[str, Any], *, pod: bool) -> Workload:
    ports: set[int] = set()
    names: dict[str, int] = {}
    spec = mapping(template.get("spec"))
    for container in (*sequence(spec.get("containers")), *sequence(spec.get("initContainers"))):
        for port in sequence(mapping(container).get("ports")):
            number = mapping(port).get("containerPort")
            if isinstance(number, int) and not isinstance(number, bool):
                ports.add(number)
                if mapping(port).get("name"):
                    names[str(mapping(port)["name"])] = number
    return Workload(
        item=item,
        namespace=item.namespace,
        labels=string_map(field(template, "metadata", "labels")),
        ports=frozenset(ports),
        port_names=names,
        pod=pod,
    )


def has_sidecar(pod: Item) -> bool:
    """``ambient.has_sidecar``'s rule (the injector's status annotation, or an ``istio-proxy``
    container), read from an object of any shape."""
    if ann.STATUS in pod.annotations:
        return True
    spec = mapping(pod.obj.get("spec"))
    return any(
        mapping(c).get("name") == PROXY_CONTAINER
        for key in ("initContainers", "containers")
        for c in sequence(spec.get(key))
    )


def read_documents(
    sources: Iterable[tuple[str, str]], default_namespace: str, limits: Limits
) -> list[Item]:
    """The objects in ``sources`` (name, text) with where each starts. Raises ``InputError``
    naming the file and line of a syntax error, or of a document that is not an object."""
    items: list[Item] = []
    for name, text in sources:
        for document in yamlread.yaml_documents(text, name, limits):
            for value, line in _unpacked(document.data, document.line, document.item_lines):
                items.append(_item(value, Origin(name, line), default_namespace))
    return items


def _unpacked(value: Any, line: int, item_lines: tuple[int, ...]) -> Iterator[tuple[Any, int]]:
    if isinstance(value, Mapping) and str(value.get("kind", "")).endswith("List"):
        for index, entry in enumerate(sequence(value.get("items"))):
            yield entry, item_lines[index] if index < len(item_lines) else line
    else:
        yield value, line


def _item(value: Any, origin: Origin, default_namespace: str) -> Item:
    if not isinstance(value, Mapping):
        raise InputError(
            origin.source,
            f"holds a {type(value).__name__}, not a Kubernetes object",
            line=origin.line,
            hint="give Kubernetes objects (apiVersion, kind, metadata.name)",
        )
    kind, name = value.get("kind"), field(value, "metadata", "name")
    if not isinstance(kind, str) or not kind or not isinstance(name, str) or not name:
        raise InputError(
            origin.source,
            "holds an object without kind or metadata.name",
            line=origin.line,
            hint="give Kubernetes objects (apiVersion, kind, metadata.name)",
        )
    if kind not in CLUSTER_SCOPED and not field(value, "metadata", "namespace"):
        value = {
            **value,
            "metadata": {**mapping(value["metadata"]), "namespace": default_namespace},
        }
    return Item(value, origin)


def layered(live: Iterable[Item], files: Iterable[Item]) -> Snapshot:
    """The cluster as it would be once the files were applied: each file object replaces the
    live object with its key; a file object given twice, the later wins."""
    merged: dict[tuple[str, str, str, str], Item] = {i.key: i for i in live}
    for item in files:
        merged[item.key] = item
    return Snapshot(tuple(merged.values()))
