"""What each proxy may see of the store, under Istio's workload-discovery names."""

from __future__ import annotations

import ipaddress

from meshctl.core.mesh.records import Action, Kind, Policy, Scope, Service, Workload
from meshctl.core.mesh.store import Store, Update
from meshctl.core.xds.resources import (
    ADDRESS_TYPE,
    AUTHORIZATION_TYPE,
    AddressCatalog,
    PolicyCatalog,
    ProxyScope,
    changed_names,
    policy_view,
    touches,
)


def wl(name, ns, ip, node, policies=()):
    return Workload(
        uid=f"c//Pod/{ns}/{name}",
        name=name,
        namespace=ns,
        workload_ips=(ipaddress.ip_address(ip),),
        node=node,
        authorization_policies=policies,
    )


def pol(name, ns, scope):
    return Policy(name=name, namespace=ns, scope=scope, action=Action.ALLOW, rules=())


STORE = Store.build(
    [wl("a", "prod", "10.0.0.1", "n1", ("prod/sel",)), wl("b", "dev", "10.0.0.2", "n2")],
    [
        Service(
            name="s",
            namespace="prod",
            hostname="s.prod.svc.cluster.local",
            vips=(("", ipaddress.ip_address("10.96.0.1")),),
        )
    ],
    [
        pol("g", "root", Scope.GLOBAL),
        pol("ns", "prod", Scope.NAMESPACE),
        pol("devns", "dev", Scope.NAMESPACE),
        pol("sel", "prod", Scope.WORKLOAD_SELECTOR),
        pol("other", "prod", Scope.WORKLOAD_SELECTOR),
    ],
)


def test_addresses_resolve_by_name_and_by_network_ip():
    catalog = AddressCatalog(STORE)
    uid = "c//Pod/prod/a"
    assert catalog.resolve(uid) == (uid, STORE.version(Kind.WORKLOAD, uid))
    assert catalog.resolve("/10.0.0.1") == (uid, STORE.version(Kind.WORKLOAD, uid))
    key = "prod/s.prod.svc.cluster.local"
    assert catalog.resolve("/10.96.0.1") == (key, STORE.version(Kind.SERVICE, key))
    assert catalog.resolve(key)[0] == key
    assert catalog.resolve("/10.9.9.9") is None
    assert catalog.resolve("net2/10.0.0.1") is None
    assert sorted(catalog.view()) == ["c//Pod/dev/b", "c//Pod/prod/a", key]


def test_a_node_proxy_sees_its_workloads_policies_only():
    assert policy_view(STORE, ProxyScope(node="n1")) == {"root/g", "prod/ns", "prod/sel"}
    assert policy_view(STORE, ProxyScope(node="n2")) == {"root/g", "dev/devns"}
    assert policy_view(STORE, ProxyScope(workloads=frozenset({"c//Pod/dev/b"}))) == {
        "root/g",
        "dev/devns",
    }
    assert policy_view(STORE, ProxyScope(node="empty")) == {"root/g"}
    assert len(policy_view(STORE, ProxyScope(everything=True))) == 5
    catalog = PolicyCatalog(STORE, policy_view(STORE, ProxyScope(node="n2")))
    assert catalog.resolve("prod/sel") is not None  # asked by name: it exists
    assert not catalog.in_view("prod/sel")


def test_changed_names_cover_old_and_new_addresses():
    moved = wl("a", "prod", "10.0.0.9", "n1", ("prod/sel",))
    updates = [
        Update(kind=Kind.WORKLOAD, key=moved.uid, record=moved),
        Update(kind=Kind.POLICY, key="prod/ns"),
    ]
    new = STORE.apply(updates)
    changed = changed_names(STORE, new, updates)
    assert changed[ADDRESS_TYPE] == {moved.uid, "/10.0.0.1", "/10.0.0.9"}
    assert changed[AUTHORIZATION_TYPE] == {"prod/ns"}
    assert touches(ProxyScope(node="n2"), STORE, new, updates)  # a policy changed
    only_workload = updates[:1]
    assert touches(ProxyScope(node="n1"), STORE, new, only_workload)
    assert not touches(ProxyScope(node="n2"), STORE, new, only_workload)
