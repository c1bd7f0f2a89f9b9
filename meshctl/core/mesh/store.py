"""The workload/service/policy store: an immutable snapshot with the data path's lookups.

Owns ``Store`` (workload by IP, service by VIP, a destination for an original destination), the
``Update``s sources feed it by key, and ``LiveStore``: the current snapshot as its source owns
it. Sources (the local config file, Kubernetes watches in the control plane, the xDS client in
the proxies) feed it; consumers read snapshots and hear of changes, never apply any.
Invariants: a ``Store`` never changes (``apply`` builds a new one, so a lookup in flight sees one
consistent snapshot); every record has a version; the store never fetches anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshctl.core.mesh.addresses import ip as parse_ip
from meshctl.core.mesh.records import (
    HBONE_PORT,
    IPAddress,
    Kind,
    LocalConfigError,
    Policy,
    Protocol,
    Record,
    Scope,
    Service,
    Workload,
    content_version,
    record_key,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Destination:
    """Where an outbound connection goes, decided from its original destination.

    ``kind``: ``hbone`` (tunnel to ``hbone_addr``), ``tcp`` (plain connect to ``addr``: a known
    workload without the mesh) or ``passthrough`` (unknown destination, plain connect).
    """

    kind: str
    addr: tuple[str, int]
    workload: Workload | None = None
    service: Service | None = None

    @property
    def hbone_addr(self) -> tuple[str, int]:
        return (self.addr[0], HBONE_PORT)


class NoHealthyEndpointError(LookupError):
    """A service VIP matched but has no healthy endpoint serving the port."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Update:
    """One change for ``Store.apply``: set ``key`` of ``kind`` to ``record``, or remove it (None).

    ``version`` is the source's version of the record (the xDS resource version); empty means
    "derive it from the content" (``content_version``).
    """

    kind: Kind
    key: str
    record: Record | None = None
    version: str = ""


def _host_network(w: Workload) -> bool:
    # A host-network pod shares its node's IP with every other such pod: never look it up by IP
    # (ztunnel's NetworkMode HOST_NETWORK).
    return w.extra.get("networkMode") == "HostNetwork"


