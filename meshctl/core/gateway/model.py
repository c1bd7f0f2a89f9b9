"""What a gateway proxy serves, as values: listeners per port, the routes attached to them and
the route table (per listener port: hostnames x rules, in the API's precedence order).

Owns the types the controller builds (``translate``), the proxy matches on (``matching``) and
``meshctl gateway routes`` prints (``render``). Invariants: frozen values, no Kubernetes objects;
header names are lower-case; a ``Backend`` is resolved or says why not (``problem``: the route
status reason, ``detail``: its message); a ``RouteTable`` holds only what may serve traffic
(accepted, unconflicted listeners; accepted routes), already sorted, so matching is a scan.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .hostnames import ANY, matches


class PathType(enum.StrEnum):
    EXACT = "Exact"
    PREFIX = "PathPrefix"  # Ingress's Prefix and (our choice) ImplementationSpecific


class Protocol(enum.StrEnum):
    HTTP = "HTTP"
    HTTPS = "HTTPS"
    TLS = "TLS"  # passthrough: routed by the ClientHello's SNI, never terminated (TLSRoute)
    TCP = "TCP"  # bytes to a backend, nothing read (TCPRoute)


@dataclass(frozen=True, slots=True)
class PathMatch:
    type: PathType
    value: str


ROOT = PathMatch(PathType.PREFIX, "/")


@dataclass(frozen=True, slots=True)
class HeaderMatch:
    name: str  # lower-case
    value: str


@dataclass(frozen=True, slots=True)
class QueryMatch:
    name: str  # case-sensitive
    value: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RpcMatch:
    """A GRPCRoute method match (Exact): the gRPC service and/or method a request's path
    ``/<service>/<method>`` names; "" = any."""

    service: str = ""
    method: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteMatch:
    """One match of a rule: every part must hold. Headers and query params are deduplicated by
    name (the first entry wins), so their counts are the precedence counts. A GRPCRoute's
    match has ``rpc`` (or matches any method) and the root path."""

    path: PathMatch = ROOT
    method: str = ""  # "" = any
    headers: tuple[HeaderMatch, ...] = ()
    query: tuple[QueryMatch, ...] = ()
    rpc: RpcMatch | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HeaderModifier:
    set: tuple[tuple[str, str], ...] = ()
    add: tuple[tuple[str, str], ...] = ()
    remove: tuple[str, ...] = ()


class PathModifierType(enum.StrEnum):
    FULL = "ReplaceFullPath"
    PREFIX = "ReplacePrefixMatch"


@dataclass(frozen=True, slots=True)
class PathModifier:
    type: PathModifierType
    value: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Redirect:
    scheme: str = ""  # "" = the request's
    hostname: str = ""  # "" = the request's host
    path: PathModifier | None = None
    port: int = 0  # 0 = derived (the API's rules: the scheme's well-known port or the listener's)
    status: int = 302


@dataclass(frozen=True, slots=True, kw_only=True)
class Rewrite:
    hostname: str = ""
    path: PathModifier | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Filters:
    request_headers: HeaderModifier | None = None
    response_headers: HeaderModifier | None = None
    redirect: Redirect | None = None
    rewrite: Rewrite | None = None


NO_FILTERS = Filters()


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeouts:
    """Milliseconds; None = ours (no limit of the route's own), 0 = disabled (the API's "0s")."""

    request_ms: int | None = None
    backend_request_ms: int | None = None


NO_TIMEOUTS = Timeouts()


@dataclass(frozen=True, slots=True, kw_only=True)
class Backend:
    """A Service port with its weight: resolved, or with the reason it is not (its share of
    the traffic answers 500)."""

    namespace: str
    name: str
    port: int
    weight: int = 1
    problem: str = ""  # "" | BackendNotFound | RefNotPermitted | InvalidKind
    detail: str = ""

    @property
    def resolved(self) -> bool:
        return not self.problem

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}:{self.port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    index: int  # position in its route (precedence ties: the first rule wins)
    name: str = ""  # how status and logs name it ("rules[0]", or the rule's own name)
    matches: tuple[RouteMatch, ...] = (RouteMatch(),)
    filters: Filters = NO_FILTERS
    backends: tuple[Backend, ...] = ()
    timeouts: Timeouts = NO_TIMEOUTS


# Route kinds that route whole connections: their rules have no matches (one row per rule).
STREAM_KINDS = frozenset({"TLSRoute", "TCPRoute"})
GRPC_KIND = "GRPCRoute"  # its rows take gRPC requests only (matching.match)


@dataclass(frozen=True, slots=True, order=True)
class RouteKey:
    kind: str  # HTTPRoute | GRPCRoute | TLSRoute | TCPRoute | Ingress
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    key: RouteKey
    created: str = ""  # metadata.creationTimestamp (RFC 3339, compares as text)
    hostnames: tuple[str, ...] = ()  # empty: every host its listener takes
    rules: tuple[Rule, ...] = ()


@dataclass(frozen=True, slots=True)
class SecretRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True, kw_only=True)
class AllowedRoutes:
    """Which routes may attach: namespaces ``Same`` | ``All`` | ``Selector`` | ``None`` (the
    selector a ``matchLabels``/``matchExpressions`` mapping), kinds as (group, kind)."""

    namespaces: str = "Same"
    selector: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # (key, operator, values)
    kinds: tuple[tuple[str, str], ...] = ()


ALLOW_SAME = AllowedRoutes()


@dataclass(frozen=True, slots=True, kw_only=True)
class Listener:
    owner: str  # "<namespace>/<gateway>", or "ingress"
    name: str
    port: int
    protocol: Protocol
    hostname: str = ANY
    certificates: tuple[SecretRef, ...] = ()  # HTTPS: the usable ones, in the spec's order
    allowed: AllowedRoutes = ALLOW_SAME
    # Istio's east-west listener (TLS, Passthrough): the SNI names the Service (``eastwest``)
    auto_passthrough: bool = False

    @property
    def label(self) -> str:
        return f"{self.owner}/{self.name}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One match of one rule of one route, as a row of a host's table."""

    route: RouteKey
    created: str
    rule: Rule
    match_index: int
    match: RouteMatch

    @property
    def label(self) -> str:
        rule = self.rule.name or f"rules[{self.rule.index}]"
        return f"{self.route} {rule}"


