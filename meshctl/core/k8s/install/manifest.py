"""The rendered install: every object of every enabled component, labelled, keyed and ordered.

Owns the install's labels (how install, prune, uninstall and verify find their objects), the
install's own objects (the namespace, shared by revisions, and the install record of a revision)
and the apply order: components by phase, objects by kind (CRDs and namespaces first, webhook
configurations last), deletion the reverse. Invariants: the same values render the same bytes;
no two objects share a key; labels are stamped on objects' metadata only (never on pod templates,
whose labels select pods); a namespace never gets ``istio.io/rev`` (that would enable injection
in it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshctl import __version__
from meshctl.core.k8s.install.components import Component, Object, Registry, Values
from meshctl.core.k8s.install.values import non_defaults
from meshctl.errors import MeshctlError
from meshctl.structured import Json

FIELD_MANAGER = "meshctl"
COMPONENT_LABEL = "install.meshctl.io/component"
REVISION_LABEL = "istio.io/rev"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "meshctl"
PART_OF_LABEL = "app.kubernetes.io/part-of"
INSTALL = "install"  # the component label of the install's own objects
RECORD_NAME = "meshctl-install"  # the install record ConfigMap of a revision

# Apply order of kinds; kinds not listed go just before the workloads.
KIND_ORDER = (
    "CustomResourceDefinition",
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ConfigMap",
    "Secret",
    "Service",
    "*",
    "DaemonSet",
    "Deployment",
    "StatefulSet",
    "PodDisruptionBudget",
    "HorizontalPodAutoscaler",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
)
CLUSTER_SCOPED = frozenset(
    {
        "CustomResourceDefinition",
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "PriorityClass",
        "StorageClass",
    }
)


@dataclass(frozen=True, slots=True)
class Key:
    """What names an object in a cluster: group, kind, namespace ("" when cluster-scoped), name."""

    group: str
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"


def key_of(obj: Mapping[str, object]) -> Key:
    meta = _mapping(obj.get("metadata"))
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    return Key(group, str(obj.get("kind", "")), str(meta.get("namespace") or ""), str(meta["name"]))


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def count(obj: Mapping[str, object], *path: str, default: int = 0) -> int:
    """The whole number at ``path`` of a JSON object (a status count), or ``default`` where it
    is missing or not one."""
    found = lookup(obj, *path)
    return found if isinstance(found, int) and not isinstance(found, bool) else default


def lookup(obj: Mapping[str, object], *path: str) -> object:
    """The value at ``path`` of a JSON object (read from a cluster: its shape is not ours), or
    None where a step is missing or not a mapping."""
    node: object = obj
    for part in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


@dataclass(frozen=True, slots=True)
class Rendered:
    """One object of the install and the component it belongs to."""

    component: str
    revisioned: bool
    object: Object

    @property
    def key(self) -> Key:
        return key_of(self.object)

    @property
    def api_version(self) -> str:
        return str(self.object["apiVersion"])

    @property
    def kind(self) -> str:
        return str(self.object["kind"])


def selector(revision: str | None) -> str:
    """The label selector of the install's objects: those of one revision, or the shared ones."""
    if revision is None:
        return f"{COMPONENT_LABEL},!{REVISION_LABEL}"
    return f"{COMPONENT_LABEL},{REVISION_LABEL}={revision}"


def stamp(obj: Object, component: str, revision: str | None) -> dict[str, Json]:
    """A copy of ``obj`` with the install's labels on its metadata."""
    # Through JSON, not deepcopy: a manifest may share one labels dict between the object and
    # its pod template, and deepcopy would keep them shared (stamping the pods too).
    out: dict[str, Json] = json.loads(json.dumps(obj))
    meta = dict(_json_mapping(out.get("metadata")))
    labels = dict(_json_mapping(meta.get("labels")))
    labels[MANAGED_BY_LABEL] = MANAGED_BY
    labels.setdefault(PART_OF_LABEL, "meshctl")
    labels[COMPONENT_LABEL] = component
    if revision is None or out.get("kind") == "Namespace":
        labels.pop(REVISION_LABEL, None)
    else:
        labels[REVISION_LABEL] = revision
    meta["labels"] = labels
    out["metadata"] = meta
    return out


