"""Route tables and decisions as plain data: what ``/config_dump``, ``meshctl gateway routes``
and ``meshctl gateway explain`` print, and what the goldens hold.

Owns the printed shape. A row is one line per concern: the match (``Exact /a GET
header[x]=1 query[q]=v``; a GRPCRoute's ``grpc svc/Method header[x]=1``, ``*`` for any service
or method; none for a TLSRoute's rows, which match no request), the route and
rule it came from, its backends (``ns/name:port weight W``, with the reason when unresolved)
and, when set, its filters and timeouts. Invariant: pure; the same table prints the same text
(everything is already in precedence order).
"""

from __future__ import annotations

from typing import Any

from .matching import Decision
from .model import (
    GRPC_KIND,
    STREAM_KINDS,
    Backend,
    Entry,
    Filters,
    HeaderModifier,
    PathModifier,
    RouteMatch,
    RouteTable,
)


def match_text(match: RouteMatch, *, grpc: bool = False) -> str:
    if grpc:
        rpc = match.rpc
        service, method = (rpc.service, rpc.method) if rpc is not None else ("", "")
        parts = [f"grpc {service or '*'}/{method or '*'}"]
    else:
        parts = [f"{match.path.type} {match.path.value}"]
    if match.method:
        parts.append(match.method)
    parts.extend(f"header[{h.name}]={h.value}" for h in match.headers)
    parts.extend(f"query[{q.name}]={q.value}" for q in match.query)
    return " ".join(parts)


def backend_text(backend: Backend) -> str:
    text = f"{backend.label} weight {backend.weight}"
    if not backend.resolved:
        text += (
            f" ({backend.problem}: {backend.detail})" if backend.detail else f" ({backend.problem})"
        )
    return text


def _headers(modifier: HeaderModifier) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if modifier.set:
        out["set"] = [f"{n}: {v}" for n, v in modifier.set]
    if modifier.add:
        out["add"] = [f"{n}: {v}" for n, v in modifier.add]
    if modifier.remove:
        out["remove"] = list(modifier.remove)
    return out


def _path(modifier: PathModifier | None) -> dict[str, Any]:
    return {} if modifier is None else {"path": f"{modifier.type} {modifier.value}"}


def filters_data(filters: Filters) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if filters.request_headers is not None:
        out["requestHeaders"] = _headers(filters.request_headers)
    if filters.response_headers is not None:
        out["responseHeaders"] = _headers(filters.response_headers)
    if (r := filters.redirect) is not None:
        redirect: dict[str, Any] = {"status": r.status}
        redirect |= {k: v for k, v in (("scheme", r.scheme), ("hostname", r.hostname)) if v}
        redirect |= ({"port": r.port} if r.port else {}) | _path(r.path)
        out["redirect"] = redirect
    if (w := filters.rewrite) is not None:
        out["rewrite"] = ({"hostname": w.hostname} if w.hostname else {}) | _path(w.path)
    return out


def entry_data(entry: Entry) -> dict[str, Any]:
    rule = entry.rule
    where = entry.label
    if len(rule.matches) > 1:
        where += f".matches[{entry.match_index}]"
    out: dict[str, Any] = (
        {}
        if entry.route.kind in STREAM_KINDS
        else {"match": match_text(entry.match, grpc=entry.route.kind == GRPC_KIND)}
    )
    out |= {
        "route": where,
        "backends": [backend_text(b) for b in rule.backends],
    }
    if filters := filters_data(rule.filters):
        out["filters"] = filters
    timeouts = {
        k: v
        for k, v in (
            ("requestMs", rule.timeouts.request_ms),
            ("backendRequestMs", rule.timeouts.backend_request_ms),
        )
        if v is not None
    }
    if timeouts:
        out["timeouts"] = timeouts
    return out


def table_data(table: RouteTable) -> dict[str, Any]:
    ports = []
    for port in table.ports:
        listeners = []
        for lr in port.listeners:
            listener: dict[str, Any] = {
                "listener": lr.listener.label,
                "hostname": lr.listener.hostname,
            }
            if lr.listener.certificates:
                listener["certificates"] = [str(c) for c in lr.listener.certificates]
            if lr.listener.auto_passthrough:  # the SNI names the Service: no routes read
                listener["tlsMode"] = "AUTO_PASSTHROUGH"
            listener["hosts"] = [
                {"hostname": vh.hostname, "routes": [entry_data(e) for e in vh.entries]}
                for vh in lr.hosts
            ]
            listeners.append(listener)
        data: dict[str, Any] = {
            "port": port.port,
            "protocol": str(port.protocol),
            "listeners": listeners,
        }
        if port.default is not None:
            data["default"] = entry_data(port.default)
        ports.append(data)
    return {"wildcards": "one label" if table.one_label_wildcards else "labels", "ports": ports}


def decision_data(decision: Decision) -> dict[str, Any]:
    out: dict[str, Any] = {"outcome": str(decision.outcome)}
    if decision.status:
        out["status"] = decision.status
    out["reason"] = decision.reason
    if decision.listener is not None:
        out["listener"] = decision.listener.label
    if decision.hostname:
        out["hostname"] = decision.hostname
    if decision.backends:
        out["backends"] = [backend_text(b) for b in decision.backends]
    if decision.location:
        out["location"] = decision.location
    if decision.filters.rewrite is not None and decision.outcome == "forward":
        out["upstream"] = f"{decision.upstream_host} {decision.upstream_path}"
    if filters := filters_data(decision.filters):
        out["filters"] = filters
    return out