@dataclass(frozen=True, slots=True, kw_only=True)
class VirtualHost:
    hostname: str  # a pattern; ANY for routes without hostnames on a listener without one
    entries: tuple[Entry, ...]  # in precedence order
    # the rows gRPC requests take first (GRPCRoute's), and those every other request takes
    grpc: tuple[Entry, ...] = field(init=False, repr=False, compare=False)
    http: tuple[Entry, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        grpc = tuple(e for e in self.entries if e.route.kind == GRPC_KIND)
        object.__setattr__(self, "grpc", grpc)
        http = tuple(e for e in self.entries if e.route.kind != GRPC_KIND)
        object.__setattr__(self, "http", http)


@dataclass(frozen=True, slots=True, kw_only=True)
class ListenerRoutes:
    listener: Listener
    hosts: tuple[VirtualHost, ...]  # most specific hostname first
    # exact hostnames by name, then the wildcards and ANY in order: a lookup, not a scan
    _exact: dict[str, VirtualHost] = field(init=False, repr=False, compare=False)
    _patterns: tuple[VirtualHost, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        exact = {vh.hostname: vh for vh in self.hosts if not vh.hostname.startswith("*")}
        object.__setattr__(self, "_exact", exact)
        patterns = tuple(vh for vh in self.hosts if vh.hostname.startswith("*"))
        object.__setattr__(self, "_patterns", patterns)

    def host(self, name: str, *, one_label: bool = False) -> VirtualHost | None:
        """The most specific host naming ``name`` (normalised), or None."""
        found = self._exact.get(name)
        if found is not None:
            return found
        return next(
            (vh for vh in self._patterns if matches(vh.hostname, name, one_label=one_label)), None
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PortTable:
    port: int
    protocol: Protocol
    listeners: tuple[ListenerRoutes, ...]  # most specific listener hostname first
    default: Entry | None = None  # Ingress's defaultBackend: what nothing else matches


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteTable:
    """What one proxy serves: per listener port, its listeners and their hosts' rules."""

    ports: tuple[PortTable, ...] = ()
    one_label_wildcards: bool = False  # Ingress: ``*.`` stands for exactly one label
    # 421 when a request's host belongs to another listener than its TLS SNI chose: only when
    # that listener has other certificates (False), or always, as the API's SHOULD (True).
    misdirected_by_listener: bool = False
    _by_port: dict[int, PortTable] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_port", {p.port: p for p in self.ports})

    def port(self, number: int) -> PortTable | None:
        return self._by_port.get(number)