def _json_mapping(value: Json) -> Mapping[str, Json]:
    return value if isinstance(value, Mapping) else {}


def namespace_object(name: str) -> Object:
    """The Namespace a stand-alone manifest (``cni``/``controlplane``/``ztunnel manifest``) puts
    first, so ``meshctl X manifest | kubectl apply -f -`` works on a fresh cluster."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {PART_OF_LABEL: "meshctl"}},
    }


def own_objects(registry: Registry, values: Values) -> list[Rendered]:
    """The namespace (shared) and this revision's install record."""
    namespace: Object = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": values.namespace},
    }
    defaults = registry.resolve(profile=values.profile)
    record: Object = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": values.revisioned(RECORD_NAME), "namespace": values.namespace},
        "data": {
            "profile": values.profile,
            "revision": values.revision,
            "version": __version__,
            "components": ",".join(c.name for c in registry.enabled(values)),
            # What the user changed from the profile: verify re-renders the same manifest.
            "values.json": json.dumps(
                non_defaults(values.data(), defaults.data()),
                sort_keys=True,
                separators=(",", ":"),
            ),
        },
    }
    return [
        Rendered(INSTALL, False, stamp(namespace, INSTALL, None)),
        Rendered(INSTALL, True, stamp(record, INSTALL, values.revision)),
    ]


def render(registry: Registry, values: Values) -> list[Rendered]:
    """Every object of the install, stamped and in apply order."""
    out = own_objects(registry, values)
    for component in registry.enabled(values):
        out += _component_objects(component, values)
    seen: dict[Key, str] = {}
    for item in out:
        if item.key in seen:
            raise MeshctlError(
                f"{item.key} is rendered by both {seen[item.key]} and {item.component}",
                hint="a component's manifest clashes with another's: report it",
            )
        seen[item.key] = item.component
    phase = {c.name: c.phase for c in registry.components}
    return sorted(out, key=lambda r: (kind_rank(r.kind), phase.get(r.component, -1)))


def _component_objects(component: Component[Any], values: Values) -> list[Rendered]:
    revision = values.revision if component.revisioned else None
    rendered = []
    for obj in component.objects(values):
        for field in ("apiVersion", "kind"):
            if not obj.get(field):
                raise MeshctlError(
                    f"component {component.name} rendered an object without {field}",
                    hint="report this to the component's maintainers",
                )
        if not _mapping(obj.get("metadata")).get("name"):
            raise MeshctlError(
                f"component {component.name} rendered a {obj['kind']} without a name",
                hint="report this to the component's maintainers",
            )
        rendered.append(
            Rendered(component.name, component.revisioned, stamp(obj, component.name, revision))
        )
    return rendered


def kind_rank(kind: str) -> int:
    return KIND_ORDER.index(kind) if kind in KIND_ORDER else KIND_ORDER.index("*")


def deletion_order(items: Iterable[Rendered]) -> list[Rendered]:
    """Workloads and webhooks first, namespaces and CRDs last."""
    return sorted(items, key=lambda r: kind_rank(r.kind), reverse=True)


def documents(items: Sequence[Rendered]) -> list[Object]:
    return [item.object for item in items]


def revision_of(obj: Mapping[str, object]) -> str | None:
    labels = _mapping(_mapping(obj.get("metadata")).get("labels"))
    value = labels.get(REVISION_LABEL)
    return str(value) if value is not None else None


def component_of(obj: Mapping[str, object]) -> str | None:
    labels = _mapping(_mapping(obj.get("metadata")).get("labels"))
    value = labels.get(COMPONENT_LABEL)
    return str(value) if value is not None else None
