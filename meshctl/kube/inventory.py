"""The cluster side of an install: the live objects behind manifest keys, and what explains them.

Owns reading objects by ``apiVersion``/``kind``/namespace/name (through one ``Mapper``), listing
an install's objects by label over a set of kinds, and the evidence a stuck object leaves: its
newest events and, for a workload, its pods' container states. Invariants: reads only; a kind the
server does not serve reads as "no objects" where listing (a CRD not installed yet) and as an
error where one named object is asked for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from meshctl.errors import KubeError
from meshctl.kube import objects
from meshctl.kube.client import Kube
from meshctl.kube.discovery import Discovered, Mapper
from meshctl.kube.resources import EVENTS, PODS

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Pod

# An install's object, of a kind known at run time (the Mapper's): its reader knows the kind.
Object = dict[str, Any]


@dataclass
class Inventory:
    kube: Kube
    mapper: Mapper = field(init=False)

    def __post_init__(self) -> None:
        self.mapper = Mapper(self.kube)

    def resource(self, obj: Mapping[str, Any]) -> Discovered:
        return self.mapper.resource(str(obj["apiVersion"]), str(obj["kind"]))

    def namespace_of(self, obj: Mapping[str, Any]) -> str | None:
        resource = self.resource(obj)
        return (
            str((obj.get("metadata") or {}).get("namespace") or "") if resource.namespaced else None
        )

    def get(self, obj: Mapping[str, Any]) -> Object | None:
        """The live object with ``obj``'s kind, namespace and name, or None."""
        resource = self.resource(obj)
        name = str(obj["metadata"]["name"])
        live = objects.get(self.kube, resource, name, self.namespace_of(obj))
        if live is not None:
            live.setdefault("apiVersion", resource.api_version)
            live.setdefault("kind", resource.kind)
        return live

    def list_labelled(
        self, kinds: Iterable[tuple[str, str]], selector: str, namespace: str | None = None
    ) -> list[Object]:
        """Every object of ``kinds`` (apiVersion, kind) matching ``selector``, in any namespace
        unless ``namespace`` is given; kinds the server does not serve are skipped."""
        found: list[Object] = []
        for api_version, kind in dict.fromkeys(kinds):
            if not self.mapper.served(api_version, kind):
                continue
            resource = self.mapper.resource(api_version, kind)
            items, _ = objects.list_objects(
                self.kube,
                resource,
                namespace if resource.namespaced else None,
                label_selector=selector,
            )
            found += items
        return found

    def events(self, obj: Mapping[str, Any], limit: int = 3) -> list[str]:
        """The newest events about ``obj`` as ``Reason: message`` lines, newest first."""
        meta = obj.get("metadata") or {}
        selector = f"involvedObject.name={meta.get('name')},involvedObject.kind={obj.get('kind')}"
        namespace = meta.get("namespace") or "default"
        try:
            items, _ = objects.list_objects(self.kube, EVENTS, namespace, field_selector=selector)
        except KubeError:
            return []
        items.sort(key=_event_time, reverse=True)
        return [
            f"{e.get('reason', '')}: {' '.join(str(e.get('message', '')).split())}"
            for e in items[:limit]
        ]

    def pod_problems(self, workload: Mapping[str, Any]) -> list[str]:
        """Why the workload's pods are not ready (``pod_problem`` of each, the ready left out)."""
        return [p for p in map(pod_problem, self.pods(workload)) if p]

    def pods(self, workload: Mapping[str, Any]) -> list[Pod]:
        """The pods a Deployment, DaemonSet or StatefulSet selects (by its matchLabels)."""
        spec = workload.get("spec") or {}
        labels = ((spec.get("selector") or {}).get("matchLabels")) or {}
        if not labels:
            return []
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        namespace = (workload.get("metadata") or {}).get("namespace")
        items, _ = objects.list_objects(self.kube, PODS, namespace, label_selector=selector)
        return items


def _event_time(event: Mapping[str, Any]) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


def pod_problem(pod: Mapping[str, Any]) -> str | None:
    """Why a pod is not ready, from its own status: the first container waiting or terminated
    with a reason, an unschedulable condition, or its phase; None when it is ready."""
    status = pod.get("status") or {}
    name = (pod.get("metadata") or {}).get("name", "?")
    for condition in status.get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"pod {name} unschedulable: {condition.get('message', '')}"
    statuses: Sequence[Mapping[str, Any]] = [
        *(status.get("initContainerStatuses") or ()),
        *(status.get("containerStatuses") or ()),
    ]
    for container in statuses:
        state = container.get("state") or {}
        for phase in ("waiting", "terminated"):
            detail = state.get(phase)
            if detail and detail.get("reason") not in (None, "Completed", "PodInitializing"):
                message = " ".join(str(detail.get("message", "")).split())[:200]
                return (
                    f"pod {name} container {container.get('name')} {phase}: "
                    f"{detail.get('reason')}" + (f": {message}" if message else "")
                )
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    if ready:
        return None
    return f"pod {name} {status.get('phase', 'Pending')}, not ready"
