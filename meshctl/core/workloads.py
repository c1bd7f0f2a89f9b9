"""The workload/service/policy store: records, lookups, and updates from any source.

Owns the records every consumer reads (workloads, services, policies), the lookups the data plane
makes (workload by IP, service by VIP, a destination for an original destination) and the reader
of Istio ztunnel's local-config document. Sources (the local config, Kubernetes watches in the
control plane, the xDS client in the proxies) feed it ``Update``s by key; consumers read snapshots.
Invariants: a ``Store`` never changes (``apply`` builds a new one, so a lookup in flight sees one
consistent snapshot); every record has a version; the store never fetches anything; a local-config
field that is unknown or mistyped is refused with its path (``workloads[1].workloadIps[0]``); a
field ztunnel's own reader requires is required here too, and one it defaults differently is named
by ``local_config_warnings``.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from meshctl.core.addresses import ip as parse_ip
from meshctl.core.identity import IdentityError, SpiffeId

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_TRUST_DOMAIN = "cluster.local"


class LocalConfigError(ValueError):
    """The local config document is invalid; ``path`` names the offending field."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


class Protocol(StrEnum):
    """How a workload receives mesh traffic: HBONE tunnels to :15008, or plain TCP."""

    HBONE = "HBONE"
    TCP = "TCP"


class Action(StrEnum):
    ALLOW = "Allow"
    DENY = "Deny"


class Scope(StrEnum):
    GLOBAL = "Global"
    NAMESPACE = "Namespace"
    WORKLOAD_SELECTOR = "WorkloadSelector"


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    uid: str
    name: str
    namespace: str
    service_account: str = "default"
    workload_ips: tuple[IPAddress, ...] = ()
    protocol: Protocol = Protocol.TCP
    network: str = ""
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    node: str = ""
    workload_name: str = ""
    workload_type: str = "deployment"
    canonical_name: str = ""
    canonical_revision: str = ""
    cluster_id: str = "Kubernetes"
    authorization_policies: tuple[str, ...] = ()
    healthy: bool = True
    # "<ns>/<hostname>" -> {service port: target port}: makes this workload an endpoint.
    services: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)  # accepted, kept for /config_dump

    @property
    def identity(self) -> SpiffeId:
        return SpiffeId(self.trust_domain, self.namespace, self.service_account)


@dataclass(frozen=True, slots=True, kw_only=True)
class Service:
    name: str
    namespace: str
    hostname: str
    vips: tuple[tuple[str, IPAddress], ...] = ()  # (network, ip)
    ports: Mapping[int, int] = field(default_factory=dict)  # service port -> target port
    subject_alt_names: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.hostname}"


@dataclass(frozen=True, slots=True, kw_only=True)
class StringMatch:
    """Istio's principal matcher: exact, prefix, suffix, or presence (any value)."""

    kind: str  # "exact" | "prefix" | "suffix" | "presence"
    value: str = ""

    def matches(self, text: str | None) -> bool:
        if text is None:
            return False
        if self.kind == "exact":
            return text == self.value
        if self.kind == "prefix":
            return text.startswith(self.value)
        if self.kind == "suffix":
            return text.endswith(self.value)
        return text != ""  # presence: any non-empty value


def glob_match(text: str) -> StringMatch:
    """Istio's policy string form: ``*`` (present), ``prefix*``, ``*suffix`` or exact."""
    if text == "*":
        return StringMatch(kind="presence")
    if text.startswith("*"):
        return StringMatch(kind="suffix", value=text[1:])
    if text.endswith("*"):
        return StringMatch(kind="prefix", value=text[:-1])
    return StringMatch(kind="exact", value=text)


@dataclass(frozen=True, slots=True, kw_only=True)
class RbacMatch:
    """One match: every non-empty field must hold (AND); within a field any positive (OR) and
    no negative."""

    namespaces: tuple[StringMatch, ...] = ()
    not_namespaces: tuple[StringMatch, ...] = ()
    service_accounts: tuple[tuple[str, str], ...] = ()  # (namespace, serviceAccount)
    not_service_accounts: tuple[tuple[str, str], ...] = ()
    principals: tuple[StringMatch, ...] = ()
    not_principals: tuple[StringMatch, ...] = ()
    source_ips: tuple[IPNetwork, ...] = ()
    not_source_ips: tuple[IPNetwork, ...] = ()
    destination_ips: tuple[IPNetwork, ...] = ()
    not_destination_ips: tuple[IPNetwork, ...] = ()
    destination_ports: tuple[int, ...] = ()
    not_destination_ports: tuple[int, ...] = ()

    @property
    def is_empty(self) -> bool:
        """No field set: ztunnel skips such a match (it never satisfies its clause)."""
        return self == _EMPTY_MATCH


