"""proxy-status's merge and tables, and proxy-config's sections, from data shaped by the
producers themselves (the data plane's own record encoder, the control plane's report form)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
from datetime import UTC, datetime

import pytest

from meshctl.core.mesh.records import Action, Policy, Protocol, Scope, Service, Workload
from meshctl.core.proxystatus import configdump, report, syncz
from meshctl.core.proxystatus.configdump import DumpError, PodRef
from meshctl.core.wire import ztunnel_dump

ADDR = "type.googleapis.com/istio.workload.Address"
WEB = "spiffe://cluster.local/ns/shop/sa/web"
NOW = datetime(2026, 12, 6, 18, 0, tzinfo=UTC)


def type_facts(status, nack=""):
    return {
        "status": status,
        "sent": {"version": "4", "nonce": "2"},
        "sentAgo": 3.0,
        "acked": {"version": "4", "nonce": "2"} if status == "SYNCED" else {},
        "ackedAgo": 2.0,
        "nacked": {"version": "4", "nonce": "2", "error": nack} if nack else {},
        "nackedAgo": 2.0 if nack else None,
    }


def proxy(requester, status, **kw):
    return {
        "id": f"sidecar~{requester}",
        "requester": requester,
        "account": "shop/web",
        "identity": "spiffe://cluster.local/ns/shop/sa/web",
        "kind": kw.get("kind", "sidecar"),
        "node": "n1",
        "connectedAgo": 60.0,
        "status": status,
        "types": {
            "type.googleapis.com/istio.security.Authorization": type_facts("SYNCED"),
            ADDR: type_facts(status, kw.get("nack", "")),
        },
    }


def cert(requester, identity, not_after, not_before="2026-12-06T00:00:00+00:00", serial="a1"):
    return {
        "requester": requester,
        "identity": identity,
        "serial": serial,
        "notBefore": not_before,
        "notAfter": not_after,
    }


def rep(name, proxies, certificates=()):
    return syncz.decode(
        syncz.encode(
            {
                "controlPlane": name,
                "generation": 4,
                "staleAfterSeconds": 10.0,
                "proxies": proxies,
                "certificates": list(certificates),
            }
        )
    )


def test_merge_joins_certificates_from_any_replica_and_puts_problems_first():
    a = rep("cp-a", [proxy("shop/web-1", "SYNCED"), proxy("shop/bad-1", "NACK", nack="x: no")])
    b = rep(
        "cp-b",
        [proxy("shop/old-1", "STALE")],
        [
            cert(
                "shop/web-1", "spiffe://cluster.local/ns/shop/sa/web", "2026-12-07T00:00:00+00:00"
            ),
            # A renewal signed later by the same replica replaces the earlier record.
            cert(
                "shop/web-1",
                "spiffe://cluster.local/ns/shop/sa/web",
                "2026-12-07T06:00:00+00:00",
                not_before="2026-12-06T06:00:00+00:00",
                serial="b2",
            ),
        ],
    )
    merged = report.merge([a, b], [report.Failure(control_plane="cp-c", error="timed out")])
    rows = report.table(merged, NOW)
    assert [r["NAME"] for r in rows] == ["shop/bad-1", "shop/old-1", "shop/web-1", "-"]
    assert [r["STATUS"] for r in rows] == ["NACK", "STALE", "SYNCED", "UNREACHABLE"]
    assert list(rows[0])[4:6] == ["ADDRESS", "AUTHORIZATION"]  # types in name order
    web = rows[2]
    assert web["CONTROL PLANE"] == "cp-a"
    assert web["ADDRESS"] == "SYNCED (3s)"
    assert web["CERT EXPIRY"] == "2026-12-07 06:00:00 (12h)"
    assert rows[3]["CONTROL PLANE"] == "cp-c"
    lines = report.problems(merged)
    assert "control plane cp-c did not answer: timed out" in lines
    assert "shop/bad-1 is NACK; ADDRESS refused: x: no" in lines
    data = report.as_data(merged)
    assert data["unreachable"] == [{"controlPlane": "cp-c", "error": "timed out"}]
    assert json.dumps(data)  # -o json works on it


def test_one_proxy_detail_names_versions_nonces_and_the_nack_message():
    merged = report.merge([rep("cp-a", [proxy("shop/bad-1", "NACK", nack="x: no")])])
    (chosen,) = report.select(merged, "shop", "bad-1")
    row, authz = report.detail(chosen, NOW)
    assert (row["TYPE"], authz["TYPE"]) == (
        ADDR,
        "type.googleapis.com/istio.security.Authorization",
    )
    assert row["STATUS"] == "NACK"
    assert row["SENT"] == "v4 nonce 2 (3s ago)"
    assert row["NACK ERROR"] == "x: no"
    assert report.summary(chosen, NOW)["control plane"] == "cp-a"
    assert report.select(merged, "shop", "web-1") == []
    zt = proxy("meshctl-system/ztunnel-x", "SYNCED", kind="node proxy")
    both = report.merge([rep("cp-a", [zt, proxy("shop/web-1", "SYNCED")])])
    assert [p["requester"] for p in report.node_proxies_on(both, "n1")] == [zt["requester"]]
    assert report.node_proxies_on(both, "n2") == []


def test_a_report_that_is_not_the_json_form_is_refused():
    whole = '"controlPlane": "a", "proxies": %s, "certificates": %s'
    for raw in (
        b"\xff",
        b"[]",
        b'{"controlPlane": "a"}',
        b"not json",
        ("{" + whole % ('[{"types": {}}]', "[]") + "}").encode(),
        ("{" + whole % ('[{"requester": "a/b", "types": {"t": 1}}]', "[]") + "}").encode(),
        ("{" + whole % ("[]", '[{"requester": "a/b"}]') + "}").encode(),
    ):
        with pytest.raises(syncz.ReportError):
            syncz.decode(raw)


def dump(node_mode=False):
    web = Workload(
        uid="Kubernetes//Pod/shop/web-1",
        name="web-1",
        namespace="shop",
        service_account="web",
        workload_ips=(ipaddress.ip_address("10.1.0.5"),),
        node="n1",
        protocol=Protocol.HBONE,
        authorization_policies=("shop/only-web",),
        services={"shop/web.shop.svc.cluster.local": {80: 8080}},
    )
    db = Workload(uid="u2", name="db-0", namespace="data", workload_ips=(), protocol=Protocol.TCP)
    svc = Service(
        name="web",
        namespace="shop",
        hostname="web.shop.svc.cluster.local",
        vips=(("", ipaddress.ip_address("10.96.0.9")),),
        ports={80: 8080},
    )
    policies = [
        Policy(
            name="only-web",
            namespace="shop",
            scope=Scope.WORKLOAD_SELECTOR,
            action=Action.ALLOW,
            rules=((), ()),
        ),
        Policy(
            name="ns-deny", namespace="data", scope=Scope.NAMESPACE, action=Action.DENY, rules=((),)
        ),
        Policy(
            name="mesh",
            namespace="meshctl-system",
            scope=Scope.GLOBAL,
            action=Action.ALLOW,
            rules=((),),
        ),
    ]
    leaf = {
        "serialNumber": "0a",
        "validFrom": "2026-12-06T00:00:00+00:00",
        "expirationTime": "2026-12-07T00:00:00+00:00",
        "uriSans": [],
    }
    summary = ztunnel_dump.identity_certs(
        "spiffe://cluster.local/ns/shop/sa/web",
        "Available",
        [leaf],  # type: ignore[list-item]
        "",
        [dict(leaf, serialNumber="01")],  # type: ignore[list-item]
        "",
    )
    out = {
        **ztunnel_dump.state_sections((web, db), (svc,), policies),
        "certificates": [summary],
    }
    if node_mode:
        out["workloadState"] = {
            "Kubernetes//Pod/shop/web-1": {
                "info": {"name": "web-1", "namespace": "shop", "serviceAccount": "web"},
                "listeners": {"inbound": "10.1.0.5:15008", "outbound": "127.0.0.1:15001"},
                "certificate": summary,
            }
        }
    else:
        out["listeners"] = {"admin": "127.0.0.1:15000", "inbound": "0.0.0.0:15006"}
    return json.loads(json.dumps(out))  # as it travels


def test_workloads_and_services_tables():
    rows = configdump.section(dump(), "workloads")
    assert rows[1] == {
        "NAME": "web-1",
        "NAMESPACE": "shop",
        "IP": "10.1.0.5",
        "NODE": "n1",
        "PROTOCOL": "HBONE",
        "IDENTITY": "spiffe://cluster.local/ns/shop/sa/web",
    }
    assert rows[0]["IP"] == "-"
    (svc,) = configdump.section(dump(), "services")
    assert svc == {
        "NAME": "web",
        "NAMESPACE": "shop",
        "VIPS": "10.96.0.9",
        "PORTS": "80->8080",
        "ENDPOINTS": "1",
    }


def test_policies_all_or_those_applying_to_one_pod():
    every = configdump.section(dump(), "policies")
    assert [(r["NAME"], r["SCOPE"], r["ACTION"], r["RULES"]) for r in every] == [
        ("ns-deny", "Namespace", "Deny", "1"),
        ("mesh", "Global", "Allow", "1"),
        ("only-web", "WorkloadSelector", "Allow", "2"),
    ]
    mine = configdump.section(dump(True), "policies", PodRef(namespace="shop", name="web-1"))
    assert [r["NAME"] for r in mine] == ["mesh", "only-web"]


def test_certs_and_listeners_of_a_sidecar_and_of_a_pod_on_a_node_proxy():
    rows = configdump.section(dump(), "certs")
    assert [(r["TYPE"], r["SERIAL"], r["STATE"]) for r in rows] == [
        ("leaf", "a", "Available"),
        ("root", "1", "Available"),
    ]
    assert rows[0]["NOT AFTER"] == "2026-12-07T00:00:00Z"
    assert configdump.section(dump(), "listeners")[0] == {
        "ADDRESS": "0.0.0.0:15006",
        "SERVES": "inbound",
    }
    pod = PodRef(namespace="shop", name="web-1")
    assert configdump.section(dump(True), "certs", pod)[0]["SERIAL"] == "a"
    assert [r["SERVES"] for r in configdump.section(dump(True), "listeners", pod)] == [
        "inbound",
        "outbound",
    ]
    with pytest.raises(DumpError, match="not enrolled pod shop/other"):
        configdump.section(dump(True), "certs", PodRef(namespace="shop", name="other"))
    with pytest.raises(DumpError, match="not a node proxy"):
        configdump.section(dump(), "listeners", pod)


def test_garbage_dumps_are_errors_not_crashes():
    for bad in ({}, {"workloads": "x"}, {"workloads": [1, "a"], "services": None}):
        for name in configdump.SECTIONS:
            with contextlib.suppress(DumpError):
                configdump.section(bad, name)
    assert configdump.section({"workloads": [{"name": 3}]}, "workloads")[0]["NAME"] == "3"
    with pytest.raises(DumpError):
        configdump.section([], "workloads")  # type: ignore[arg-type]


def test_a_pods_certs_on_ztunnel_itself_come_from_the_certificates_of_its_identity():
    # ztunnel's workloadState has no per-pod certificate: the pod's identity picks the entry.
    ztunnel = dump(True)
    for entry in ztunnel["workloadState"].values():
        del entry["certificate"]
    other = dict(ztunnel["certificates"][0], identity="spiffe://cluster.local/ns/shop/sa/db")
    ztunnel["certificates"].insert(0, other)
    pod = PodRef(namespace="shop", name="web-1")
    rows = configdump.section(ztunnel, "certs", pod)
    assert {r["IDENTITY"] for r in rows} == {"spiffe://cluster.local/ns/shop/sa/web"}
    assert configdump.raw(ztunnel, "certs", pod)["identity"].endswith("/sa/web")


def test_sections_keyed_by_address_as_older_ztunnels_wrote_them_are_read_too():
    keyed = dump()
    keyed["workloads"] = {f"/{i}": w for i, w in enumerate(keyed["workloads"])}
    assert [r["NAME"] for r in configdump.section(keyed, "workloads")] == ["db-0", "web-1"]
