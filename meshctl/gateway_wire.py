"""``GatewayConfig`` <-> its wire form (``meshctl.gateway.v1.GatewayConfig``), losslessly.

Owns the conversion the control plane encodes with and the gateway proxy decodes with, and the
xDS type URL. An adapter beside ``meshctl.xds`` (the workload types' conversions), not in the
core: the core never imports the generated protobuf modules. Invariants:
``from_proto(to_proto(c)) == c`` for every config whose numbers fit int64 (the table's
precedence order, host and listener order, rule order are kept as they are, never re-sorted); a
rule shared by several entries is sent once; ``to_proto`` of a value that cannot be encoded and
``from_proto`` of a message that names a missing rule or an unknown enum raise
``GatewayWireError`` (the proxy NACKs it and keeps its last config). Certificates and endpoints
are sent in a canonical order so equal configs encode to equal bytes (the version).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import TypeVar

from meshctl.core.gateway.config import BackendKey, Endpoint, GatewayConfig, KeyPair
from meshctl.core.gateway.model import (
    AllowedRoutes,
    Backend,
    Entry,
    Filters,
    HeaderMatch,
    HeaderModifier,
    Listener,
    ListenerRoutes,
    PathMatch,
    PathModifier,
    PathModifierType,
    PathType,
    PortTable,
    Protocol,
    QueryMatch,
    Redirect,
    Rewrite,
    RouteKey,
    RouteMatch,
    RouteTable,
    RpcMatch,
    Rule,
    SecretRef,
    Timeouts,
    VirtualHost,
)
from meshctl.proto import gateway_pb2 as pb

GATEWAY_TYPE = "type.googleapis.com/meshctl.gateway.v1.GatewayConfig"

_PROTOCOLS = {
    Protocol.HTTP: pb.PROTOCOL_HTTP,
    Protocol.HTTPS: pb.PROTOCOL_HTTPS,
    Protocol.TLS: pb.PROTOCOL_TLS,
    Protocol.TCP: pb.PROTOCOL_TCP,
}
_PATH_TYPES = {PathType.EXACT: pb.PATH_TYPE_EXACT, PathType.PREFIX: pb.PATH_TYPE_PREFIX}
_MODIFIERS = {
    PathModifierType.FULL: pb.PATH_MODIFIER_TYPE_FULL,
    PathModifierType.PREFIX: pb.PATH_MODIFIER_TYPE_PREFIX,
}


_PROTOCOL_OF: dict[int, Protocol] = {int(v): k for k, v in _PROTOCOLS.items()}
_PATH_TYPE_OF: dict[int, PathType] = {int(v): k for k, v in _PATH_TYPES.items()}
_MODIFIER_OF: dict[int, PathModifierType] = {int(v): k for k, v in _MODIFIERS.items()}
_E = TypeVar("_E")


class GatewayWireError(ValueError):
    """A config that cannot be encoded, or a message that is no valid config."""


def _lookup(table: Mapping[int, _E], value: int, what: str) -> _E:
    found = table.get(value)
    if found is None:
        raise GatewayWireError(f"unknown {what} {value}")
    return found


# -- encoding ------------------------------------------------------------------------------------


def to_proto(config: GatewayConfig) -> pb.GatewayConfig:
    """The wire form of ``config`` (``GatewayWireError`` when a number does not fit int64)."""
    try:
        return _config_to_proto(config)
    except (ValueError, TypeError) as exc:
        raise GatewayWireError(f"gateway {config.name}: cannot encode: {exc}") from exc


def encode(config: GatewayConfig) -> bytes:
    """Deterministic bytes of ``to_proto(config)``."""
    return to_proto(config).SerializeToString(deterministic=True)


def digest(config: GatewayConfig) -> str:
    """A version for ``config``'s content (its own ``version`` left out)."""
    unversioned = to_proto(config)
    unversioned.version = ""
    return hashlib.sha256(unversioned.SerializeToString(deterministic=True)).hexdigest()[:16]