@dataclass(frozen=True, slots=True)
class Store:
    """An immutable snapshot of workloads, services and policies with lookup indexes.

    Built only by ``apply`` (or ``build``, which applies everything at once): each call returns a
    new snapshot and leaves this one as it was, so a reader keeps a consistent view for as long as
    it holds it. ``generation`` counts applied batches. Indexes tolerate what a live source may
    briefly show (two workloads with one IP while a pod is replaced): the last applied wins a
    lookup, and the other takes over when it goes.
    """

    _workloads: Mapping[str, Workload] = field(default_factory=dict)
    _services: Mapping[str, Service] = field(default_factory=dict)
    _policies: Mapping[str, Policy] = field(default_factory=dict)
    _versions: Mapping[tuple[Kind, str], str] = field(default_factory=dict, repr=False)
    _by_ip: Mapping[tuple[str, IPAddress], tuple[str, ...]] = field(
        default_factory=dict, repr=False
    )
    _by_vip: Mapping[tuple[str, IPAddress], tuple[str, ...]] = field(
        default_factory=dict, repr=False
    )
    # service key -> uids of the workloads that list it in their ``services``, in apply order.
    _endpoints: Mapping[str, tuple[str, ...]] = field(default_factory=dict, repr=False)
    _by_node: Mapping[str, tuple[str, ...]] = field(default_factory=dict, repr=False)
    generation: int = 0

    @classmethod
    def build(
        cls,
        workloads: Iterable[Workload] = (),
        services: Iterable[Service] = (),
        policies: Iterable[Policy] = (),
    ) -> Store:
        """A store of exactly these records (local config: duplicates are errors here)."""
        updates: list[Update] = []
        seen_uid: set[str] = set()
        seen_ip: set[tuple[str, IPAddress]] = set()
        for w in workloads:
            if w.uid in seen_uid:
                raise LocalConfigError("workloads", f"duplicate uid {w.uid!r}")
            seen_uid.add(w.uid)
            for ip in () if _host_network(w) else w.workload_ips:
                if (w.network, ip) in seen_ip:
                    raise LocalConfigError("workloads", f"IP {ip} belongs to two workloads")
                seen_ip.add((w.network, ip))
            updates.append(Update(kind=Kind.WORKLOAD, key=w.uid, record=w))
        updates += [Update(kind=Kind.SERVICE, key=s.key, record=s) for s in services]
        updates += [Update(kind=Kind.POLICY, key=p.key, record=p) for p in policies]
        return cls().apply(updates)

    def apply(self, updates: Iterable[Update]) -> Store:
        """A new snapshot with ``updates`` applied in order (a later one for a key wins)."""
        draft = _Draft(self)
        for u in updates:
            if u.record is not None and record_key(u.record) != u.key:
                raise ValueError(f"{u.kind} update for {u.key!r} carries {record_key(u.record)!r}")
            if u.kind is Kind.WORKLOAD:
                draft.workload(u.key, u.record)
            elif u.kind is Kind.SERVICE:
                draft.service(u.key, u.record)
            else:
                draft.policies.pop(u.key, None)
                if isinstance(u.record, Policy):
                    draft.policies[u.key] = u.record
            if u.record is None:
                draft.versions.pop((u.kind, u.key), None)
            else:
                draft.versions[(u.kind, u.key)] = u.version or content_version(u.record)
        return Store(
            draft.workloads,
            draft.services,
            draft.policies,
            draft.versions,
            draft.by_ip,
            draft.by_vip,
            draft.endpoints,
            draft.by_node,
            self.generation + 1,
        )

    # -- reading ---------------------------------------------------------------------------------

    @property
    def workloads(self) -> tuple[Workload, ...]:
        return tuple(self._workloads.values())

    @property
    def services(self) -> tuple[Service, ...]:
        return tuple(self._services.values())

    @property
    def policies(self) -> tuple[Policy, ...]:
        return tuple(self._policies.values())

    def get(self, kind: Kind, key: str) -> Record | None:
        table: Mapping[str, Record]
        if kind is Kind.WORKLOAD:
            table = self._workloads
        elif kind is Kind.SERVICE:
            table = self._services
        else:
            table = self._policies
        return table.get(key)

    def version(self, kind: Kind, key: str) -> str | None:
        """The version of the record under ``key``, or None when there is none."""
        return self._versions.get((kind, key))

    def versions(self) -> Mapping[tuple[Kind, str], str]:
        """Every record's version, by (kind, key): what a discovery server compares."""
        return self._versions

    def workload_by_ip(self, ip: str | IPAddress, network: str = "") -> Workload | None:
        uids = self._by_ip.get((network, parse_ip(ip)))
        return self._workloads[uids[-1]] if uids else None

    def workload_by_uid(self, uid: str) -> Workload | None:
        return self._workloads.get(uid)

    def service_by_key(self, key: str) -> Service | None:
        return self._services.get(key)

    def policy_by_key(self, key: str) -> Policy | None:
        return self._policies.get(key)

    def workloads_on(self, node: str) -> tuple[Workload, ...]:
        """The workloads whose ``node`` is ``node``."""
        return tuple(self._workloads[uid] for uid in self._by_node.get(node, ()))

    def find_workload(self, namespace: str, name: str) -> Workload | None:
        """The workload called ``namespace/name`` (dedicated mode's ``--workload``)."""
        for w in self._workloads.values():
            if w.namespace == namespace and w.name == name:
                return w
        return None

    def service_by_vip(self, ip: str | IPAddress, network: str = "") -> Service | None:
        keys = self._by_vip.get((network, parse_ip(ip)))
        return self._services[keys[-1]] if keys else None

    def members(self, key: str) -> tuple[str, ...]:
        """The uids of the workloads that name the service ``key`` (healthy or not)."""
        return tuple(self._endpoints.get(key, ()))

    def endpoints(self, service: Service, port: int) -> list[tuple[Workload, int]]:
        """Healthy workloads behind ``service`` with the target port each serves ``port`` on."""
        found = []
        for uid in self._endpoints.get(service.key, ()):
            w = self._workloads[uid]
            ports = w.services[service.key]
            if not w.healthy or not w.workload_ips:
                continue
            target = ports.get(port, service.ports.get(port))
            if target is not None:
                found.append((w, target or port))  # targetPort 0 means "same as port"
        return found

    def resolve(
        self,
        ip: str | IPAddress,
        port: int,
        *,
        network: str = "",
        pick: Callable[[Sequence[tuple[Workload, int]]], tuple[Workload, int]] = lambda c: c[0],
    ) -> Destination:
        """Route an original destination: service VIP -> endpoint, workload IP, or passthrough.

        ``pick`` chooses among healthy endpoints (the I/O shell passes a random choice; the
        default keeps tests deterministic). Raises ``NoHealthyEndpointError`` for a VIP with none.
        """
        addr = parse_ip(ip)
        service = self.service_by_vip(addr, network)
        if service is not None:
            if port not in service.ports:
                raise NoHealthyEndpointError(f"service {service.key} has no port {port}")
            candidates = self.endpoints(service, port)
            if not candidates:
                raise NoHealthyEndpointError(f"service {service.key} has no healthy endpoint")
            workload, target = pick(candidates)
            ip_of = _same_family(workload.workload_ips, addr)
            return Destination(
                kind="hbone" if workload.protocol is Protocol.HBONE else "tcp",
                addr=(str(ip_of), target),
                workload=workload,
                service=service,
            )
        direct = self.workload_by_ip(addr, network)
        if direct is None:
            return Destination(kind="passthrough", addr=(str(addr), port))
        kind = "hbone" if direct.protocol is Protocol.HBONE else "tcp"
        return Destination(kind=kind, addr=(str(addr), port), workload=direct)

    def policies_for(self, workload: Workload) -> list[Policy]:
        """Policies for ``workload``: its namespace's, the global ones, and the ones it names."""
        chosen: dict[str, Policy] = {}
        for p in self._policies.values():
            if p.scope is Scope.GLOBAL or (
                p.scope is Scope.NAMESPACE and p.namespace == workload.namespace
            ):
                chosen[p.key] = p
        for ref in workload.authorization_policies:
            if ref in self._policies:
                chosen[ref] = self._policies[ref]
        return list(chosen.values())


