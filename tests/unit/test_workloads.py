"""The workload store: parsing ztunnel's local config strictly, and the data plane's lookups."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from meshctl.core.workloads import (
    Action,
    LocalConfigError,
    NoHealthyEndpointError,
    Protocol,
    Scope,
    local_config_warnings,
    parse_local_config,
)

DOC = yaml.safe_load(
    (Path(__file__).parent.parent / "testdata/ztunnel/local-config.yaml").read_text()
)


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