_EMPTY_MATCH = RbacMatch()


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    name: str
    namespace: str
    scope: Scope
    action: Action
    # rules OR; a rule is clauses AND; a clause is matches OR (ztunnel's three nested lists).
    rules: tuple[tuple[tuple[RbacMatch, ...], ...], ...]
    dry_run: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


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


HBONE_PORT = 15008


class NoHealthyEndpointError(LookupError):
    """A service VIP matched but has no healthy endpoint serving the port."""


class Kind(StrEnum):
    """The three record kinds the store holds, each keyed by its own name."""

    WORKLOAD = "workload"  # key: uid
    SERVICE = "service"  # key: "<namespace>/<hostname>"
    POLICY = "policy"  # key: "<namespace>/<name>"


Record = Workload | Service | Policy


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


def record_key(record: Record) -> str:
    """The store key of a record (a workload's uid, a service's or policy's namespace/name)."""
    return record.uid if isinstance(record, Workload) else record.key


def content_version(record: Record) -> str:
    """A version that changes exactly when the record's content does (same on every replica:
    records are built deterministically, so equal content has an equal ``repr``)."""
    return hashlib.blake2b(repr(record).encode(), digest_size=8).hexdigest()


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


# ---------------------------------------------------------------------------------------------
# Parsing: one small reader per record kind; every problem carries its field path.


def parse_local_config(doc: Any) -> Store:
    """Build a ``Store`` from a parsed local-config document (a mapping, or None for empty)."""
    if doc is None:
        return Store.build()
    top = _Mapping(doc, "")
    workloads = [_workload(_Mapping(w, p)) for p, w in top.list_of("workloads")]
    services = [_service(_Mapping(s, p)) for p, s in top.list_of("services")]
    policies = [_policy(_Mapping(x, p)) for p, x in top.list_of("policies")]
    top.done()
    return Store.build(workloads, services, policies)


def parse_record(kind: Kind, doc: Any, path: str = "") -> Record:
    """One record in its local-config form (as ``records.render`` writes it)."""
    m = _Mapping(doc, path)
    if kind is Kind.WORKLOAD:
        return _workload(m)
    return _service(m) if kind is Kind.SERVICE else _policy(m)


# Fields ztunnel's local config accepts that this data plane records but does not act on yet
# (waypoints, gateways, locality...): accepted so a ztunnel config loads, shown in /config_dump.
_WORKLOAD_PASSIVE = (
    "networkMode", "hostname", "waypoint", "networkGateway", "nativeTunnel", "applicationTunnel",
    "locality", "capacity",
)  # fmt: skip
_SERVICE_PASSIVE = (
    "cidrVips", "endpoints", "waypoint", "loadBalancer", "ipFamilies", "canonical", "visibility",
)  # fmt: skip


def _workload(m: _Mapping) -> Workload:
    status = m.choice("status", ("Healthy", "Unhealthy"), "Healthy")
    # ztunnel's LocalWorkload has no default for these two (serde): it refuses the file.
    m.require("workloadIps", "write workloadIps: [] for a workload without addresses")
    m.require("services", "write services: {} for a workload that backs no service")
    services: dict[str, dict[int, int]] = {}
    for key, value, path in m.mapping_items("services"):
        if "/" not in key:
            raise LocalConfigError(path, "service key must be '<namespace>/<hostname>'")
        services[key] = _port_map(value, path)
    w = Workload(
        uid=m.text("uid", required=True),
        name=m.text("name", required=True),
        namespace=m.text("namespace", required=True),
        service_account=m.text("serviceAccount", "default"),
        workload_ips=tuple(_ip(v, p) for p, v in m.list_of("workloadIps")),
        protocol=Protocol(m.choice("protocol", ("HBONE", "TCP"), "TCP")),
        network=m.text("network", ""),
        trust_domain=m.text("trustDomain", DEFAULT_TRUST_DOMAIN),
        node=m.text("node", ""),
        workload_name=m.text("workloadName", ""),
        workload_type=m.text("workloadType", "deployment"),
        canonical_name=m.text("canonicalName", ""),
        canonical_revision=m.text("canonicalRevision", ""),
        cluster_id=m.text("clusterId", "Kubernetes"),
        authorization_policies=tuple(_str(v, p) for p, v in m.list_of("authorizationPolicies")),
        healthy=status == "Healthy",
        services=services,
        extra=m.passive(_WORKLOAD_PASSIVE),
    )
    m.done()
    try:
        _ = w.identity
    except IdentityError as exc:
        raise LocalConfigError(m.path, str(exc)) from exc
    return w