Listener = Callable[[Store, Store, Sequence[Update]], None]


class LiveStore:
    """The current snapshot, owned by the source that ``apply``s to it; consumers read
    ``current`` and ``subscribe`` to hear (old, new, updates) after each change, in order."""

    def __init__(self, store: Store | None = None) -> None:
        self._current = store or Store()
        self._listeners: list[Listener] = []

    @property
    def current(self) -> Store:
        return self._current

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def apply(self, updates: Sequence[Update]) -> Store:
        """The source's changes: a new snapshot (the same one when there are none)."""
        if not updates:
            return self._current
        old = self._current
        self._current = new = old.apply(updates)
        for listener in self._listeners:
            listener(old, new, updates)
        return new


class SourcedStore:
    """One store fed by several sources (ztunnel's one state behind its local config and xDS).

    Each source's records are kept apart from the others', so a source removing a key leaves
    another source's record for that key in force; where more than one source holds a key, the
    one named first in ``sources`` wins. ``live`` is the merged store its consumers read and
    subscribe to; they hear only the changes that reach it.
    """

    def __init__(self, sources: Sequence[str]) -> None:
        if not sources or len(set(sources)) != len(sources):
            raise ValueError(f"sources must be distinct names, got {list(sources)!r}")
        self._layers: dict[str, Store] = dict.fromkeys(sources, Store())
        self.live = LiveStore()

    @property
    def current(self) -> Store:
        return self.live.current

    def layer(self, source: str) -> Store:
        """The records ``source`` holds, whether or not another source's win in ``current``."""
        return self._layers[source]

    def apply(self, source: str, updates: Sequence[Update]) -> list[Update]:
        """``source``'s changes; the updates they made to ``current``, in the source's order
        (one per key: its last), each passed on as it came unless another source wins its key."""
        self._layers[source] = self._layers[source].apply(updates)
        keys = dict.fromkeys(reversed([(u.kind, u.key) for u in updates]))
        return self._merge(source, reversed(keys), passed=True)

    def replace(self, source: str, store: Store) -> list[Update]:
        """``source`` now holds exactly ``store``'s records (a source that sends whole
        documents, such as the local config file); the updates this made to ``current``."""
        old = self._layers[source]
        self._layers[source] = store
        keys = dict.fromkeys([*store.versions(), *old.versions()])
        return self._merge(source, keys, passed=False)

    def _merge(
        self, source: str, keys: Iterable[tuple[Kind, str]], *, passed: bool
    ) -> list[Update]:
        """The updates that bring ``current`` to the winners' records for ``keys``; ``passed``:
        a key ``source`` wins (or nobody holds) is updated even when its record did not change
        (a source's update reaches consumers as it came)."""
        current = self.live.current
        merged: list[Update] = []
        for kind, key in keys:
            winner = next((n for n, s in self._layers.items() if s.version(kind, key)), None)
            layer = self._layers.get(winner or source, Store())
            record, version = layer.get(kind, key), layer.version(kind, key) or ""
            unchanged = record == current.get(kind, key) and (
                record is None or version == current.version(kind, key)
            )
            if unchanged and not (passed and winner in (source, None)):
                continue
            merged.append(Update(kind=kind, key=key, record=record, version=version))
        self.live.apply(merged)
        return merged


