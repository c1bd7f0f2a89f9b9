"""Kubernetes objects -> store records, as Istio's control plane builds them for ztunnel."""

from __future__ import annotations

import contextlib
import copy
import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshctl.core.k8s.cluster.index import ClusterIndex, Resource
from meshctl.core.k8s.cluster.objects import ObjectError
from meshctl.core.k8s.cluster.pods import build_workload, read_pod
from meshctl.core.k8s.cluster.policies import read_policy
from meshctl.core.k8s.cluster.services import build_service, ports_for_pod, read_service
from meshctl.core.k8s.cluster.settings import ClusterSettings
from meshctl.core.mesh.authz import ConnectionFacts, evaluate
from meshctl.core.mesh.records import Action, Kind, Protocol, Scope
from meshctl.core.pki.identity import SpiffeId

SETTINGS = ClusterSettings(cluster_id="c1", trust_domain="td.local", root_namespace="mesh-root")


def pod(name="web-5d8f7-abcde", ns="prod", ip="10.1.0.5", **extra):
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "generateName": "web-5d8f7-",
            "labels": {"app": "web", "version": "v2", "pod-template-hash": "5d8f7"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-5d8f7",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "serviceAccountName": "web-sa",
            "nodeName": "node-a",
            "containers": [
                {"name": "app", "ports": [{"name": "http", "containerPort": 8080}]},
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    for path, value in extra.items():
        *parents, leaf = path.split("__")
        at = obj
        for p in parents:
            at = at.setdefault(p, {})
        at[leaf] = value
    return obj


def workload(obj, ns_labels=None, services=None, policies=()):
    return build_workload(
        read_pod(obj),
        settings=SETTINGS,
        namespace_labels=ns_labels or {},
        services=services or {},
        policies=policies,
    )


def test_a_deployment_pod_becomes_istios_workload():
    w = workload(pod())
    assert w is not None
    assert w.uid == "c1//Pod/prod/web-5d8f7-abcde"
    assert (w.name, w.namespace, w.service_account, w.node) == (
        "web-5d8f7-abcde",
        "prod",
        "web-sa",
        "node-a",
    )
    assert w.workload_ips == (ipaddress.ip_address("10.1.0.5"),)
    assert (w.workload_name, w.workload_type) == ("web", "deployment")
    assert (w.canonical_name, w.canonical_revision) == ("web", "v2")
    assert (w.trust_domain, w.cluster_id) == ("td.local", "c1")
    assert w.protocol is Protocol.TCP  # not meshed
    assert w.healthy
    assert str(w.identity) == "spiffe://td.local/ns/prod/sa/web-sa"


def test_dual_stack_pods_keep_every_ip():
    obj = pod(status__podIPs=[{"ip": "10.1.0.5"}, {"ip": "fd00::5"}])
    assert [str(ip) for ip in workload(obj).workload_ips] == ["10.1.0.5", "fd00::5"]


@pytest.mark.parametrize(
    ("owner", "generate", "expected"),
    [
        ({"kind": "Job", "name": "backup-29000123"}, "x-", ("backup", "cronjob")),
        ({"kind": "Job", "name": "migrate"}, "x-", ("migrate", "job")),
        ({"kind": "StatefulSet", "name": "db"}, "x-", ("web-5d8f7-abcde", "pod")),
        ({"kind": "ReplicaSet", "name": "web-5d8f7"}, "", ("web-5d8f7-abcde", "pod")),
    ],
)
def test_workload_name_and_type_follow_istios_owner_heuristic(owner, generate, expected):
    obj = pod()
    obj["metadata"]["ownerReferences"] = [{**owner, "apiVersion": "x", "controller": True}]
    obj["metadata"]["generateName"] = generate
    w = workload(obj)
    assert (w.workload_name, w.workload_type) == expected


@pytest.mark.parametrize(
    ("labels", "annotations", "ns_labels", "expected"),
    [
        ({}, {"sidecar.istio.io/status": "{}"}, {}, (Protocol.HBONE, True)),
        ({"networking.istio.io/tunnel": "http"}, {}, {}, (Protocol.HBONE, True)),
        ({}, {"ambient.istio.io/redirection": "enabled"}, {}, (Protocol.HBONE, False)),
        ({}, {}, {"istio.io/dataplane-mode": "ambient"}, (Protocol.HBONE, False)),
        (
            {"istio.io/dataplane-mode": "none"},
            {},
            {"istio.io/dataplane-mode": "ambient"},
            (Protocol.TCP, False),
        ),
        ({"istio.io/dataplane-mode": "ambient"}, {}, {}, (Protocol.HBONE, False)),
        ({}, {}, {}, (Protocol.TCP, False)),
    ],
)
def test_hbone_when_meshed(labels, annotations, ns_labels, expected):
    obj = pod()
    obj["metadata"]["labels"].update(labels)
    obj["metadata"]["annotations"] = annotations
    w = workload(obj, ns_labels)
    assert (w.protocol, w.extra.get("nativeTunnel", False)) == expected


def test_health_follows_readiness_and_deletion():
    assert not workload(pod(status__conditions=[{"type": "Ready", "status": "False"}])).healthy
    assert not workload(pod(metadata__deletionTimestamp="2026-01-01T00:00:00Z")).healthy


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_terminal_pods_and_pods_without_ip_are_no_workload(phase):
    assert workload(pod(status__phase=phase)) is None
    no_ip = pod()
    del no_ip["status"]["podIP"], no_ip["status"]["podIPs"]
    assert workload(no_ip) is None


def test_host_network_pods_are_marked_and_never_hbone():
    obj = pod(spec__hostNetwork=True)
    obj["metadata"]["annotations"] = {"ambient.istio.io/redirection": "enabled"}
    w = workload(obj)
    assert w.extra["networkMode"] == "HostNetwork"
    assert w.protocol is Protocol.TCP


def service(name="web", ns="prod", **spec):
    body = {
        "selector": {"app": "web"},
        "clusterIP": "10.96.0.20",
        "clusterIPs": ["10.96.0.20", "fd00:96::20"],
        "ports": [
            {"name": "http", "port": 80, "targetPort": "http"},
            {"name": "admin", "port": 9000, "targetPort": 9001},
            {"name": "grpc", "port": 7000, "targetPort": "grpc"},
        ],
        **spec,
    }
    return {"metadata": {"name": name, "namespace": ns}, "spec": body}


def test_a_service_becomes_istios_service_with_named_targets_left_per_pod():
    facts = read_service(service())
    s = build_service(facts, SETTINGS)
    assert s.key == "prod/web.prod.svc.cluster.local"
    assert [str(ip) for _, ip in s.vips] == ["10.96.0.20", "fd00:96::20"]
    assert dict(s.ports) == {80: 0, 9000: 9001, 7000: 0}
    # Per pod: "http" resolves in the container ports; the pod has no "grpc" port: left out.
    assert ports_for_pod(facts, read_pod(pod())) == {80: 8080, 9000: 9001}


def test_headless_and_external_name_services():
    headless = build_service(read_service(service(clusterIP="None", clusterIPs=["None"])), SETTINGS)
    assert headless.vips == ()
    assert build_service(read_service(service(type="ExternalName")), SETTINGS) is None


def test_load_balancer_ingress_ips_are_vips():
    obj = service()
    obj["status"] = {"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}, {"hostname": "lb"}]}}
    vips = [str(ip) for _, ip in build_service(read_service(obj), SETTINGS).vips]
    assert vips == ["10.96.0.20", "fd00:96::20", "192.0.2.7"]


def policy(spec, name="p", ns="prod", annotations=None):
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations or {}},
        "spec": spec,
    }


def test_policy_scope_follows_selector_and_root_namespace():
    read = lambda obj: read_policy(obj, root_namespace="mesh-root").policy  # noqa: E731
    assert read(policy({})).scope is Scope.NAMESPACE
    assert read(policy({}, ns="mesh-root")).scope is Scope.GLOBAL
    assert (
        read(policy({"selector": {"matchLabels": {"app": "web"}}})).scope is Scope.WORKLOAD_SELECTOR
    )


CLIENT = SpiffeId("cluster.local", "other", "client")


def allowed(obj, *, src=CLIENT, ip="10.2.0.1", port=8080):
    p = read_policy(obj, root_namespace="mesh-root").policy
    return evaluate([p], ConnectionFacts.of(src, ip, "10.1.0.5", port)).allowed


def test_l4_rules_convert_with_istios_semantics():
    spec = {
        "action": "ALLOW",
        "rules": [
            {
                "from": [{"source": {"namespaces": ["other"], "notIpBlocks": ["10.2.0.0/24"]}}],
                "to": [{"operation": {"ports": ["8080"]}}],
            },
            {"from": [{"source": {"principals": ["cluster.local/ns/admin/*"]}}]},
        ],
    }
    assert not allowed(policy(spec))  # first rule: 10.2.0.1 is a denied block
    assert allowed(policy(spec), ip="10.3.0.1")
    assert not allowed(policy(spec), ip="10.3.0.1", port=9090)
    assert allowed(policy(spec), src=SpiffeId("cluster.local", "admin", "x"), port=1)
    assert not allowed(policy(spec), src=None, ip="10.3.0.1")  # no identity, no namespace


def test_empty_rule_allows_all_and_no_rules_allow_nothing():
    assert allowed(policy({"rules": [{}]}))
    assert not allowed(policy({}))
    assert allowed(policy({"action": "DENY"}))  # a DENY without rules denies nothing


def test_single_ip_blocks_and_when_conditions():
    spec = {
        "action": "DENY",
        "rules": [
            {
                "when": [
                    {"key": "source.ip", "values": ["10.2.0.1"]},
                    {"key": "destination.port", "notValues": ["9090"]},
                ]
            }
        ],
    }
    p = read_policy(policy(spec), root_namespace="r").policy
    assert p.rules[0][0][0].source_ips == (ipaddress.ip_network("10.2.0.1/32"),)
    assert not allowed(policy(spec))
    assert allowed(policy(spec), port=9090)


def test_http_attributes_make_an_allow_rule_match_nothing_and_a_deny_rule_match_more():
    http_allow = {"rules": [{"to": [{"operation": {"ports": ["8080"], "methods": ["GET"]}}]}]}
    facts = read_policy(policy(http_allow), root_namespace="r")
    assert facts.policy.rules == ()
    assert "methods" in facts.warnings[0]
    assert not allowed(policy(http_allow))
    http_deny = {
        "action": "DENY",
        "rules": [{"to": [{"operation": {"ports": ["8080"], "paths": ["/x"]}}]}],
    }
    assert not allowed(policy(http_deny))  # enforced on the port alone
    assert allowed(policy(http_deny), port=1)


def test_invalid_values_never_loosen_a_policy():
    bad_allow = {"rules": [{"from": [{"source": {"ipBlocks": ["10.2.0.0/33"]}}]}]}
    facts = read_policy(policy(bad_allow), root_namespace="r")
    assert "not an IP address" in facts.warnings[0]
    assert not allowed(policy(bad_allow))
    bad_deny = {"action": "DENY", "rules": [{"to": [{"operation": {"ports": ["http"]}}]}]}
    assert not allowed(policy(bad_deny))


def test_policies_ztunnel_does_not_enforce_are_none():
    waypoint = read_policy(
        policy({"targetRefs": [{"kind": "Service", "name": "x"}]}), root_namespace="r"
    )
    assert waypoint.policy is None
    audit = read_policy(policy({"action": "AUDIT"}), root_namespace="r")
    assert audit.policy is None
    assert "AUDIT" in audit.warnings[0]


def test_dry_run_annotation_and_service_accounts():
    obj = policy(
        {
            "action": "DENY",
            "rules": [{"from": [{"source": {"serviceAccounts": ["client", "x/y"]}}]}],
        },
        annotations={"istio.io/dry-run": "true"},
    )
    p = read_policy(obj, root_namespace="r").policy
    assert p.dry_run
    assert p.action is Action.DENY
    assert p.rules[0][0][0].service_accounts == (("prod", "client"), ("x", "y"))


# -- the index: object changes -> store updates -------------------------------------------------


def keys(updates):
    return [(u.kind, u.key, u.record is None) for u in updates]


def test_a_pod_change_updates_only_its_workload():
    index = ClusterIndex(SETTINGS)
    index.upsert(Resource.POD, pod("a", ip="10.1.0.1"))
    index.upsert(Resource.POD, pod("b", ip="10.1.0.2"))
    moved = index.upsert(Resource.POD, pod("a", ip="10.1.0.9"))
    assert keys(moved) == [(Kind.WORKLOAD, "c1//Pod/prod/a", False)]
    assert moved[0].record.workload_ips == (ipaddress.ip_address("10.1.0.9"),)
    assert index.upsert(Resource.POD, pod("a", ip="10.1.0.9")) == []  # no change, no update
    assert keys(index.delete(Resource.POD, "prod", "a")) == [
        (Kind.WORKLOAD, "c1//Pod/prod/a", True)
    ]
    assert index.delete(Resource.POD, "prod", "a") == []


def test_a_service_joins_the_workloads_it_selects():
    index = ClusterIndex(SETTINGS)
    index.upsert(Resource.POD, pod("a"))
    other = pod("b", ip="10.1.0.2")
    other["metadata"]["labels"] = {"app": "db"}
    index.upsert(Resource.POD, other)
    updates = index.upsert(Resource.SERVICE, service())
    assert keys(updates) == [
        (Kind.SERVICE, "prod/web.prod.svc.cluster.local", False),
        (Kind.WORKLOAD, "c1//Pod/prod/a", False),
    ]
    assert updates[1].record.services == {"prod/web.prod.svc.cluster.local": {80: 8080, 9000: 9001}}
    gone = index.delete(Resource.SERVICE, "prod", "web")
    assert keys(gone) == [
        (Kind.SERVICE, "prod/web.prod.svc.cluster.local", True),
        (Kind.WORKLOAD, "c1//Pod/prod/a", False),
    ]
    assert gone[1].record.services == {}


def test_a_service_without_selector_takes_its_endpoint_slices_pods():
    index = ClusterIndex(SETTINGS)
    index.upsert(Resource.POD, pod("a"))
    svc = service(selector=None)
    del svc["spec"]["selector"]
    index.upsert(Resource.SERVICE, svc)
    endpoint_slice = {
        "metadata": {
            "name": "web-x1",
            "namespace": "prod",
            "labels": {"kubernetes.io/service-name": "web"},
        },
        "endpoints": [{"addresses": ["10.1.0.5"], "targetRef": {"kind": "Pod", "name": "a"}}],
        "ports": [{"name": "http", "port": 8081}, {"name": "admin", "port": 9001}],
    }
    updates = index.upsert(Resource.ENDPOINT_SLICE, endpoint_slice)
    assert keys(updates) == [(Kind.WORKLOAD, "c1//Pod/prod/a", False)]
    assert updates[0].record.services["prod/web.prod.svc.cluster.local"] == {80: 8081, 9000: 9001}
    assert keys(index.delete(Resource.ENDPOINT_SLICE, "prod", "web-x1")) == [
        (Kind.WORKLOAD, "c1//Pod/prod/a", False)
    ]


def test_selector_policies_are_listed_on_the_workloads_they_pick():
    index = ClusterIndex(SETTINGS)
    index.upsert(Resource.POD, pod("a"))
    selected = policy({"selector": {"matchLabels": {"app": "web"}}, "rules": [{}]}, name="only-web")
    updates = index.upsert(Resource.AUTHORIZATION_POLICY, selected)
    assert keys(updates) == [
        (Kind.POLICY, "prod/only-web", False),
        (Kind.WORKLOAD, "c1//Pod/prod/a", False),
    ]
    assert updates[1].record.authorization_policies == ("prod/only-web",)
    # A mesh-wide selector policy in the root namespace picks pods everywhere.
    root = policy({"selector": {"matchLabels": {"app": "web"}}}, name="r", ns="mesh-root")
    updates = index.upsert(Resource.AUTHORIZATION_POLICY, root)
    assert updates[1].record.authorization_policies == ("mesh-root/r", "prod/only-web")
    # A namespace policy changes no workload.
    assert keys(index.upsert(Resource.AUTHORIZATION_POLICY, policy({}, name="ns-wide"))) == [
        (Kind.POLICY, "prod/ns-wide", False)
    ]


def test_namespace_labels_enrol_its_pods():
    index = ClusterIndex(SETTINGS)
    index.upsert(Resource.POD, pod("a"))
    ns = {"metadata": {"name": "prod", "labels": {"istio.io/dataplane-mode": "ambient"}}}
    updates = index.upsert(Resource.NAMESPACE, ns)
    assert updates[0].record.protocol is Protocol.HBONE
    assert index.upsert(Resource.NAMESPACE, ns) == []
    assert index.delete(Resource.NAMESPACE, "", "prod")[0].record.protocol is Protocol.TCP


def test_replace_after_a_relist_returns_the_difference():
    index = ClusterIndex(SETTINGS)
    index.upsert(Resource.POD, pod("a"))
    index.upsert(Resource.POD, pod("b", ip="10.1.0.2"))
    updates, problems = index.replace(
        Resource.POD, [pod("b", ip="10.1.0.2"), pod("c", ip="10.1.0.3"), {"metadata": {}}]
    )
    assert sorted(keys(updates)) == [
        (Kind.WORKLOAD, "c1//Pod/prod/a", True),
        (Kind.WORKLOAD, "c1//Pod/prod/c", False),
    ]
    assert problems == ["Pod without metadata.namespace and metadata.name"]


def test_a_malformed_object_leaves_the_index_as_it_was():
    index = ClusterIndex(SETTINGS)
    index.upsert(Resource.POD, pod("a"))
    broken = copy.deepcopy(pod("a"))
    broken["status"]["podIPs"] = [{"ip": "not-an-ip"}]
    with pytest.raises(ObjectError, match="not an IP address"):
        index.upsert(Resource.POD, broken)
    assert index.upsert(Resource.POD, pod("a")) == []


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "metadata",
                    "spec",
                    "status",
                    "name",
                    "namespace",
                    "labels",
                    "ports",
                    "rules",
                    "from",
                    "to",
                    "source",
                    "operation",
                    "podIPs",
                    "ip",
                    "selector",
                    "matchLabels",
                    "containers",
                    "port",
                    "targetPort",
                    "endpoints",
                    "targetRef",
                    "kind",
                ]
            ),
            c,
            max_size=4,
        )
    ),
    max_leaves=15,
)