def _config_to_proto(config: GatewayConfig) -> pb.GatewayConfig:
    out = pb.GatewayConfig(name=config.name, version=config.version)
    out.table.CopyFrom(_table_to_proto(config.table))
    for ref in sorted(config.certificates, key=lambda r: (r.namespace, r.name)):
        pair = config.certificates[ref]
        out.certificates.add(secret=_secret(ref), chain_pem=pair.chain_pem, key_pem=pair.key_pem)
    for key in sorted(config.endpoints, key=lambda k: (k.namespace, k.name, k.port)):
        group = out.endpoints.add(namespace=key.namespace, name=key.name, port=key.port)
        for e in config.endpoints[key]:
            group.endpoints.add(
                address=e.address,
                port=e.port,
                hbone=e.hbone,
                identity=e.identity,
                workload=e.workload,
            )
    return out


def _secret(ref: SecretRef) -> pb.SecretRef:
    return pb.SecretRef(namespace=ref.namespace, name=ref.name)


class _Rules:
    """Each distinct rule once, in first-seen order."""

    def __init__(self, out: pb.RouteTable) -> None:
        self._out = out
        self._index: dict[Rule, int] = {}

    def ref(self, rule: Rule) -> int:
        found = self._index.get(rule)
        if found is None:
            found = self._index[rule] = len(self._index)
            self._out.rules.append(_rule_to_proto(rule))
        return found


def _table_to_proto(table: RouteTable) -> pb.RouteTable:
    out = pb.RouteTable(
        one_label_wildcards=table.one_label_wildcards,
        misdirected_by_listener=table.misdirected_by_listener,
    )
    rules = _Rules(out)
    for port in table.ports:
        p = out.ports.add(port=port.port, protocol=_PROTOCOLS[port.protocol])
        for lr in port.listeners:
            wire = p.listeners.add()
            wire.listener.CopyFrom(_listener_to_proto(lr.listener))
            for vh in lr.hosts:
                host = wire.hosts.add(hostname=vh.hostname)
                host.entries.extend(_entry_to_proto(e, rules) for e in vh.entries)
        if port.default is not None:
            p.default.CopyFrom(_entry_to_proto(port.default, rules))
    return out


def _listener_to_proto(listener: Listener) -> pb.Listener:
    allowed = listener.allowed
    return pb.Listener(
        owner=listener.owner,
        name=listener.name,
        port=listener.port,
        protocol=_PROTOCOLS[listener.protocol],
        hostname=listener.hostname,
        certificates=[_secret(r) for r in listener.certificates],
        allowed=pb.AllowedRoutes(
            namespaces=allowed.namespaces,
            selector=[
                pb.SelectorRequirement(key=k, operator=op, values=vs)
                for k, op, vs in allowed.selector
            ],
            kinds=[pb.GroupKind(group=g, kind=k) for g, k in allowed.kinds],
        ),
        auto_passthrough=listener.auto_passthrough,
    )


def _entry_to_proto(entry: Entry, rules: _Rules) -> pb.Entry:
    return pb.Entry(
        route=pb.RouteKey(
            kind=entry.route.kind, namespace=entry.route.namespace, name=entry.route.name
        ),
        created=entry.created,
        rule=rules.ref(entry.rule),
        match_index=entry.match_index,
        match=_match_to_proto(entry.match),
    )


def _match_to_proto(match: RouteMatch) -> pb.RouteMatch:
    return pb.RouteMatch(
        path=pb.PathMatch(type=_PATH_TYPES[match.path.type], value=match.path.value),
        method=match.method,
        headers=[pb.HeaderMatch(name=h.name, value=h.value) for h in match.headers],
        query=[pb.QueryMatch(name=q.name, value=q.value) for q in match.query],
        rpc=(
            pb.RpcMatch(service=match.rpc.service, method=match.rpc.method)
            if match.rpc is not None
            else None
        ),
    )


