"""Store records <-> Istio's workload-discovery protobufs: round trips and ztunnel's refusals."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshctl import xds
from meshctl.core.mesh.records import Workload
from meshctl.core.xds.resources import ADDRESS_TYPE, AUTHORIZATION_TYPE
from meshctl.proto import workload_pb2 as wl_pb
from meshctl.proto import xds_pb2
from tests.unit.record_strategies import policies, services, workloads


@settings(deadline=None)  # a loaded CI machine is slow, not wrong
@given(st.one_of(workloads, services))
def test_addresses_survive_the_wire(record):
    body = xds.pack(ADDRESS_TYPE, record)
    assert xds.unpack(ADDRESS_TYPE, body) == record


@settings(deadline=None)  # a loaded CI machine is slow, not wrong
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
