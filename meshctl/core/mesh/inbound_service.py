"""Which Service an inbound connection is counted under (the destination reporter's
``destination_service*`` labels and ``dst.service``).

Owns Istio ztunnel's rule for it (``guess_inbound_service`` in its ``src/proxy.rs``): only a
Service the destination workload backs can be named; the hostname the client's proxy claims
(HBONE's ``forwarded: ...;host=``) picks one, else the first whose target port is the port the
connection was delivered to, else none (reported ``unknown``). Invariant: pure, and a claimed
hostname the workload does not back is ignored, never reported.
"""

from __future__ import annotations

from meshctl.core.mesh.records import Service, Workload
from meshctl.core.mesh.store import Store


def inbound_service(
    store: Store, workload: Workload | None, port: int, claimed_host: str | None = None
) -> Service | None:
    """The Service of ``workload`` a connection delivered to its ``port`` was for, or None.

    Candidates are the services ``workload`` backs, in the order of its ``services``. The one
    whose hostname is ``claimed_host`` wins; otherwise the first with a service port that maps to
    ``port``, by the service's target port or by the workload's own (a named port resolved per
    pod). Where neither gives one (target port 0) the store routes to the service port itself
    (``Store.endpoints``), so that port matches: ztunnel has no such value, and our outbound
    would have delivered the connection there. None when nothing matches, as ztunnel reports
    it: a plaintext connection to a port no service targets, or a pod that backs no service.
    """
    if workload is None or not workload.services:
        return None
    candidates = [
        (svc, own_ports)
        for key, own_ports in workload.services.items()
        if (svc := store.service_by_key(key)) is not None
    ]
    if claimed_host:
        for svc, _ in candidates:
            if svc.hostname == claimed_host:
                return svc
    for svc, own_ports in candidates:
        for service_port, target in svc.ports.items():
            own = own_ports.get(service_port)
            delivered = own if own is not None else target  # as Store.endpoints routes it
            if port in (target, delivered or service_port):
                return svc
    return None
