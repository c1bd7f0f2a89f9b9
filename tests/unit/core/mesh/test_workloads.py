"""The workload store: parsing ztunnel's local config strictly, and the data plane's lookups."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from meshctl.core.mesh.localconfig import local_config_warnings, parse_local_config
from meshctl.core.mesh.records import Action, LocalConfigError, Protocol, Scope
from meshctl.core.mesh.store import NoHealthyEndpointError

DOC = yaml.safe_load((Path(__file__).parents[3] / "testdata/ztunnel/local-config.yaml").read_text())


def store():
    return parse_local_config(DOC)


def test_local_config_parses_workloads_services_and_policies():
    s = store()
    server = s.workload_by_ip("10.0.0.11")
    assert server is not None
    assert server.protocol is Protocol.HBONE
    assert str(server.identity) == "spiffe://cluster.local/ns/prod/sa/server"
    assert s.workload_by_ip("fd00::11") is server
    assert s.workload_by_ip("10.0.0.99") is None
    assert s.service_by_vip("10.96.0.10").hostname == "echo.prod.svc.cluster.local"
    deny = s.policies[0]
    assert (deny.action, deny.scope, deny.rules[0][0][0].destination_ports) == (
        Action.DENY,
        Scope.NAMESPACE,
        (9999,),
    )


def test_vip_resolves_to_a_healthy_endpoint_and_its_target_port():
    s = store()
    picked = s.resolve("10.96.0.10", 80)
    assert (picked.kind, picked.addr, picked.hbone_addr) == (
        "hbone",
        ("10.0.0.11", 8080),
        ("10.0.0.11", 15008),
    )
    assert picked.service is not None
    candidates = s.endpoints(picked.service, 80)
    # The unhealthy endpoint is never a candidate; the TCP one uses its own target port.
    assert sorted((w.name, port) for w, port in candidates) == [("legacy", 9090), ("server", 8080)]
    legacy = s.resolve("10.96.0.10", 80, pick=lambda c: c[-1])
    assert (legacy.kind, legacy.addr) == ("tcp", ("10.0.0.12", 9090))


def test_vip_on_an_unknown_port_has_no_endpoint():
    with pytest.raises(NoHealthyEndpointError, match="no port 81"):
        store().resolve("10.96.0.10", 81)


def test_workload_ip_and_unknown_ip_routing():
    s = store()
    assert s.resolve("10.0.0.11", 8080).kind == "hbone"
    assert s.resolve("10.0.0.12", 22).kind == "tcp"
    unknown = s.resolve("192.0.2.1", 443)
    assert (unknown.kind, unknown.addr, unknown.workload) == (
        "passthrough",
        ("192.0.2.1", 443),
        None,
    )


def test_policies_for_a_workload_are_namespace_global_and_referenced():
    s = store()
    server = s.find_workload("prod", "server")
    legacy = s.find_workload("prod", "legacy")
    client = s.find_workload("default", "client")
    assert [p.name for p in s.policies_for(server)] == ["deny-9999", "allow-default"]
    assert [p.name for p in s.policies_for(legacy)] == ["deny-9999"]
    assert s.policies_for(client) == []


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d["workloads"][1].update(workloadIP=["1.2.3.4"]), "workloads[1].workloadIP"),
        (lambda d: d["workloads"][0]["workloadIps"].append("1.2.3"), "workloads[0].workloadIps[1]"),
        (lambda d: d["workloads"][0].update(protocol="HTTP"), "workloads[0].protocol"),
        (lambda d: d["services"][0].update(ports={80: "http"}), "services[0].ports[80]"),
        (
            lambda d: d["policies"][0]["rules"][0][0][0].update(destinationPort=[1]),
            "policies[0].rules[0][0][0].destinationPort",
        ),
        (lambda d: d.update(extra=1), "extra"),
        (lambda d: d["workloads"][0].pop("uid"), "workloads[0].uid"),
    ],
)
def test_invalid_fields_are_refused_with_their_path(mutate, path):
    import copy

    doc = copy.deepcopy(DOC)
    mutate(doc)
    with pytest.raises(LocalConfigError) as info:
        parse_local_config(doc)
    assert info.value.path == path


def test_duplicate_workload_ips_are_refused():
    doc = {
        "workloads": [
            {
                "uid": "a",
                "name": "a",
                "namespace": "x",
                "workloadIps": ["10.1.1.1"],
                "services": {},
            },
            {
                "uid": "b",
                "name": "b",
                "namespace": "x",
                "workloadIps": ["10.1.1.1"],
                "services": {},
            },
        ]
    }
    with pytest.raises(LocalConfigError, match="two workloads"):
        parse_local_config(doc)


def test_empty_document_is_an_empty_store():
    assert parse_local_config(None).workloads == ()


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
        max_leaves=10,
    )
)
def test_arbitrary_documents_either_parse_or_fail_with_local_config_error(doc):
    problem = None
    try:
        parse_local_config({"workloads": [doc]})
    except LocalConfigError as exc:
        problem = exc
    if problem is not None:
        assert problem.path.startswith("workloads[0]")


# -- what ztunnel's own reader does (src/xds.rs LocalWorkload, src/state/{workload,service}.rs) --


@pytest.mark.parametrize(
    ("mutate", "path", "hint"),
    [
        (lambda d: d["workloads"][0].pop("services"), "workloads[0].services", "services: {}"),
        (lambda d: d["workloads"][0].pop("workloadIps"), "workloads[0].workloadIps", "[]"),
        (lambda d: d["services"][0].pop("vips"), "services[0].vips", "vips: []"),
        (lambda d: d["services"][0].pop("ports"), "services[0].ports", "ports: {}"),
        (lambda d: d["services"][0].update(vips=["10.96.0.10"]), "services[0].vips[0]", "/10.96"),
    ],
)
def test_fields_ztunnel_requires_are_required_with_the_fix_in_the_message(mutate, path, hint):
    import copy

    doc = copy.deepcopy(DOC)
    mutate(doc)
    with pytest.raises(LocalConfigError) as info:
        parse_local_config(doc)
    assert info.value.path == path
    assert hint in str(info.value)


def test_a_file_ztunnel_reads_the_same_way_has_no_warnings():
    assert local_config_warnings(DOC) == []


def test_fields_ztunnel_defaults_to_empty_are_named_with_both_readings():
    doc = {
        "workloads": [
            {"uid": "a", "name": "a", "namespace": "x", "workloadIps": [], "services": {}},
        ]
    }
    parse_local_config(doc)  # accepted, but read differently by ztunnel:
    warnings = local_config_warnings(doc)
    assert [w.split(":")[0] for w in warnings] == [
        "workloads[0].trustDomain",
        "workloads[0].serviceAccount",
        "workloads[0].clusterId",
    ]
    assert "ztunnel reads that as empty, meshctl as 'cluster.local'" in warnings[0]
    assert warnings[0].endswith("write trustDomain: cluster.local")


# -- the store receives updates ---------------------------------------------------------------


def _w(uid, ip, **kw):
    from meshctl.core.mesh.records import Workload

    return Workload(uid=uid, name=uid, namespace="ns", workload_ips=(ip_address(ip),), **kw)


def ip_address(text):
    import ipaddress

    return ipaddress.ip_address(text)


def test_apply_returns_a_new_snapshot_and_leaves_the_old_one_alone():
    from meshctl.core.mesh.records import Kind
    from meshctl.core.mesh.store import Update

    before = store()
    after = before.apply(
        [Update(kind=Kind.WORKLOAD, key="Kubernetes//Pod/default/client", record=None)]
    )
    assert before.workload_by_ip("10.0.0.10") is not None
    assert after.workload_by_ip("10.0.0.10") is None
    assert after.generation == before.generation + 1
    assert after.version(Kind.WORKLOAD, "Kubernetes//Pod/default/client") is None
    assert before.version(Kind.WORKLOAD, "Kubernetes//Pod/default/client")


def test_a_changed_ip_moves_the_index_and_the_version():
    from meshctl.core.mesh.records import Kind
    from meshctl.core.mesh.store import Store, Update

    s1 = Store().apply([Update(kind=Kind.WORKLOAD, key="a", record=_w("a", "10.1.0.1"))])
    s2 = s1.apply([Update(kind=Kind.WORKLOAD, key="a", record=_w("a", "10.1.0.2"))])
    assert s2.workload_by_ip("10.1.0.1") is None
    assert s2.workload_by_uid("a") is s2.workload_by_ip("10.1.0.2")
    assert s1.version(Kind.WORKLOAD, "a") != s2.version(Kind.WORKLOAD, "a")
    # Re-applying equal content keeps the version (derived from content, not from time).
    s3 = s2.apply([Update(kind=Kind.WORKLOAD, key="a", record=_w("a", "10.1.0.2"))])
    assert s3.version(Kind.WORKLOAD, "a") == s2.version(Kind.WORKLOAD, "a")
    # A source's own version is kept as given.
    s4 = s3.apply([Update(kind=Kind.WORKLOAD, key="a", record=_w("a", "10.1.0.2"), version="7")])
    assert s4.version(Kind.WORKLOAD, "a") == "7"


def test_two_workloads_briefly_sharing_an_ip_hand_over_the_lookup():
    from meshctl.core.mesh.records import Kind
    from meshctl.core.mesh.store import Store, Update

    old, new = _w("old", "10.1.0.9"), _w("new", "10.1.0.9")
    s = Store().apply(
        [
            Update(kind=Kind.WORKLOAD, key="old", record=old),
            Update(kind=Kind.WORKLOAD, key="new", record=new),
        ]
    )
    assert s.workload_by_ip("10.1.0.9") is new
    s = s.apply([Update(kind=Kind.WORKLOAD, key="new", record=None)])
    assert s.workload_by_ip("10.1.0.9") is old


def test_host_network_workloads_are_not_found_by_ip():
    from meshctl.core.mesh.records import Kind
    from meshctl.core.mesh.store import Store, Update

    w = _w("h", "192.168.1.1", extra={"networkMode": "HostNetwork"})
    s = Store().apply([Update(kind=Kind.WORKLOAD, key="h", record=w)])
    assert s.workload_by_ip("192.168.1.1") is None
    assert s.workload_by_uid("h") is w


def test_endpoints_follow_workload_updates():
    from meshctl.core.mesh.records import Kind
    from meshctl.core.mesh.store import Update

    s = store()
    echo = s.service_by_vip("10.96.0.10")
    assert echo is not None
    legacy = s.find_workload("prod", "legacy")
    moved = dataclasses_replace(legacy, services={})
    s2 = s.apply([Update(kind=Kind.WORKLOAD, key=legacy.uid, record=moved)])
    assert sorted(w.name for w, _ in s.endpoints(echo, 80)) == ["legacy", "server"]
    assert [w.name for w, _ in s2.endpoints(echo, 80)] == ["server"]


def test_an_update_whose_record_has_another_key_is_refused():
    from meshctl.core.mesh.records import Kind
    from meshctl.core.mesh.store import Store, Update

    with pytest.raises(ValueError, match="carries"):
        Store().apply([Update(kind=Kind.WORKLOAD, key="x", record=_w("y", "10.1.0.1"))])


def dataclasses_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)
