"""Store records <-> Istio's workload-discovery protobufs: round trips and ztunnel's refusals."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshctl import xds
from meshctl.core.discovery import ADDRESS_TYPE, AUTHORIZATION_TYPE
from meshctl.core.workloads import (
    Action,
    Policy,
    Protocol,
    RbacMatch,
    Scope,
    Service,
    StringMatch,
    Workload,
)
from meshctl.proto import workload_pb2 as wl_pb
from meshctl.proto import xds_pb2

names = st.text("abcdefgh-", min_size=1, max_size=8)
ips = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6))
ports = st.integers(1, 65535)
port_maps = st.dictionaries(ports, st.integers(0, 65535), max_size=3)

workloads = st.builds(
    Workload,
    uid=names.map(lambda n: f"c//Pod/ns/{n}"),
    name=names,
    namespace=names,
    service_account=names,
    workload_ips=st.lists(ips, max_size=2).map(tuple),
    protocol=st.sampled_from(Protocol),
    network=st.sampled_from(["", "net1"]),
    trust_domain=st.sampled_from(["cluster.local", "td.example"]),
    node=names,
    workload_name=names,
    workload_type=st.sampled_from(["deployment", "cronjob", "pod", "job"]),
    canonical_name=names,
    canonical_revision=names,
    cluster_id=st.sampled_from(["Kubernetes", "c2"]),
    authorization_policies=st.lists(names.map(lambda n: f"ns/{n}"), max_size=2).map(tuple),
    healthy=st.booleans(),
    services=st.dictionaries(names.map(lambda n: f"ns/{n}.svc"), port_maps, max_size=2),
    extra=st.fixed_dictionaries(
        {},
        optional={
            "hostname": names,
            "nativeTunnel": st.just(True),
            "networkMode": st.just("HostNetwork"),
            "capacity": st.integers(0, 100),
            "locality": st.fixed_dictionaries({"region": names, "zone": names, "subzone": names}),
            "applicationTunnel": st.fixed_dictionaries(
                {"protocol": st.sampled_from(["NONE", "PROXY"]), "port": ports}
            ),
            "waypoint": st.fixed_dictionaries(
                {
                    "destination": st.one_of(
                        ips.map(lambda i: f"/{i}"), names.map(lambda n: f"ns/{n}")
                    ),
                    "hboneMtlsPort": ports,
                }
            ),
        },
    ),
)
services = st.builds(
    Service,
    name=names,
    namespace=names,
    hostname=names.map(lambda n: f"{n}.ns.svc.cluster.local"),
    vips=st.lists(st.tuples(st.sampled_from(["", "n"]), ips), max_size=2).map(tuple),
    ports=port_maps,
    subject_alt_names=st.lists(names, max_size=1).map(tuple),
)
string_matches = st.one_of(
    st.builds(StringMatch, kind=st.sampled_from(["exact", "prefix", "suffix"]), value=names),
    st.just(StringMatch(kind="presence")),
)
networks = ips.flatmap(
    lambda ip: st.integers(0, ip.max_prefixlen).map(
        lambda n: ipaddress.ip_network((ip, n), strict=False)
    )
)
matches = st.builds(
    RbacMatch,
    namespaces=st.lists(string_matches, max_size=2).map(tuple),
    not_principals=st.lists(string_matches, max_size=2).map(tuple),
    service_accounts=st.lists(st.tuples(names, names), max_size=1).map(tuple),
    source_ips=st.lists(networks, max_size=2).map(tuple),
    not_destination_ips=st.lists(networks, max_size=1).map(tuple),
    destination_ports=st.lists(ports, max_size=2).map(tuple),
    not_destination_ports=st.lists(ports, max_size=1).map(tuple),
)
policies = st.builds(
    Policy,
    name=names,
    namespace=names,
    scope=st.sampled_from(Scope),
    action=st.sampled_from(Action),
    rules=st.lists(
        st.lists(st.lists(matches, max_size=2).map(tuple), max_size=2).map(tuple), max_size=2
    ).map(tuple),
    dry_run=st.booleans(),
)


@given(st.one_of(workloads, services))
def test_addresses_survive_the_wire(record):
    body = xds.pack(ADDRESS_TYPE, record)
    assert xds.unpack(ADDRESS_TYPE, body) == record


@given(policies)
def test_policies_survive_the_wire(policy):
    assert xds.unpack(AUTHORIZATION_TYPE, xds.pack(AUTHORIZATION_TYPE, policy)) == policy


def test_cluster_local_travels_as_empty_trust_domain():
    w = Workload(uid="u", name="n", namespace="ns", trust_domain="cluster.local")
    assert xds.workload_to_proto(w).trust_domain == ""


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        (wl_pb.Address(), "without a workload or a service"),
        (wl_pb.Address(workload=wl_pb.Workload(uid="u", addresses=[b"\x01\x02\x03"])), "3 bytes"),
        (
            wl_pb.Address(
                workload=wl_pb.Workload(uid="u", tunnel_protocol=wl_pb.LEGACY_ISTIO_MTLS)
            ),
            "LEGACY_ISTIO_MTLS",
        ),
        (
            wl_pb.Address(workload=wl_pb.Workload(uid="u", services={"nohost": wl_pb.PortList()})),
            "namespace/hostname",
        ),
    ],
)
def test_resources_ztunnel_rejects_are_refused_with_its_reason(address, reason):
    from google.protobuf import any_pb2

    body = any_pb2.Any(type_url=ADDRESS_TYPE, value=address.SerializeToString())
    with pytest.raises(xds.WireError, match=reason):
        xds.unpack(ADDRESS_TYPE, body)


def test_garbage_bytes_are_a_wire_error():
    from google.protobuf import any_pb2

    with pytest.raises(xds.WireError, match="decode"):
        xds.unpack(ADDRESS_TYPE, any_pb2.Any(value=b"\xff\xff\xff"))


def test_requests_translate_with_nack_detection():
    ack = xds.request_from_proto(xds_pb2.DeltaDiscoveryRequest(type_url="t", response_nonce="3"))
    assert (ack.nonce, ack.error) == ("3", None)
    nack = xds.request_from_proto(
        xds_pb2.DeltaDiscoveryRequest(
            type_url="t", response_nonce="3", error_detail=xds_pb2.Status(message="x: bad")
        )
    )
    assert nack.error == "x: bad"
    # An empty error_detail message is still a NACK (presence decides).
    empty = xds_pb2.DeltaDiscoveryRequest(type_url="t", response_nonce="3")
    empty.error_detail.SetInParent()
    assert xds.request_from_proto(empty).error == ""
