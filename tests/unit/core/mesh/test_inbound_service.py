"""The Service an inbound connection is counted under: ztunnel's ``guess_inbound_service``.

The destination reporter names a Service only among those its workload backs: the one the
client's proxy claims (``forwarded: host=``), else the first whose target port is the port the
connection was delivered to, else none (``unknown``).
"""

from __future__ import annotations

import ipaddress

from meshctl.core.mesh.inbound_service import inbound_service
from meshctl.core.mesh.records import Service, Workload
from meshctl.core.mesh.store import Store

WEB = Service(name="web", namespace="prod", hostname="web.prod.svc.cluster.local", ports={80: 8080})
ADMIN = Service(
    name="admin", namespace="prod", hostname="admin.prod.svc.cluster.local", ports={80: 8080}
)
NAMED = Service(  # targetPort: http, resolved per pod
    name="named", namespace="prod", hostname="named.prod.svc.cluster.local", ports={443: 0}
)
SAME = Service(name="same", namespace="prod", hostname="same.prod.svc.cluster.local", ports={81: 0})
ELSEWHERE = Service(
    name="other", namespace="dev", hostname="other.dev.svc.cluster.local", ports={80: 8080}
)


def pod(*services: tuple[Service, dict[int, int]]) -> Workload:
    return Workload(
        uid="Kubernetes//Pod/prod/server",
        name="server",
        namespace="prod",
        workload_ips=(ipaddress.ip_address("10.0.0.11"),),
        services={svc.key: ports for svc, ports in services},
    )


def store_with(server: Workload) -> Store:
    return Store.build([server], [WEB, ADMIN, NAMED, SAME, ELSEWHERE])


def test_the_service_the_client_proxy_claims_wins_among_the_workloads_own():
    server = pod((WEB, {80: 8080}), (ADMIN, {80: 8080}))
    got = inbound_service(store_with(server), server, 8080, "admin.prod.svc.cluster.local")
    assert got is ADMIN


def test_a_claimed_service_the_workload_does_not_back_is_ignored_and_the_port_decides():
    server = pod((WEB, {80: 8080}))
    store = store_with(server)
    assert inbound_service(store, server, 8080, "other.dev.svc.cluster.local") is WEB
    assert inbound_service(store, server, 9999, "other.dev.svc.cluster.local") is None


def test_without_a_claim_the_first_service_targeting_the_port_is_named():
    server = pod((ADMIN, {80: 8080}), (WEB, {80: 8080}))
    assert inbound_service(store_with(server), server, 8080) is ADMIN


def test_a_named_target_port_matches_through_the_workloads_own_port_map():
    server = pod((NAMED, {443: 8443}))
    store = store_with(server)
    assert inbound_service(store, server, 8443) is NAMED
    assert inbound_service(store, server, 443) is None


def test_target_port_zero_means_the_service_port_as_the_outbound_routes_it():
    server = pod((SAME, {}))
    assert inbound_service(store_with(server), server, 81) is SAME


def test_unknown_when_no_service_targets_the_port_or_the_workload_backs_none():
    server = pod((WEB, {80: 8080}))
    store = store_with(server)
    assert inbound_service(store, server, 9090) is None
    assert inbound_service(store, server, 80) is None  # the service port is not a target port
    bare = pod()
    assert inbound_service(store_with(bare), bare, 8080, "web.prod.svc.cluster.local") is None
    assert inbound_service(store, None, 8080, "web.prod.svc.cluster.local") is None


def test_a_service_key_missing_from_the_store_is_skipped():
    server = pod((WEB, {80: 8080}), (ADMIN, {80: 8080}))
    store = Store.build([server], [ADMIN])  # WEB's record not (yet) received
    assert inbound_service(store, server, 8080, "web.prod.svc.cluster.local") is ADMIN
