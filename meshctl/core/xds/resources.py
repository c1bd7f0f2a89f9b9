"""The store as Istio's workload discovery names it, and what each proxy may see of it.

Owns: the two type URLs ztunnel subscribes to, resource names (a workload's uid, a service's
``namespace/hostname``; aliases ``network/IP`` for workload and service addresses), the catalogs
``delta.DeltaStream`` reads (every workload and service for everyone: a proxy may dial anything;
policies scoped to the workloads a proxy serves), and which names a batch of store updates may
have changed. Invariant: pure; reads ``Store`` snapshots only.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from meshctl.core.mesh.records import Kind, Policy, Record, Scope, Service, Workload
from meshctl.core.mesh.store import Store, Update
from meshctl.core.xds.delta import Plain

ADDRESS_TYPE = "type.googleapis.com/istio.workload.Address"
AUTHORIZATION_TYPE = "type.googleapis.com/istio.security.Authorization"
TYPES = (ADDRESS_TYPE, AUTHORIZATION_TYPE)  # ztunnel's registration (and request) order


def address_alias(network: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """ztunnel's on-demand key for an address: ``network/IP`` (``/10.0.0.1`` without network)."""
    return f"{network}/{ip}"


def _alias_ip(name: str) -> tuple[str, ipaddress.IPv4Address | ipaddress.IPv6Address] | None:
    network, slash, literal = name.rpartition("/")
    if not slash:
        return None
    try:
        return network, ipaddress.ip_address(literal)
    except ValueError:
        return None


class AddressCatalog:
    """Workloads and services (type Address) of a store snapshot: all of them, for everyone.

    On demand (ztunnel's ``XDS_ON_DEMAND``), with the stream's ``scope``: the workloads on the
    proxy's node come unasked (a node proxy's node; a sidecar's: its own pod's), as istiod's
    ``AdditionalPodSubscriptions`` sends them, and a service asked for brings its workloads.
    """

    def __init__(self, store: Store, scope: ProxyScope | None = None) -> None:
        self.store = store
        self._scope = scope
        self._nodes: frozenset[str] | None = None

    def _local_nodes(self) -> frozenset[str]:
        if self._nodes is None:
            scope = self._scope
            nodes = {scope.node} if scope is not None and scope.node else set()
            for uid in scope.workloads if scope is not None else ():
                w = self.store.workload_by_uid(uid)
                if w is not None and w.node:
                    nodes.add(w.node)
            self._nodes = frozenset(nodes)
        return self._nodes

    def implied(self) -> Iterator[str]:
        for node in sorted(self._local_nodes()):
            for w in self.store.workloads_on(node):
                yield w.uid
        if self._scope is not None:
            yield from sorted(self._scope.workloads)

    def implies(self, key: str, subscribed: AbstractSet[str]) -> bool:
        w = self.store.workload_by_uid(key)
        if w is None:
            return False
        local = self._scope is not None and w.uid in self._scope.workloads
        if local or w.node in self._local_nodes():
            return True
        return any(service in subscribed for service in w.services)

    def companions(self, key: str) -> tuple[str, ...]:
        return self.store.members(key)

    def resolve(self, name: str) -> tuple[str, str] | None:
        for kind in (Kind.WORKLOAD, Kind.SERVICE):
            version = self.store.version(kind, name)
            if version is not None:
                return name, version
        alias = _alias_ip(name)
        if alias is None:
            return None
        workload = self.store.workload_by_ip(alias[1], alias[0])
        if workload is not None:
            return workload.uid, self.store.version(Kind.WORKLOAD, workload.uid) or ""
        service = self.store.service_by_vip(alias[1], alias[0])
        if service is not None:
            return service.key, self.store.version(Kind.SERVICE, service.key) or ""
        return None

    def view(self) -> Iterator[str]:
        for w in self.store.workloads:
            yield w.uid
        for s in self.store.services:
            yield s.key

    def in_view(self, key: str) -> bool:
        return (
            self.store.workload_by_uid(key) is not None
            or self.store.service_by_key(key) is not None
        )

    def record(self, key: str) -> Workload | Service | None:
        return self.store.workload_by_uid(key) or self.store.service_by_key(key)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyScope:
    """Whose inbound traffic a proxy guards: every workload on ``node`` (a node proxy), or the
    ``workloads`` named by uid (a sidecar), or ``everything`` (a debugging client)."""

    node: str = ""
    workloads: frozenset[str] = frozenset()
    everything: bool = False

    def covers(self, w: Workload) -> bool:
        return (
            self.everything or w.uid in self.workloads or (bool(self.node) and w.node == self.node)
        )


def scoped_workloads(store: Store, scope: ProxyScope) -> list[Workload]:
    if scope.everything:
        return list(store.workloads)
    found = {w.uid: w for w in store.workloads_on(scope.node)} if scope.node else {}
    for uid in scope.workloads:
        w = store.workload_by_uid(uid)
        if w is not None:
            found[uid] = w
    return list(found.values())


def policy_view(store: Store, scope: ProxyScope) -> frozenset[str]:
    """The policies a proxy needs: global ones, its workloads' namespaces', and those its
    workloads name (``authorization_policies``)."""
    if scope.everything:
        return frozenset(p.key for p in store.policies)
    workloads = scoped_workloads(store, scope)
    namespaces = {w.namespace for w in workloads}
    names = {
        p.key
        for p in store.policies
        if p.scope is Scope.GLOBAL or (p.scope is Scope.NAMESPACE and p.namespace in namespaces)
    }
    for w in workloads:
        names.update(ref for ref in w.authorization_policies if store.policy_by_key(ref))
    return frozenset(names)


class PolicyCatalog(Plain):
    """Policies (type Authorization) a stream may see: its scope's view."""

    def __init__(self, store: Store, view: frozenset[str]) -> None:
        self.store = store
        self._view = view

    def resolve(self, name: str) -> tuple[str, str] | None:
        version = self.store.version(Kind.POLICY, name)
        return None if version is None else (name, version)

    def view(self) -> Iterable[str]:
        return self._view

    def in_view(self, key: str) -> bool:
        return key in self._view

    def record(self, key: str) -> Policy | None:
        return self.store.policy_by_key(key)


def changed_names(old: Store, new: Store, updates: Iterable[Update]) -> dict[str, set[str]]:
    """type URL -> resource names and aliases whose answer may differ between the snapshots."""
    address: set[str] = set()
    policies: set[str] = set()
    for u in updates:
        if u.kind is Kind.POLICY:
            policies.add(u.key)
            continue
        address.add(u.key)
        for record in (old.get(u.kind, u.key), new.get(u.kind, u.key)):
            address.update(_aliases(record))
    return {ADDRESS_TYPE: address, AUTHORIZATION_TYPE: policies}


def _aliases(record: Record | None) -> Iterator[str]:
    if isinstance(record, Workload) and record.extra.get("networkMode") != "HostNetwork":
        for ip in record.workload_ips:
            yield address_alias(record.network, ip)
    elif isinstance(record, Service):
        for network, ip in record.vips:
            yield address_alias(network, ip)


def touches(scope: ProxyScope, old: Store, new: Store, updates: Iterable[Update]) -> bool:
    """Whether ``updates`` may change ``scope``'s policy view (a policy, or a workload of it)."""
    for u in updates:
        if u.kind is Kind.POLICY:
            return True
        if u.kind is Kind.WORKLOAD:
            for record in (old.get(u.kind, u.key), new.get(u.kind, u.key)):
                if isinstance(record, Workload) and scope.covers(record):
                    return True
    return False