@settings(deadline=None)  # a loaded CI machine is slow, not wrong
@given(JSON, st.sampled_from(list(Resource)))
def test_arbitrary_objects_are_read_or_refused_with_an_object_error(obj, resource):
    index = ClusterIndex(SETTINGS)
    with contextlib.suppress(ObjectError):
        index.upsert(resource, obj)


def test_a_pods_services_are_found_through_its_labels_not_by_trying_every_service(monkeypatch):
    import meshctl.core.k8s.cluster.index as index_module

    index = ClusterIndex(SETTINGS)
    for n in range(300):  # one namespace with many services, as at cluster scale
        index.upsert(Resource.SERVICE, service(f"s{n}", selector={"app": f"app-{n}"}))
    index.upsert(Resource.SERVICE, service("two-labels", selector={"app": "web", "version": "v2"}))
    v1 = {"app": "web", "version": "v1"}
    index.upsert(Resource.SERVICE, service("other-version", selector=v1))
    tried = []
    real = index_module.selects
    monkeypatch.setattr(index_module, "selects", lambda svc, p: tried.append(svc) or real(svc, p))
    (update,) = index.upsert(Resource.POD, pod("a"))
    assert set(update.record.services) == {"prod/two-labels.prod.svc.cluster.local"}
    assert len(tried) <= 2  # the services sharing one of its label pairs, not all 302
    # Moving a service's selector off the pod removes it; back on, it returns.
    index.upsert(Resource.SERVICE, service("two-labels", selector={"app": "web", "version": "v3"}))
    assert index.upsert(Resource.POD, pod("a")) == []
    assert index._build(read_pod(pod("a"))).services == {}
    joined = index.upsert(Resource.SERVICE, service("other-version", selector={"app": "web"}))
    assert any(u.key == "c1//Pod/prod/a" and u.record.services for u in joined)
