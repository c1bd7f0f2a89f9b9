"""A cluster's mesh-relevant objects, and the store updates each change of one of them causes.

Owns the facts of every Pod, Namespace, Service, EndpointSlice and AuthorizationPolicy the
control plane watches (slim facts, never whole objects) and the dependencies between them: a
pod's workload depends on its namespace's labels, the Services that select it (or whose
EndpointSlices name it) and the selector policies that pick it. Each change returns exactly the
``Update``s whose records changed: a pod change touches only that pod's workload; a Service change
the Service and the workloads in its namespace whose port lists changed. Invariants: pure and
level-triggered (setting an object to what it already is returns nothing; ``replace`` of a full
list, as after a relist, returns the difference); a malformed object raises
``objects.ObjectError`` and leaves the index as it was.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from meshctl.core.mesh.records import Kind, Policy, Service, Workload
from meshctl.core.mesh.store import Update

from . import objects
from .pods import PodFacts, build_workload, read_pod, workload_uid
from .policies import PolicyFacts, read_policy
from .services import (
    ServiceFacts,
    SliceFacts,
    build_service,
    ports_for_pod,
    read_endpoint_slice,
    read_service,
    selects,
    store_key,
)
from .settings import ClusterSettings

Key = tuple[str, str]  # (namespace, name); a Namespace is ("", name)


class Resource(StrEnum):
    """The watched kinds, named as their API resources."""

    POD = "pods"
    NAMESPACE = "namespaces"
    SERVICE = "services"
    ENDPOINT_SLICE = "endpointslices"
    AUTHORIZATION_POLICY = "authorizationpolicies"


class ClusterIndex:
    """Objects in, store updates out."""

    def __init__(self, settings: ClusterSettings) -> None:
        self.settings = settings
        self._pods: dict[Key, PodFacts] = {}
        self._pods_by_ns: dict[str, set[str]] = {}
        self._ns_labels: dict[str, dict[str, str]] = {}
        self._services: dict[Key, ServiceFacts] = {}
        # Services by how a pod finds them: those with a selector under one of its pairs (every
        # service selecting a pod has all its pairs among the pod's labels, so the pod's own
        # pairs find each candidate: a pod's build costs its labels, not the namespace's
        # services), those without under their namespace (their slices name the pods).
        self._by_selector_pair: dict[str, dict[tuple[str, str], set[str]]] = {}
        self._selectorless: dict[str, set[str]] = {}
        self._slices: dict[Key, SliceFacts] = {}
        self._slices_by_service: dict[Key, set[str]] = {}
        self._policies: dict[Key, PolicyFacts] = {}
        self._selector_policies: dict[str, set[str]] = {}  # namespace -> names with a selector
        # What was last handed out, to hand out only real changes.
        self._workloads: dict[Key, Workload] = {}
        self._emitted_services: dict[Key, Service] = {}
        self._emitted_policies: dict[Key, Policy] = {}

    # -- changes ---------------------------------------------------------------------------------

    def upsert(self, resource: Resource, obj: Mapping[str, object]) -> list[Update]:
        """The object was added or modified (a watch ADDED/MODIFIED event, or a list item)."""
        if resource is Resource.NAMESPACE:
            name = objects.text(obj, "metadata", "name")
            if not name:
                raise objects.ObjectError("Namespace without metadata.name")
            labels = objects.string_map(obj, "metadata", "labels")
            if self._ns_labels.get(name) == labels:
                return []
            self._ns_labels[name] = labels
            return self._refresh_pods(self._pods_by_ns.get(name, set()), name)
        if resource is Resource.POD:
            pod = read_pod(obj)
            self._pods[pod.key] = pod
            self._pods_by_ns.setdefault(pod.namespace, set()).add(pod.name)
            return self._refresh_pods({pod.name}, pod.namespace)
        if resource is Resource.SERVICE:
            svc = read_service(obj)
            return self._set_service(svc.key, svc)
        if resource is Resource.ENDPOINT_SLICE:
            found = read_endpoint_slice(obj)
            return self._set_slice(found.key, found)
        policy = read_policy(obj, root_namespace=self.settings.root_namespace)
        return self._set_policy((policy.namespace, policy.name), policy)

    def delete(self, resource: Resource, namespace: str, name: str) -> list[Update]:
        """The object is gone (a watch DELETED event). Unknown objects are no change."""
        key = (namespace, name)
        if resource in (Resource.NAMESPACE, Resource.POD):
            ns = name if resource is Resource.NAMESPACE else namespace
            if resource is Resource.NAMESPACE and self._ns_labels.pop(name, None) is not None:
                return self._refresh_pods(self._pods_by_ns.get(name, set()), ns)
            if resource is Resource.POD and self._pods.pop(key, None) is not None:
                self._pods_by_ns.get(namespace, set()).discard(name)
                return self._refresh_pods({name}, ns)
            return []
        if resource is Resource.SERVICE:
            return self._set_service(key, None)
        if resource is Resource.ENDPOINT_SLICE:
            return self._set_slice(key, None)
        return self._set_policy(key, None)

    def replace(
        self, resource: Resource, items: Iterable[Mapping[str, object]]
    ) -> tuple[list[Update], list[str]]:
        """A full list (after a relist): removes what it lacks, sets what it has.

        Returns the updates and one problem line per malformed item (skipped).
        """
        updates: list[Update] = []
        problems: list[str] = []
        seen: set[Key] = set()
        for obj in items:
            try:
                updates += self.upsert(resource, obj)
            except objects.ObjectError as exc:
                problems.append(str(exc))
            namespace = objects.field(obj, "metadata", "namespace")
            name = objects.field(obj, "metadata", "name")
            if isinstance(name, str):
                seen.add(("" if resource is Resource.NAMESPACE else str(namespace or ""), name))
        for key in self.keys(resource) - seen:
            updates += self.delete(resource, *key)
        return updates, problems

    def keys(self, resource: Resource) -> set[Key]:
        if resource is Resource.NAMESPACE:
            return {("", n) for n in self._ns_labels}
        tables: dict[Resource, Mapping[Key, object]] = {
            Resource.POD: self._pods,
            Resource.SERVICE: self._services,
            Resource.ENDPOINT_SLICE: self._slices,
            Resource.AUTHORIZATION_POLICY: self._policies,
        }
        return set(tables[resource])

    def warnings(self) -> dict[str, tuple[str, ...]]:
        """Policies converted with a loss, by namespace/name (for logs and status)."""
        return {f"{ns}/{n}": p.warnings for (ns, n), p in self._policies.items() if p.warnings}

    # -- services, slices, policies ------------------------------------------------------------

    def _set_service(self, key: Key, svc: ServiceFacts | None) -> list[Update]:
        namespace, name = key
        old = self._services.get(key)
        if old == svc:
            return []
        if old is not None:
            self._index_service(old, add=False)
            del self._services[key]
        if svc is not None:
            self._services[key] = svc
            self._index_service(svc, add=True)
        record = build_service(svc, self.settings) if svc is not None else None
        skey = store_key(self.settings, namespace, name)
        updates = _emit(self._emitted_services, key, Kind.SERVICE, skey, record)
        return updates + self._refresh_pods(self._pods_by_ns.get(namespace, set()), namespace)

    def _index_service(self, svc: ServiceFacts, *, add: bool) -> None:
        if svc.external_name:
            return  # selects no pod
        if svc.selector:
            pairs = self._by_selector_pair.setdefault(svc.namespace, {})
            names = pairs.setdefault(min(svc.selector.items()), set())
        else:
            names = self._selectorless.setdefault(svc.namespace, set())
        if add:
            names.add(svc.name)
        else:
            names.discard(svc.name)

    def _set_slice(self, key: Key, new: SliceFacts | None) -> list[Update]:
        old = self._slices.get(key)
        if old == new:
            return []
        for facts in (old, new):
            if facts is not None:
                self._slices_by_service.setdefault((facts.namespace, facts.service), set())
        if old is not None:
            self._slices_by_service[(old.namespace, old.service)].discard(old.name)
            del self._slices[key]
        if new is not None:
            self._slices[key] = new
            self._slices_by_service[(new.namespace, new.service)].add(new.name)
        names = (old.pods if old else frozenset()) | (new.pods if new else frozenset())
        return self._refresh_pods(set(names), key[0])

    def _set_policy(self, key: Key, facts: PolicyFacts | None) -> list[Update]:
        namespace, name = key
        old = self._policies.get(key)
        if old == facts:
            return []
        if facts is None:
            del self._policies[key]
        else:
            self._policies[key] = facts
        selected = self._selector_policies.setdefault(namespace, set())
        if facts is not None and facts.selector is not None and facts.policy is not None:
            selected.add(name)
        else:
            selected.discard(name)
        record = facts.policy if facts is not None else None
        updates = _emit(self._emitted_policies, key, Kind.POLICY, f"{namespace}/{name}", record)
        touched_selector = any(f is not None and f.selector is not None for f in (old, facts))
        if touched_selector:
            if namespace == self.settings.root_namespace:
                for ns, pods in self._pods_by_ns.items():
                    updates += self._refresh_pods(pods, ns)
            else:
                updates += self._refresh_pods(self._pods_by_ns.get(namespace, set()), namespace)
        return updates

    # -- workloads -------------------------------------------------------------------------------

    def _refresh_pods(self, names: Iterable[str], namespace: str) -> list[Update]:
        updates: list[Update] = []
        for name in sorted(names):
            key = (namespace, name)
            new = self._build(self._pods[key]) if key in self._pods else None
            uid = workload_uid(self.settings, namespace, name)
            updates += _emit(self._workloads, key, Kind.WORKLOAD, uid, new)
        return updates

    def _build(self, pod: PodFacts) -> Workload | None:
        ns = pod.namespace
        services: dict[str, dict[int, int]] = {}
        pairs = self._by_selector_pair.get(ns, {})
        candidates = set().union(*(pairs.get(pair, ()) for pair in pod.labels.items()))
        for svc_name in candidates:
            svc = self._services[(ns, svc_name)]
            if selects(svc, pod):
                services[store_key(self.settings, ns, svc_name)] = ports_for_pod(svc, pod)
        for svc_name in self._selectorless.get(ns, ()):
            svc = self._services[(ns, svc_name)]
            for slice_name in self._slices_by_service.get((ns, svc_name), ()):
                found = self._slices[(ns, slice_name)]
                if pod.name in found.pods:
                    key = store_key(self.settings, ns, svc_name)
                    services[key] = ports_for_pod(svc, pod, found.ports)
                    break
        return build_workload(
            pod,
            settings=self.settings,
            namespace_labels=self._ns_labels.get(ns, {}),
            services=services,
            policies=self._policies_selecting(pod),
        )

    def _policies_selecting(self, pod: PodFacts) -> tuple[str, ...]:
        """Selector policies of the pod's namespace (and the root's, mesh-wide) that pick it."""
        found = []
        root = self.settings.root_namespace
        for ns in dict.fromkeys((pod.namespace, root)):
            for name in self._selector_policies.get(ns, ()):
                facts = self._policies[(ns, name)]
                if facts.selector is not None and objects.selects(facts.selector, pod.labels):
                    found.append(f"{ns}/{name}")
        return tuple(sorted(found))


def _emit(table: dict[Key, Any], key: Key, kind: Kind, name: str, record: Any) -> list[Update]:
    """The update for ``record`` (None: gone) unless ``table`` says it was handed out already."""
    if record == table.get(key):
        return []
    if record is None:
        table.pop(key, None)
    else:
        table[key] = record
    return [Update(kind=kind, key=name, record=record)]