def _rule_to_proto(rule: Rule) -> pb.Rule:
    out = pb.Rule(
        index=rule.index,
        name=rule.name,
        matches=[_match_to_proto(m) for m in rule.matches],
        backends=[
            pb.Backend(
                namespace=b.namespace,
                name=b.name,
                port=b.port,
                weight=b.weight,
                problem=b.problem,
                detail=b.detail,
            )
            for b in rule.backends
        ],
    )
    _filters_to_proto(rule.filters, out.filters)
    if rule.timeouts.request_ms is not None:
        out.timeouts.request_ms = rule.timeouts.request_ms
    if rule.timeouts.backend_request_ms is not None:
        out.timeouts.backend_request_ms = rule.timeouts.backend_request_ms
    return out


def _filters_to_proto(filters: Filters, out: pb.Filters) -> None:
    if filters.request_headers is not None:
        _modifier_to_proto(filters.request_headers, out.request_headers)
    if filters.response_headers is not None:
        _modifier_to_proto(filters.response_headers, out.response_headers)
    if (r := filters.redirect) is not None:
        out.redirect.SetInParent()
        out.redirect.scheme, out.redirect.hostname = r.scheme, r.hostname
        out.redirect.port, out.redirect.status = r.port, r.status
        if r.path is not None:
            out.redirect.path.CopyFrom(_path_modifier(r.path))
    if (w := filters.rewrite) is not None:
        out.rewrite.SetInParent()
        out.rewrite.hostname = w.hostname
        if w.path is not None:
            out.rewrite.path.CopyFrom(_path_modifier(w.path))


def _modifier_to_proto(m: HeaderModifier, out: pb.HeaderModifier) -> None:
    out.SetInParent()
    out.set.extend(pb.Header(name=n, value=v) for n, v in m.set)
    out.add.extend(pb.Header(name=n, value=v) for n, v in m.add)
    out.remove.extend(m.remove)


def _path_modifier(m: PathModifier) -> pb.PathModifier:
    return pb.PathModifier(type=_MODIFIERS[m.type], value=m.value)


# -- decoding ------------------------------------------------------------------------------------


def decode(data: bytes) -> GatewayConfig:
    """``from_proto`` of serialized bytes."""
    message = pb.GatewayConfig()
    try:
        message.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError has no stable import path across runtimes
        raise GatewayWireError(f"not a GatewayConfig: {exc}") from exc
    return from_proto(message)


def from_proto(message: pb.GatewayConfig) -> GatewayConfig:
    """The config ``message`` carries (``GatewayWireError`` when it is inconsistent)."""
    rules = tuple(_rule_from_proto(r) for r in message.table.rules)
    certificates = {
        SecretRef(c.secret.namespace, c.secret.name): KeyPair(
            chain_pem=c.chain_pem, key_pem=c.key_pem
        )
        for c in message.certificates
    }
    endpoints = {
        BackendKey(g.namespace, g.name, g.port): tuple(
            Endpoint(
                address=e.address,
                port=e.port,
                hbone=e.hbone,
                identity=e.identity,
                workload=e.workload,
            )
            for e in g.endpoints
        )
        for g in message.endpoints
    }
    return GatewayConfig(
        name=message.name,
        version=message.version,
        table=_table_from_proto(message.table, rules),
        certificates=certificates,
        endpoints=endpoints,
    )


def _table_from_proto(t: pb.RouteTable, rules: tuple[Rule, ...]) -> RouteTable:
    ports = []
    for p in t.ports:
        listeners = tuple(
            ListenerRoutes(
                listener=_listener_from_proto(lr.listener),
                hosts=tuple(
                    VirtualHost(
                        hostname=h.hostname,
                        entries=tuple(_entry_from_proto(e, rules) for e in h.entries),
                    )
                    for h in lr.hosts
                ),
            )
            for lr in p.listeners
        )
        default = _entry_from_proto(p.default, rules) if p.HasField("default") else None
        ports.append(
            PortTable(
                port=p.port,
                protocol=_protocol(p.protocol),
                listeners=listeners,
                default=default,
            )
        )
    return RouteTable(
        ports=tuple(ports),
        one_label_wildcards=t.one_label_wildcards,
        misdirected_by_listener=t.misdirected_by_listener,
    )