class _Draft:
    """Copies of a store's tables that one ``apply`` edits before freezing them in a new Store."""

    def __init__(self, base: Store) -> None:
        self.workloads = dict(base._workloads)
        self.services = dict(base._services)
        self.policies = dict(base._policies)
        self.versions = dict(base._versions)
        self.by_ip = dict(base._by_ip)
        self.by_vip = dict(base._by_vip)
        self.endpoints = dict(base._endpoints)
        self.by_node = dict(base._by_node)

    def workload(self, uid: str, record: Record | None) -> None:
        old = self.workloads.pop(uid, None)
        if old is not None:
            if not _host_network(old):
                for ip in old.workload_ips:
                    _drop(self.by_ip, (old.network, ip), uid)
            for key in old.services:
                _drop(self.endpoints, key, uid)
            _drop(self.by_node, old.node, uid)
        if isinstance(record, Workload):
            self.workloads[uid] = record
            self.by_node[record.node] = (*self.by_node.get(record.node, ()), uid)
            if not _host_network(record):
                for ip in record.workload_ips:
                    at = (record.network, ip)
                    self.by_ip[at] = (*self.by_ip.get(at, ()), uid)
            for key in record.services:
                self.endpoints[key] = (*self.endpoints.get(key, ()), uid)

    def service(self, key: str, record: Record | None) -> None:
        old = self.services.pop(key, None)
        if old is not None:
            for vip in old.vips:
                _drop(self.by_vip, vip, key)
        if isinstance(record, Service):
            self.services[key] = record
            for vip in record.vips:
                self.by_vip[vip] = (*self.by_vip.get(vip, ()), key)


def _drop(index: dict[Any, tuple[str, ...]], at: Any, key: str) -> None:
    left = tuple(k for k in index.get(at, ()) if k != key)
    if left:
        index[at] = left
    else:
        index.pop(at, None)


def _same_family(ips: Sequence[IPAddress], like: IPAddress) -> IPAddress:
    for ip in ips:
        if ip.version == like.version:
            return ip
    return ips[0]