def _service(m: _Mapping) -> Service:
    m.require("vips", "write vips: [] for a service without virtual IPs")
    m.require("ports", "write ports: {} for a service without ports")
    vips = []
    for p, v in m.list_of("vips"):
        text = _str(v, p)
        network, sep, ip = text.partition("/")  # ztunnel's NetworkAddress: "<network>/<ip>"
        if not sep:
            raise LocalConfigError(p, f"{text!r}: want '<network>/<ip>' ('/{text}' for none)")
        vips.append((network, _ip(ip, p)))
    s = Service(
        name=m.text("name", required=True),
        namespace=m.text("namespace", required=True),
        hostname=m.text("hostname", required=True),
        vips=tuple(vips),
        ports=_port_map(m.get("ports", {}), m.sub("ports")),
        subject_alt_names=tuple(_str(v, p) for p, v in m.list_of("subjectAltNames")),
        extra=m.passive(_SERVICE_PASSIVE),
    )
    m.done()
    return s


def _policy(m: _Mapping) -> Policy:
    rules = []
    for rp, rule in m.list_of("rules"):
        clauses = []
        for cp, clause in _list(rule, rp):
            clauses.append(tuple(_match(_Mapping(x, xp)) for xp, x in _list(clause, cp)))
        rules.append(tuple(clauses))
    p = Policy(
        name=m.text("name", required=True),
        namespace=m.text("namespace", ""),
        scope=Scope(m.choice("scope", tuple(s.value for s in Scope), "Namespace")),
        action=Action(m.choice("action", ("Allow", "Deny"), "Allow")),
        rules=tuple(rules),
        dry_run=m.flag("dryRun", default=False),
    )
    m.done()
    return p


def _match(m: _Mapping) -> RbacMatch:
    r = RbacMatch(
        namespaces=tuple(_string_match(v, p) for p, v in m.list_of("namespaces")),
        not_namespaces=tuple(_string_match(v, p) for p, v in m.list_of("notNamespaces")),
        service_accounts=tuple(_sa(v, p) for p, v in m.list_of("serviceAccounts")),
        not_service_accounts=tuple(_sa(v, p) for p, v in m.list_of("notServiceAccounts")),
        principals=tuple(_string_match(v, p) for p, v in m.list_of("principals")),
        not_principals=tuple(_string_match(v, p) for p, v in m.list_of("notPrincipals")),
        source_ips=tuple(_net(v, p) for p, v in m.list_of("sourceIps")),
        not_source_ips=tuple(_net(v, p) for p, v in m.list_of("notSourceIps")),
        destination_ips=tuple(_net(v, p) for p, v in m.list_of("destinationIps")),
        not_destination_ips=tuple(_net(v, p) for p, v in m.list_of("notDestinationIps")),
        destination_ports=tuple(_port(v, p) for p, v in m.list_of("destinationPorts")),
        not_destination_ports=tuple(_port(v, p) for p, v in m.list_of("notDestinationPorts")),
    )
    m.done()
    return r


