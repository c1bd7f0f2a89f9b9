"""A request against a route table: which listener, host, rule and backends take it, or why none.

Owns the request -> ``Decision`` step of the proxy. Order: the port's listener whose hostname
names the request's host most specifically (an HTTPS request whose host belongs to another
listener than its SNI chose is 421 Misdirected, unless that listener has the same certificates
and the table allows coalescing); then that listener's most specific host (no fall-through to a
wider one); then the first row in precedence order whose match holds (a gRPC call: among the
host's GRPCRoute rows when it has any). No match: 404, or
Ingress's default backend. A rule that redirects answers the redirect; one without usable
backends answers 500. A TLS passthrough connection (``passthrough``) takes the same listener
and host steps on its SNI; a TCP connection (``tcp``) the port's oldest route. Weighted choice
takes the caller's random draw. Invariants: pure; every decision carries a one-line ``reason``
for the ``x-meshctl-route`` header and the access log.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace
from urllib.parse import parse_qsl

from . import filters, grpc, hostnames, paths
from .model import (
    NO_FILTERS,
    NO_TIMEOUTS,
    Backend,
    Entry,
    Filters,
    Listener,
    ListenerRoutes,
    PathType,
    PortTable,
    RouteMatch,
    RouteTable,
    Rule,
    Timeouts,
)
from .table import precedence

HEADER = "x-meshctl-route"  # the response header a 404/500/421 carries its reason in


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """What matching reads of a request. ``host`` is the Host header or ``:authority`` as
    sent (port and case are normalised here), ``path`` the target's path without the query,
    ``sni`` the TLS server name the connection was accepted for ("" for none or plaintext)."""

    port: int
    host: str
    path: str = "/"
    query: str = ""
    method: str = "GET"
    headers: tuple[tuple[str, str], ...] = ()
    scheme: str = "http"
    sni: str = ""
    grpc: bool = False  # a gRPC call (grpc.is_grpc): GRPCRoute rows take it


class Outcome(enum.StrEnum):
    FORWARD = "forward"  # to one of ``backends`` (choose_backend)
    REDIRECT = "redirect"  # answer ``status`` with ``location``
    NO_ROUTE = "no-route"  # 404
    NO_BACKEND = "no-backend"  # 500
    MISDIRECTED = "misdirected"  # 421


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    outcome: Outcome
    status: int  # 0 when forwarded (the backend answers), else the status to answer
    reason: str  # e.g. "HTTPRoute default/web rules[0]" or "no-route (host example.com)"
    listener: Listener | None = None
    hostname: str = ""  # the host pattern the request matched
    entry: Entry | None = None
    backends: tuple[Backend, ...] = ()  # candidates with weight > 0 (some may be unresolved)
    filters: Filters = NO_FILTERS
    timeouts: Timeouts = NO_TIMEOUTS
    path: str = ""  # the request path as matched (dot segments resolved)
    upstream_host: str = ""  # Host to send upstream (after URLRewrite)
    upstream_path: str = ""  # path to send upstream (after URLRewrite), without the query
    location: str = ""  # REDIRECT: the Location header


def _reject(
    outcome: Outcome,
    status: int,
    detail: str,
    *,
    listener: Listener | None = None,
    hostname: str = "",
    path: str = "",
    base: Decision | None = None,
) -> Decision:
    reason = f"{outcome} ({detail})"
    if base is not None:
        return replace(base, outcome=outcome, status=status, reason=reason)
    return Decision(
        outcome=outcome,
        status=status,
        reason=reason,
        listener=listener,
        hostname=hostname,
        path=path,
    )


def _listener_for(port: PortTable, host: str, one_label: bool) -> ListenerRoutes | None:
    for candidate in port.listeners:  # most specific first
        if hostnames.matches(candidate.listener.hostname, host, one_label=one_label):
            return candidate
    return None


def _header_value(headers: Sequence[tuple[str, str]], name: str) -> str | None:
    values = [v for n, v in headers if n.lower() == name]
    return ",".join(values) if values else None  # RFC 9110 5.3: a repeated field is one list


def _first_params(query: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        params.setdefault(name, value)  # a repeated param: its first value (the API's advice)
    return params


def holds(  # noqa: PLR0911 (one return per part of the match)
    match: RouteMatch, request: Request, path: str, params: dict[str, str] | None
) -> bool:
    """Every part of ``match`` holds for ``request`` (``path`` normalised, ``params`` parsed
    lazily: None until a query match needs them)."""
    if match.path.type is PathType.EXACT:
        if not paths.exact_matches(match.path.value, path):
            return False
    elif not paths.prefix_matches(match.path.value, path):
        return False
    if match.method and match.method != request.method:
        return False
    if match.rpc is not None and not grpc.method_holds(match.rpc, path):
        return False
    for header in match.headers:
        if _header_value(request.headers, header.name) != header.value:
            return False
    if match.query:
        params = params if params is not None else _first_params(request.query)
        return all(params.get(q.name) == q.value for q in match.query)
    return True


def match(table: RouteTable, request: Request) -> Decision:
    """The decision for ``request`` on ``table`` (see the module's docstring for the order)."""
    host = hostnames.request_host(request.host)
    path = paths.normalize(request.path or "/")
    port = table.port(request.port)
    if port is None:
        return _reject(Outcome.NO_ROUTE, 404, f"no listener on port {request.port}", path=path)
    one_label = table.one_label_wildcards
    chosen = _listener_for(port, host, one_label)
    if chosen is not None and request.sni:
        by_sni = _listener_for(port, hostnames.request_host(request.sni), one_label)
        if by_sni is not None and by_sni.listener != chosen.listener:
            other_certificates = by_sni.listener.certificates != chosen.listener.certificates
            if table.misdirected_by_listener or other_certificates:
                return _reject(
                    Outcome.MISDIRECTED,
                    421,
                    f"host {host} belongs to listener {chosen.listener.label}, "
                    f"TLS was for {by_sni.listener.label}",
                    listener=by_sni.listener,
                    path=path,
                )
    if chosen is None:
        return _fallback(port, request, host, path, f"host {host}: no listener")
    vhost = chosen.host(host, one_label=one_label)  # most specific: no fall-through to a wider one
    if vhost is None:
        return _fallback(port, request, host, path, f"host {host}", chosen.listener)
    params: dict[str, str] | None = None
    # A gRPC call takes the host's GRPCRoute rows when it has any (else HTTPRoute rows, which
    # carried gRPC before GRPCRoute); any other request never takes a GRPCRoute row.
    rows = vhost.grpc if request.grpc and vhost.grpc else vhost.http
    for entry in rows:
        if entry.match.query and params is None:
            params = _first_params(request.query)
        if holds(entry.match, request, path, params):
            return _take(entry, request, host, path, chosen.listener, vhost.hostname)
    return _fallback(
        port,
        request,
        host,
        path,
        f"host {host}: no rule matches {request.method} {path}",
        chosen.listener,
        vhost.hostname,
    )


def _fallback(
    port: PortTable,
    request: Request,
    host: str,
    path: str,
    detail: str,
    listener: Listener | None = None,
    hostname: str = "",
) -> Decision:
    if port.default is not None:
        return _take(port.default, request, host, path, listener, hostname)
    return _reject(Outcome.NO_ROUTE, 404, detail, listener=listener, hostname=hostname, path=path)


def _take(
    entry: Entry,
    request: Request,
    host: str,
    path: str,
    listener: Listener | None,
    hostname: str,
) -> Decision:
    rule = entry.rule
    prefix = entry.match.path.value if entry.match.path.type is PathType.PREFIX else ""
    base = Decision(
        outcome=Outcome.FORWARD,
        status=0,
        reason=entry.label,
        listener=listener,
        hostname=hostname,
        entry=entry,
        filters=rule.filters,
        timeouts=rule.timeouts,
        path=path,
    )
    redirect = rule.filters.redirect
    if redirect is not None:
        location = filters.redirect_location(
            redirect,
            scheme=request.scheme,
            host=host,
            listener_port=listener.port if listener is not None else request.port,
            path=path,
            query=request.query,
            matched_prefix=prefix,
        )
        return replace(base, outcome=Outcome.REDIRECT, status=redirect.status, location=location)
    refused = _without_backends(entry, base, status=500)
    if refused is not None:
        return refused
    upstream_host, upstream_path = filters.rewritten(
        rule.filters.rewrite, host=request.host, path=path, matched_prefix=prefix
    )
    return replace(
        base,
        backends=_candidates(rule),
        upstream_host=upstream_host,
        upstream_path=upstream_path,
    )


def _candidates(rule: Rule) -> tuple[Backend, ...]:
    return tuple(b for b in rule.backends if b.weight > 0)


def _without_backends(entry: Entry, base: Decision, *, status: int) -> Decision | None:
    """NO_BACKEND when ``entry``'s rule has no backend to take its traffic, else None."""
    candidates = _candidates(entry.rule)
    if not entry.rule.backends:
        detail = f"{entry.label}: no backendRefs"
    elif not candidates:
        detail = f"{entry.label}: every weight is 0"
    elif not any(b.resolved for b in candidates):
        detail = f"{entry.label}: {unresolved(candidates[0])}"
    else:
        return None
    return _reject(Outcome.NO_BACKEND, status, detail, base=base)


def passthrough(table: RouteTable, port_number: int, server_name: str) -> Decision:
    """The decision for a TLS connection routed by its ClientHello's server name and never
    terminated (TLSRoute on a ``Passthrough`` listener): the port's listener whose hostname
    names the SNI most specifically, then its most specific host (listener ∩ route hostnames,
    as for HTTP), then that host's first row (TLSRoute rules have no matches: the oldest route
    wins). A connection without SNI ("") is taken only where neither the listener nor the route
    names a hostname. ``status`` is 0 throughout (no HTTP here): NO_ROUTE and NO_BACKEND
    close the connection (no TLS alert)."""
    host = hostnames.server_name_host(server_name)
    shown = host or "(none)"
    port = table.port(port_number)
    if port is None:
        return _reject(Outcome.NO_ROUTE, 0, f"no listener on port {port_number}")
    chosen = _listener_for(port, host, table.one_label_wildcards)
    if chosen is None:
        return _reject(Outcome.NO_ROUTE, 0, f"sni {shown}: no listener")
    vhost = chosen.host(host, one_label=table.one_label_wildcards)
    if vhost is None or not vhost.entries:
        return _reject(Outcome.NO_ROUTE, 0, f"sni {shown}: no route", listener=chosen.listener)
    entry = vhost.entries[0]
    base = Decision(
        outcome=Outcome.FORWARD,
        status=0,
        reason=entry.label,
        listener=chosen.listener,
        hostname=vhost.hostname,
        entry=entry,
    )
    refused = _without_backends(entry, base, status=0)
    return refused if refused is not None else replace(base, backends=_candidates(entry.rule))


def tcp(table: RouteTable, port_number: int) -> Decision:
    """The decision for a TCP connection (TCPRoute): nothing on the wire to match, so the
    port's listener (one: TCP listeners on a port conflict) and its oldest route. ``status``
    is 0 throughout; NO_ROUTE and NO_BACKEND both close the connection."""
    port = table.port(port_number)
    if port is None or not port.listeners:
        return _reject(Outcome.NO_ROUTE, 0, f"no listener on port {port_number}")
    chosen = port.listeners[0]
    entries = [e for vh in chosen.hosts for e in vh.entries]
    if not entries:
        return _reject(Outcome.NO_ROUTE, 0, "no TCPRoute attached", listener=chosen.listener)
    entry = min(entries, key=precedence)
    base = Decision(
        outcome=Outcome.FORWARD,
        status=0,
        reason=entry.label,
        listener=chosen.listener,
        hostname=chosen.listener.hostname,
        entry=entry,
    )
    refused = _without_backends(entry, base, status=0)
    return refused if refused is not None else replace(base, backends=_candidates(entry.rule))


def unresolved(backend: Backend) -> str:
    """Why a backend takes no traffic, for the 500's reason."""
    return f"{backend.problem} {backend.label}" + (f": {backend.detail}" if backend.detail else "")


def choose_backend(backends: Sequence[Backend], draw: float) -> Backend:
    """The backend a uniform ``draw`` in [0, 1) picks, each in proportion to its weight (the
    caller draws: the core has no randomness). An unresolved one picked is a 500 for this
    request (its share of the traffic, as the API asks). ``backends`` must not be empty."""
    weighted = [b for b in backends if b.weight > 0]
    if not weighted:
        raise ValueError("no backend with a weight above 0")
    target = min(max(draw, 0.0), 1.0) * sum(b.weight for b in weighted)
    running = 0
    for backend in weighted:
        running += backend.weight
        if target < running:
            return backend
    return weighted[-1]  # draw == 1.0 (clamped) or float rounding at the top
