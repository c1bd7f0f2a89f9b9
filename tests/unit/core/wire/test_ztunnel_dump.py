"""The /config_dump sections in ztunnel's shapes (meshctl.core.wire.ztunnel_dump), without the
Istio module (tests/golden/test_ztunnel_dump_istio.py compares them with a real ztunnel dump)."""

from __future__ import annotations

import base64
import ipaddress
from datetime import UTC, datetime, timedelta

from meshctl.core.mesh.records import Protocol, Service, Workload
from meshctl.core.pki import certs as certs_mod
from meshctl.core.wire import channel, ztunnel_dump


def test_a_workload_leaves_out_what_ztunnel_leaves_out_when_default() -> None:
    w = Workload(
        uid="u1",
        name="a",
        namespace="ns",
        service_account="",
        trust_domain="",
        workload_type="",
        cluster_id="Kubernetes",
    )
    assert ztunnel_dump.workload(w) == {
        "workloadIps": [],
        "protocol": "TCP",
        "networkMode": "Standard",
        "uid": "u1",
        "name": "a",
        "namespace": "ns",
        "status": "Healthy",
        "clusterId": "Kubernetes",
        "capacity": 1,
    }


def test_a_workloads_services_become_names_and_its_ports_the_services_endpoints() -> None:
    w = Workload(
        uid="u1",
        name="a",
        namespace="ns",
        workload_ips=(ipaddress.ip_address("10.0.0.1"),),
        protocol=Protocol.HBONE,
        healthy=False,
        services={"ns/s.ns.svc": {80: 8080}, "ns/later.ns.svc": {9: 9}},
    )
    s = Service(
        name="s",
        namespace="ns",
        hostname="s.ns.svc",
        vips=(("", ipaddress.ip_address("10.96.0.1")),),
        ports={80: 8080},
    )
    sections = ztunnel_dump.state_sections([w], [s], [])
    (workload,) = sections["workloads"]
    assert workload["services"] == ["ns/later.ns.svc", "ns/s.ns.svc"]
    assert workload["status"] == "Unhealthy"
    (service,) = sections["services"]
    assert service["vips"] == ["/10.96.0.1"]
    assert service["ports"] == {"80": 8080}
    assert service["endpoints"] == {
        "u1": {"workloadUid": "u1", "port": {"80": 8080}, "status": "Unhealthy"}
    }
    assert (service["canonical"], service["visibility"], service["subjectAltNames"]) == (
        False,
        "Public",
        [],
    )
    # A service named by a workload but not known yet: ztunnel's stagedServices.
    assert sections["stagedServices"] == {
        "ns/later.ns.svc": {"u1": {"workloadUid": "u1", "port": {"9": 9}, "status": "Unhealthy"}}
    }


def test_certificates_are_base64_pem_with_decimal_serials_and_utc_seconds() -> None:
    now = datetime(2026, 12, 6, 12, 0, 0, 123456, tzinfo=UTC)
    root = certs_mod.mint_root(trust_domain="cluster.local", now=now, ttl=timedelta(days=1))
    bundle = root.cert_pem.decode() * 2  # two certificates: each gets its own PEM
    (facts,) = certs_mod.describe(root.cert_pem)
    described = channel.certificate_facts(
        facts.serial, facts.not_before.isoformat(), facts.not_after.isoformat(), []
    )
    entry = ztunnel_dump.identity_certs("spiffe://x", "Available", [described] * 2, bundle)
    assert entry["rootCerts"] == []
    first, second = entry["certChain"]
    assert base64.b64decode(first["pem"]).decode() == root.cert_pem.decode()
    assert second == first
    assert first["serialNumber"] == str(int(facts.serial, 16))
    assert first["serialNumber"].isdigit()
    assert first["validFrom"] == facts.not_before.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert first["expirationTime"].endswith("Z")
    assert ztunnel_dump.hex_serial(first["serialNumber"]) == facts.serial.lstrip("0")


def test_times_are_written_in_utc_with_z() -> None:
    assert ztunnel_dump.rfc3339("2026-12-06T13:00:00.5+01:00") == "2026-12-06T12:00:00Z"
    assert ztunnel_dump.rfc3339("2026-12-06T12:00:00") == "2026-12-06T12:00:00Z"


def test_an_identity_without_certificates_has_empty_lists() -> None:
    assert ztunnel_dump.identity_certs("spiffe://x", "Unavailable") == {
        "identity": "spiffe://x",
        "state": "Unavailable",
        "certChain": [],
        "rootCerts": [],
    }


def test_a_pods_connections_are_its_inbound_and_outbound_flows() -> None:
    def flow(direction: str, src: str, dst: str, hbone: str | None, mtls: bool) -> dict:
        return {
            "direction": direction,
            "src": {"addr": f"{src}:1", "workload": f"ns/{src}", "identity": None},
            "dst": {"addr": f"{dst}:2", "workload": f"ns/{dst}", "identity": None},
            "hboneAddr": hbone,
            "service": "s.ns.svc" if direction == "inbound" else None,
            "mutualTls": mtls,
            "bytesReceived": 0,
            "bytesSent": 0,
            "durationSeconds": 0.0,
        }

    # As the access log has them: dst is where the connection went (the tunnel's :15008),
    # hboneAddr the destination inside the tunnel.
    flows = [
        flow("inbound", "b", "a", "a:8080", True),
        flow("outbound", "a", "c", "c:8080", True),
        flow("outbound", "a", "d", None, False),
        flow("outbound", "b", "c", None, False),  # not a's
    ]
    got = ztunnel_dump.pod_connections(flows, "ns", "a")  # type: ignore[arg-type]
    assert got == {
        "inbound": [
            {"src": "b:1", "originalDst": "s.ns.svc", "actualDst": "a:8080", "protocol": "HBONE"}
        ],
        "outbound": [
            {"src": "a:1", "originalDst": "c:8080", "actualDst": "c:2", "protocol": "HBONE"},
            {"src": "a:1", "originalDst": "d:2", "actualDst": "d:2", "protocol": "TCP"},
        ],
    }