def _protocol(value: int) -> Protocol:
    return _lookup(_PROTOCOL_OF, value, "protocol")


def _listener_from_proto(w: pb.Listener) -> Listener:
    return Listener(
        owner=w.owner,
        name=w.name,
        port=w.port,
        protocol=_protocol(w.protocol),
        hostname=w.hostname,
        certificates=tuple(SecretRef(c.namespace, c.name) for c in w.certificates),
        allowed=AllowedRoutes(
            namespaces=w.allowed.namespaces,
            selector=tuple((s.key, s.operator, tuple(s.values)) for s in w.allowed.selector),
            kinds=tuple((k.group, k.kind) for k in w.allowed.kinds),
        ),
        auto_passthrough=w.auto_passthrough,
    )


def _entry_from_proto(w: pb.Entry, rules: tuple[Rule, ...]) -> Entry:
    if w.rule >= len(rules):
        raise GatewayWireError(f"an entry of {w.route.name} names rule {w.rule} of {len(rules)}")
    return Entry(
        route=RouteKey(w.route.kind, w.route.namespace, w.route.name),
        created=w.created,
        rule=rules[w.rule],
        match_index=w.match_index,
        match=_match_from_proto(w.match),
    )


def _match_from_proto(w: pb.RouteMatch) -> RouteMatch:
    path_type = _lookup(_PATH_TYPE_OF, w.path.type, "path type")
    return RouteMatch(
        path=PathMatch(path_type, w.path.value),
        method=w.method,
        headers=tuple(HeaderMatch(h.name, h.value) for h in w.headers),
        query=tuple(QueryMatch(q.name, q.value) for q in w.query),
        rpc=RpcMatch(service=w.rpc.service, method=w.rpc.method) if w.HasField("rpc") else None,
    )


def _rule_from_proto(w: pb.Rule) -> Rule:
    t = w.timeouts
    return Rule(
        index=w.index,
        name=w.name,
        matches=tuple(_match_from_proto(m) for m in w.matches),
        filters=_filters_from_proto(w.filters),
        backends=tuple(
            Backend(
                namespace=b.namespace,
                name=b.name,
                port=b.port,
                weight=b.weight,
                problem=b.problem,
                detail=b.detail,
            )
            for b in w.backends
        ),
        timeouts=Timeouts(
            request_ms=t.request_ms if t.HasField("request_ms") else None,
            backend_request_ms=t.backend_request_ms if t.HasField("backend_request_ms") else None,
        ),
    )


def _filters_from_proto(w: pb.Filters) -> Filters:
    redirect = rewrite = None
    if w.HasField("redirect"):
        r = w.redirect
        redirect = Redirect(
            scheme=r.scheme,
            hostname=r.hostname,
            path=_path_modifier_from(r.path) if r.HasField("path") else None,
            port=r.port,
            status=r.status,
        )
    if w.HasField("rewrite"):
        rw = w.rewrite
        rewrite = Rewrite(
            hostname=rw.hostname,
            path=_path_modifier_from(rw.path) if rw.HasField("path") else None,
        )
    return Filters(
        request_headers=_modifier_from(w.request_headers)
        if w.HasField("request_headers")
        else None,
        response_headers=_modifier_from(w.response_headers)
        if w.HasField("response_headers")
        else None,
        redirect=redirect,
        rewrite=rewrite,
    )


def _modifier_from(w: pb.HeaderModifier) -> HeaderModifier:
    return HeaderModifier(set=_pairs(w.set), add=_pairs(w.add), remove=tuple(w.remove))


def _pairs(headers: Iterable[pb.Header]) -> tuple[tuple[str, str], ...]:
    return tuple((h.name, h.value) for h in headers)


def _path_modifier_from(w: pb.PathModifier) -> PathModifier:
    kind = _lookup(_MODIFIER_OF, w.type, "path modifier")
    return PathModifier(kind, w.value)
