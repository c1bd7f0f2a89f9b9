"""The generated schemas encode as Istio's: byte strings, type URLs and method paths on the wire.

Expected bytes were computed independently from the field numbers in Istio's protos (see
shared notes istio-protos.md); a renumbered field or renamed package fails here.
"""

from __future__ import annotations

from google.protobuf import any_pb2

from meshctl.proto import authorization_pb2, citadel_pb2, workload_pb2, xds_pb2, zds_pb2


def test_zds_messages_encode_as_istio_ztunnel_expects() -> None:
    assert zds_pb2.ZdsHello(version=zds_pb2.V1).SerializeToString() == bytes.fromhex("0801")
    snapshot = zds_pb2.WorkloadRequest(snapshot_sent=zds_pb2.SnapshotSent())
    assert snapshot.SerializeToString() == bytes.fromhex("1a00")
    assert zds_pb2.WorkloadResponse(ack=zds_pb2.Ack()).SerializeToString() == bytes.fromhex("0a00")
    delete = zds_pb2.WorkloadRequest(**{"del": zds_pb2.DelWorkload(uid="u1")})
    assert delete.SerializeToString() == bytes.fromhex("120412027531")
    keep = zds_pb2.WorkloadRequest(keep=zds_pb2.KeepWorkload(uid="u1"))
    assert keep.SerializeToString() == bytes.fromhex("2a040a027531")  # field 5, not 4


def test_resource_type_urls_are_istios() -> None:
    packed = any_pb2.Any()
    packed.Pack(workload_pb2.Address(workload=workload_pb2.Workload(uid="u")))
    assert packed.type_url == "type.googleapis.com/istio.workload.Address"
    packed.Pack(authorization_pb2.Authorization(name="p"))
    assert packed.type_url == "type.googleapis.com/istio.security.Authorization"


def test_workload_fields_keep_upstream_numbers() -> None:
    # uid is field 20 (tag 0xa2 0x01), services a map at 22, addresses raw bytes at 3.
    workload = workload_pb2.Workload(uid="x", addresses=[bytes([10, 0, 0, 1])])
    assert workload.SerializeToString() == bytes.fromhex("1a040a000001a20101" + "78")
    with_services = workload_pb2.Workload(
        services={"ns/h": workload_pb2.PortList(ports=[workload_pb2.Port(service_port=80)])}
    )
    assert with_services.SerializeToString().startswith(bytes.fromhex("b201"))


def test_network_address_length_is_optional() -> None:
    host = workload_pb2.NetworkAddress(address=bytes(4))
    assert not host.HasField("length")
    zero = workload_pb2.NetworkAddress(address=bytes(4), length=0)
    assert zero.HasField("length")
    assert zero.SerializeToString().endswith(bytes.fromhex("1800"))


def test_method_paths_are_istios_and_envoys() -> None:
    ca = citadel_pb2.DESCRIPTOR.services_by_name["IstioCertificateService"]
    assert ca.methods_by_name["CreateCertificate"].full_name == (
        "istio.v1.auth.IstioCertificateService.CreateCertificate"
    )
    ads = xds_pb2.DESCRIPTOR.services_by_name["AggregatedDiscoveryService"]
    assert ads.methods_by_name["DeltaAggregatedResources"].full_name == (
        "envoy.service.discovery.v3.AggregatedDiscoveryService.DeltaAggregatedResources"
    )


def test_delta_request_numbers_match_envoy() -> None:
    request = xds_pb2.DeltaDiscoveryRequest(type_url="t", response_nonce="n")
    assert request.SerializeToString() == bytes.fromhex("120174" + "32016e")
    nack = xds_pb2.DeltaDiscoveryRequest(error_detail=xds_pb2.Status(message="m"))
    assert nack.SerializeToString() == bytes.fromhex("3a03" + "12016d")