class _Mapping:
    """A mapping being read: remembers which keys were consumed so leftovers are refused."""

    def __init__(self, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise LocalConfigError(path, f"expected a mapping, got {_kind(value)}")
        self.value = value
        self.path = path
        self.seen: set[str] = set()

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def require(self, key: str, hint: str) -> None:
        """``key`` must be present (any value, even empty), as ztunnel's reader demands."""
        if key not in self.value:
            raise LocalConfigError(self.sub(key), f"required field is missing ({hint})")

    def get(self, key: str, default: Any = None) -> Any:
        self.seen.add(key)
        value = self.value.get(key, default)
        return default if value is None else value

    def text(self, key: str, default: str = "", *, required: bool = False) -> str:
        if required and self.value.get(key) in (None, ""):
            raise LocalConfigError(self.sub(key), "required field is missing")
        return _str(self.get(key, default), self.sub(key))

    def flag(self, key: str, *, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise LocalConfigError(self.sub(key), f"expected true or false, got {_kind(value)}")
        return value

    def choice(self, key: str, allowed: tuple[str, ...], default: str) -> str:
        value = self.text(key, default)
        if value not in allowed:
            raise LocalConfigError(self.sub(key), f"{value!r} is not one of {', '.join(allowed)}")
        return value

    def list_of(self, key: str) -> list[tuple[str, Any]]:
        return _list(self.get(key, []), self.sub(key))

    def mapping_items(self, key: str) -> list[tuple[str, Any, str]]:
        value = self.get(key, {})
        if not isinstance(value, Mapping):
            raise LocalConfigError(self.sub(key), f"expected a mapping, got {_kind(value)}")
        return [(str(k), v, f"{self.sub(key)}[{k!r}]") for k, v in value.items()]

    def passive(self, keys: tuple[str, ...]) -> dict[str, Any]:
        return {k: self.get(k) for k in keys if self.value.get(k) is not None}

    def done(self) -> None:
        unknown = [k for k in self.value if k not in self.seen]
        if unknown:
            raise LocalConfigError(self.sub(str(unknown[0])), "unknown field")


def _list(value: Any, path: str) -> list[tuple[str, Any]]:
    if not isinstance(value, list):
        raise LocalConfigError(path, f"expected a list, got {_kind(value)}")
    return [(f"{path}[{i}]", v) for i, v in enumerate(value)]


def _str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise LocalConfigError(path, f"expected a string, got {_kind(value)}")
    return value


def _ip(value: Any, path: str) -> IPAddress:
    try:
        return ipaddress.ip_address(_str(value, path))
    except ValueError as exc:
        raise LocalConfigError(path, f"{value!r} is not an IP address") from exc


def _net(value: Any, path: str) -> IPNetwork:
    try:
        return ipaddress.ip_network(_str(value, path), strict=False)
    except ValueError as exc:
        raise LocalConfigError(path, f"{value!r} is not an IP address or CIDR") from exc


def _port(value: Any, path: str) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise LocalConfigError(path, f"{value!r} is not a port number")
    return int(value)


def _port_map(value: Any, path: str) -> dict[int, int]:
    if not isinstance(value, Mapping):
        raise LocalConfigError(path, f"expected a mapping of port: targetPort, got {_kind(value)}")
    return {_port(k, f"{path}[{k!r}]"): _port(v, f"{path}[{k!r}]") for k, v in value.items()}


def _sa(value: Any, path: str) -> tuple[str, str]:
    m = _Mapping(value, path)
    result = (m.text("namespace", required=True), m.text("serviceAccount", required=True))
    m.done()
    return result


def _string_match(value: Any, path: str) -> StringMatch:
    """A principal or namespace: ztunnel's ``{Exact|Prefix|Suffix|Presence: ...}`` or Istio's
    glob string (``*``, ``prefix*``, ``*suffix``, exact)."""
    if isinstance(value, str):
        return glob_match(value)
    if isinstance(value, Mapping) and len(value) == 1:
        kind, text = next(iter(value.items()))
        kinds = {"Exact": "exact", "Prefix": "prefix", "Suffix": "suffix", "Presence": "presence"}
        if kind in kinds:
            text = "" if kinds[kind] == "presence" else _str(text, f"{path}.{kind}")
            return StringMatch(kind=kinds[kind], value=text)
    raise LocalConfigError(path, "expected a string or one of {Exact|Prefix|Suffix|Presence: ...}")


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


# Workload fields ztunnel's local-config reader defaults to "" when absent (serde defaults),
# while this store fills in what its xDS path would: (field, our default, the consequence).
_ZTUNNEL_EMPTY_DEFAULTS = (
    ("trustDomain", DEFAULT_TRUST_DOMAIN, "identity"),
    ("serviceAccount", "default", "identity"),
    ("clusterId", "Kubernetes", "metrics labels"),
)


def local_config_warnings(doc: Any) -> list[str]:
    """What ztunnel would read differently in a document ``parse_local_config`` accepts.

    One line per field, naming it by path, what each reader makes of it, and the fix: ztunnel
    reads a missing ``trustDomain`` or ``serviceAccount`` as empty (an identity no certificate
    carries), this store as ``cluster.local``/``default``.
    """
    out: list[str] = []
    workloads = doc.get("workloads") if isinstance(doc, Mapping) else None
    for i, w in enumerate(workloads if isinstance(workloads, list) else ()):
        if not isinstance(w, Mapping):
            continue
        for key, ours, what in _ZTUNNEL_EMPTY_DEFAULTS:
            if w.get(key) is None:
                out.append(
                    f"workloads[{i}].{key}: not set; ztunnel reads that as empty, meshctl as "
                    f"{ours!r} (it changes the workload's {what}): write {key}: {ours}"
                )
    return out
