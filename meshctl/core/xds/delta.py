"""The server side of one incremental xDS stream (Envoy's Delta xDS protocol), sans I/O.

Owns, per resource type on one stream: the subscription (wildcard, explicit names, Istio
ztunnel's on-demand form ``subscribe=["*"]`` + ``unsubscribe=["*"]`` meaning "nothing yet"), what
the client holds (from ``initial_resource_versions`` on a reconnect, then from what was sent),
nonces, ACK and NACK. It decides exactly what to send after each request (``receive``) and after
each store change (``refresh``); the adapter encodes the named records and writes them.

Rules (envoyproxy xds_protocol "Incremental xDS", and what ztunnel needs):
- the first request of a type always gets a response, even an empty one (ztunnel is not ready
  until it has ACKed one per wildcard type); so does every request that subscribes to names;
- a name subscribed explicitly is always answered: the resource, or a removal if none exists
  (ztunnel's on-demand waiter wakes only on that exact name); an alias (``network/IP``) is
  answered under the alias and its resource's own name is subscribed too, so a later removal
  reaches the client under the name it stores the record by;
- a resource is sent when the client does not hold its current version; a version the client
  NACKed is not sent again (a newer one is); a name the client holds that no longer exists, or
  left its view, is sent as removed;
- ``initial_resource_versions`` name the resources a reconnecting client holds (an empty version:
  held, version unknown); on a stream that is not wildcard they are its subscriptions;
- unsubscribing forgets the names (nothing is sent for them); unsubscribing ``*`` forgets what
  only the wildcard covered;
- on demand (not wildcard), as istiod serves ztunnel's ``XDS_ON_DEMAND``: the catalog's implied
  keys (the workloads on the proxy's node, its own among them: ztunnel waits for its own
  workload and never asks for it) come with the first response and whenever they change, and a
  resource asked for brings its companions (a service its workloads); both stay subscribed.
Invariants: pure (names and versions in, names and versions out); nonces are unique per stream.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Protocol

WILDCARD = "*"
_MAX_PENDING = 256  # unacknowledged responses remembered per type (a client that never ACKs)


class Catalog(Protocol):
    """What exists of one type, as one stream may see it."""

    def resolve(self, name: str) -> tuple[str, str] | None:
        """(resource key, version) for a resource name or alias; None when nothing has it."""
        ...

    def view(self) -> Iterable[str]:
        """Every resource key a wildcard subscription of this stream covers."""
        ...

    def in_view(self, key: str) -> bool: ...

    # On demand (a subscription that is not wildcard), what istiod sends beyond the names asked:
    def implied(self) -> Iterable[str]:
        """Keys this stream gets without asking (istiod: the workloads on the proxy's node)."""
        ...

    def implies(self, key: str, subscribed: AbstractSet[str]) -> bool:
        """Whether ``key`` comes unasked to a stream subscribed to ``subscribed`` (on the
        proxy's node, or a workload of a subscribed service)."""
        ...

    def companions(self, key: str) -> Iterable[str]:
        """Keys that come with ``key`` when it is asked for (a service's workloads)."""
        ...


class Plain:
    """The on-demand part of ``Catalog`` for a type with nothing beyond the names asked."""

    def implied(self) -> Iterable[str]:
        return ()

    def implies(self, key: str, subscribed: AbstractSet[str]) -> bool:
        return False

    def companions(self, key: str) -> Iterable[str]:
        return ()


class DeltaProtocolError(ValueError):
    """The client broke the protocol; the stream ends with INVALID_ARGUMENT and this message."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """A DeltaDiscoveryRequest as plain data (``error`` set: ``error_detail`` was present)."""

    type_url: str
    subscribe: tuple[str, ...] = ()
    unsubscribe: tuple[str, ...] = ()
    initial_versions: Mapping[str, str] = field(default_factory=dict)
    nonce: str = ""
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Resource:
    """One resource to send: under ``name``, the record of ``key``, at ``version``."""

    name: str
    key: str
    version: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Response:
    type_url: str
    nonce: str
    resources: tuple[Resource, ...] = ()
    removed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What a request caused: a response to send, and what its ACK or NACK confirmed."""

    response: Response | None = None
    acked: tuple[Resource, ...] = ()
    nacked: tuple[Resource, ...] = ()  # the resources the client refused (error_detail)
    error: str = ""  # the client's NACK message
    unknown_nonce: bool = False  # an ACK/NACK for a response this stream never sent (or forgot)


@dataclass(slots=True)
class _Sent:
    resource: Resource | None  # None: a removal of ``name``
    name: str
    before: str | None  # what the client held before this response


@dataclass(slots=True)
class _Subscription:
    wildcard: bool = False
    names: set[str] = field(default_factory=set)
    held: dict[str, str] = field(default_factory=dict)  # name -> version ("" = unknown)
    nacked: dict[str, str] = field(default_factory=dict)  # name -> version refused
    pending: dict[str, list[_Sent]] = field(default_factory=dict)  # nonce -> what it carried
    acked: bool = False  # the client has ACKed at least one response


def _subscribe(sub: _Subscription, request: Request, catalog: Catalog, *, first: bool) -> set[str]:
    """Apply a request's subscription changes; returns the names that must be answered."""
    if first and not request.subscribe and not request.unsubscribe:
        sub.wildcard = True  # the legacy wildcard: a first request naming nothing
    forced: set[str] = set()
    for name in request.subscribe:
        if name == WILDCARD:
            sub.wildcard = True
        else:
            sub.names.add(name)
            forced.add(name)
    for name in request.unsubscribe:
        if name == WILDCARD:
            sub.wildcard = False
            # The client drops what only the wildcard gave it.
            for held in [n for n in sub.held if n not in sub.names]:
                del sub.held[held]
        else:
            sub.names.discard(name)
            forced.discard(name)
            if not (sub.wildcard and catalog.in_view(name)):
                sub.held.pop(name, None)
    if first:
        sub.held.update(request.initial_versions)
        if not sub.wildcard:
            sub.names.update(n for n in request.initial_versions if n != WILDCARD)
    return forced


def _keep_on_demand(sub: _Subscription, catalog: Catalog, name: str, key: str) -> list[str]:
    """On demand, what comes unasked is subscribed from then on (istiod does the same), so its
    later changes and removal reach the client; returns the companions newly subscribed."""
    sub.names.add(name)
    extras = [extra for extra in catalog.companions(key) if extra not in sub.names]
    sub.names.update(extras)
    return extras


class DeltaStream:
    """One stream's subscriptions: requests and store changes in, responses out."""

    def __init__(self) -> None:
        self._subs: dict[str, _Subscription] = {}
        self._nonces = itertools.count(1)

    def types(self) -> list[str]:
        """The type URLs subscribed so far, in subscription order."""
        return list(self._subs)

    def wildcard(self, type_url: str) -> bool:
        sub = self._subs.get(type_url)
        return sub is not None and sub.wildcard

    def acked(self, type_url: str) -> bool:
        sub = self._subs.get(type_url)
        return sub is not None and sub.acked

    def held(self, type_url: str) -> Mapping[str, str]:
        """What the client holds of ``type_url`` as far as this stream knows (name -> version)."""
        sub = self._subs.get(type_url)
        return dict(sub.held) if sub else {}

    def subscribed(self, type_url: str) -> frozenset[str]:
        sub = self._subs.get(type_url)
        return frozenset(sub.names) if sub else frozenset()

    def receive(self, request: Request, catalog: Catalog) -> Outcome:
        """Apply one request; the outcome carries the response to send, if any."""
        if not request.type_url:
            raise DeltaProtocolError("DeltaDiscoveryRequest without type_url")
        first = request.type_url not in self._subs
        sub = self._subs.setdefault(request.type_url, _Subscription())
        acked, nacked, unknown = self._settle(sub, request)
        forced = _subscribe(sub, request, catalog, first=first)
        response = None
        if first or request.subscribe:
            interest: Iterable[str] = itertools.chain(
                catalog.view() if sub.wildcard and (first or WILDCARD in request.subscribe) else (),
                catalog.implied() if first and not sub.wildcard else (),
                list(sub.held) if first else (),
                list(sub.names) if first else (),
                forced,
            )
            response = self._respond(request.type_url, sub, catalog, interest, forced, always=True)
        return Outcome(
            response=response,
            acked=acked,
            nacked=nacked,
            error=request.error or "",
            unknown_nonce=unknown,
        )

    def _settle(
        self, sub: _Subscription, request: Request
    ) -> tuple[tuple[Resource, ...], tuple[Resource, ...], bool]:
        """An ACK or NACK: (acknowledged, refused, whether the nonce was unknown)."""
        if not request.nonce:
            return (), (), False
        carried = sub.pending.pop(request.nonce, None)
        if carried is None:
            return (), (), True
        if request.error is None:
            sub.acked = True
            return tuple(s.resource for s in carried if s.resource is not None), (), False
        return (), self._nack(sub, carried, request.error), False

    def refresh(
        self, type_url: str, catalog: Catalog, changed: Iterable[str] | None = None
    ) -> Response | None:
        """After a store change: what to send for ``type_url`` (None: nothing changed for us).

        ``changed`` names the keys and aliases whose records may differ since the last call;
        None checks everything this stream covers (slower; for a changed view).
        """
        sub = self._subs.get(type_url)
        if sub is None:
            return None
        interest: Iterable[str]
        if changed is None:
            interest = itertools.chain(
                catalog.view() if sub.wildcard else (), list(sub.held), list(sub.names)
            )
        else:
            interest = changed
        return self._respond(type_url, sub, catalog, interest, set(), always=False)

    # -- internals -------------------------------------------------------------------------------

    def _nack(self, sub: _Subscription, carried: list[_Sent], error: str) -> tuple[Resource, ...]:
        """Roll back what the client refused; remember the refused versions."""
        named = {part.partition(": ")[0].strip() for part in error.split("; ")}
        refused = [s for s in carried if s.resource is not None and s.name in named]
        if not refused:  # the message names nothing we sent: count the whole response refused
            refused = [s for s in carried if s.resource is not None]
        for s in refused:
            assert s.resource is not None  # noqa: S101 (filtered above)
            sub.nacked[s.name] = s.resource.version
            if s.before is None:
                sub.held.pop(s.name, None)
            else:
                sub.held[s.name] = s.before
        return tuple(s.resource for s in refused if s.resource is not None)

    def _respond(
        self,
        type_url: str,
        sub: _Subscription,
        catalog: Catalog,
        interest: Iterable[str],
        forced: set[str],
        *,
        always: bool,
    ) -> Response | None:
        resources: dict[str, Resource] = {}
        removed: dict[str, None] = {}
        queue = list(interest)
        seen: set[str] = set()
        for name in queue:  # grows while it runs (a resource subscribed through its alias)
            if name in seen or name == WILDCARD:
                continue
            seen.add(name)
            wanted = name in sub.names or (
                catalog.in_view(name) if sub.wildcard else catalog.implies(name, sub.names)
            )
            found = catalog.resolve(name) if wanted else None
            have = sub.held.get(name)
            if found is None:
                if have is not None or name in forced:
                    removed[name] = None
                continue
            key, version = found
            if not sub.wildcard:
                queue.extend(_keep_on_demand(sub, catalog, name, key))
            if key != name and key not in sub.names:
                # Subscribed by alias: track the resource under its own name as well.
                sub.names.add(key)
                seen.discard(key)  # it may have been passed over before it was subscribed
                queue.append(key)
            if name in forced or (have != version and sub.nacked.get(name) != version):
                resources[name] = Resource(name=name, key=key, version=version)
        if not resources and not removed and not always:
            return None
        nonce = str(next(self._nonces))
        carried = []
        for name, resource in resources.items():
            carried.append(_Sent(resource=resource, name=name, before=sub.held.get(name)))
            sub.held[name] = resource.version
        for name in removed:
            carried.append(_Sent(resource=None, name=name, before=sub.held.pop(name, None)))
        sub.pending[nonce] = carried
        while len(sub.pending) > _MAX_PENDING:
            del sub.pending[next(iter(sub.pending))]
        return Response(
            type_url=type_url,
            nonce=nonce,
            resources=tuple(resources.values()),
            removed=tuple(removed),
        )
