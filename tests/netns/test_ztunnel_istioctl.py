"""Istio's own istioctl reads meshctl proxies' ``/config_dump`` (``istioctl ztunnel-config
... --file``), sidecar and node proxy alike, and shows what meshctl holds.

istioctl is built once per machine from the pinned Istio module (tests/harness/istio.py,
``tests/kube/build.sh --istioctl``). Each proxy is a real ``meshctl ztunnel run`` with a local
config and certificates in test namespaces; its dump goes to a file and every ``ztunnel-config``
view (workloads, services, policies, certificates, connections, all) must parse it, in JSON and
as istioctl's tables, showing the workloads, identities and serial numbers of the certificates
meshctl was given or minted.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from meshctl.core.pki import certs
from tests.harness.istio import istioctl_binary
from tests.harness.wait import eventually
from tests.netns.ambient_harness import ambient_node
from tests.netns.ztunnel_harness import echo_roundtrip
from tests.netns.ztunnel_topology import APP_PORT, SVC_PORT, two_pod_mesh

pytestmark = pytest.mark.netns

ALLOW_CLIENT = {
    "name": "allow-client",
    "namespace": "prod",
    "scope": "Namespace",
    "action": "Allow",
    "rules": [[[{"principals": ["cluster.local/ns/default/sa/client"]}]]],
}


def istioctl(binary: Path, dump: Path, view: str, *args: str) -> str:
    """``istioctl ztunnel-config VIEW --file DUMP ARGS``: its stdout; fails on any error."""
    done = subprocess.run(
        [str(binary), "ztunnel-config", view, "--file", str(dump), *args],
        capture_output=True,
        text=True,
        timeout=60,
        # A --file run still builds a client: give it a config that is never dialled.
        env={"HOME": str(dump.parent), "KUBECONFIG": str(kubeconfig(dump.parent))},
        check=False,
    )
    assert done.returncode == 0, f"istioctl {view}: {done.stderr}"
    return done.stdout


def kubeconfig(folder: Path) -> Path:
    path = folder / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "none", "user": {}}],
                "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
                "current-context": "none",
            }
        )
    )
    return path


def table(text: str) -> list[list[str]]:
    """istioctl's tab-aligned table: the header and rows, split on runs of spaces."""
    return [line.split() for line in text.splitlines() if line.strip()]


def save(dump: dict[str, Any], folder: Path) -> Path:
    path = folder / "dump.json"
    path.write_text(json.dumps(dump))
    return path


def serial_hex(cert_dir: Path, file: str = certs.CERT_CHAIN_FILE) -> str:
    """The hexadecimal serial of the first certificate in a file, as istioctl's table shows."""
    return format(int(certs.describe((cert_dir / file).read_bytes())[0].serial, 16), "x")


def test_istioctl_reads_a_sidecars_dump_and_shows_what_it_holds(tmp_path):
    binary = istioctl_binary()
    with two_pod_mesh(tmp_path, policies=[ALLOW_CLIENT]) as m:
        payload = b"through the mesh"
        reply = echo_roundtrip(m.a.ns, (m.vip, SVC_PORT), payload)
        assert reply == hashlib.sha256(payload).digest() + payload
        dump = m.car_b.config_dump()
    path = save(dump, tmp_path)

    workloads = json.loads(istioctl(binary, path, "workloads", "-o", "json"))
    assert sorted((w["namespace"], w["name"], w["workloadIps"]) for w in workloads) == [
        ("default", "client", [m.a.ip]),
        ("prod", "server", [m.b.ip]),
    ]
    assert {w["serviceAccount"] for w in workloads} == {"client", "server"}
    rows = table(istioctl(binary, path, "workloads"))
    assert rows[0] == ["NAMESPACE", "POD", "NAME", "ADDRESS", "NODE", "WAYPOINT", "PROTOCOL"]
    assert {(r[0], r[1], r[2]) for r in rows[1:]} == {
        ("default", "client", m.a.ip),
        ("prod", "server", m.b.ip),
    }

    (service,) = json.loads(istioctl(binary, path, "services", "-o", "json"))
    assert (service["name"], service["namespace"], service["vips"]) == (
        "echo",
        "prod",
        [f"/{m.vip}"],
    )
    assert service["ports"] == {str(SVC_PORT): APP_PORT}
    rows = table(istioctl(binary, path, "services"))
    # VIP and healthy/all endpoints: istioctl joins the service's endpoints with the workloads.
    assert rows[1] == ["prod", "echo", m.vip, "None", "1/1"]

    (policy,) = json.loads(istioctl(binary, path, "policies", "-o", "json"))
    assert (policy["name"], policy["action"], policy["scope"]) == (
        "allow-client",
        "Allow",
        "Namespace",
    )
    assert table(istioctl(binary, path, "policies"))[1] == [
        "prod",
        "allow-client",
        "Allow",
        "Namespace",
    ]

    (held,) = json.loads(istioctl(binary, path, "certificates", "-o", "json"))
    assert held["identity"] == "spiffe://cluster.local/ns/prod/sa/server"
    assert held["state"] == "Available"
    cert_dir = tmp_path / "certs" / "b"
    leaf = certs.describe((cert_dir / certs.CERT_CHAIN_FILE).read_bytes())[0]
    assert held["certChain"][0]["serialNumber"] == str(int(leaf.serial, 16))
    rows = table(istioctl(binary, path, "certificates"))
    assert rows[0][:2] == ["CERTIFICATE", "NAME"]
    # identity, type, status, valid, serial (hex), not after, not before
    assert rows[1][:5] == [held["identity"], "Leaf", "Available", "true", serial_hex(cert_dir)]
    assert rows[2][:5] == [
        held["identity"],
        "Root",
        "Available",
        "true",
        serial_hex(cert_dir, certs.ROOT_CERT_FILE),
    ]

    everything = istioctl(binary, path, "all")
    assert "allow-client" in everything
    assert held["identity"] in everything


def test_istioctl_reads_a_node_proxys_dump_with_each_pods_identity_and_connections(tmp_path):
    binary = istioctl_binary()
    with ambient_node(tmp_path) as m, m.client.ns.socket() as conn:
        conn.settimeout(10)  # the connection is held open while the dump is taken
        conn.connect((m.server.ip, APP_PORT))
        conn.sendall(b"E" + b"x" * 10)

        def connected() -> bool:
            state = m.proxy.config_dump()["workloadState"]
            return any(s.get("connections", {}).get("inbound") for s in state.values())

        eventually("the node proxy lists the open connection", connected)
        dump = m.proxy.config_dump()
    path = save(dump, tmp_path)

    held = json.loads(istioctl(binary, path, "certificates", "-o", "json"))
    assert {c["identity"] for c in held} == {
        "spiffe://cluster.local/ns/default/sa/client",
        "spiffe://cluster.local/ns/prod/sa/server",
    }
    minted = {
        pod["certificate"]["identity"]: pod["certificate"]["certChain"][0]["serialNumber"]
        for pod in dump["workloadState"].values()
    }
    assert {c["identity"]: c["certChain"][0]["serialNumber"] for c in held} == minted
    rows = table(istioctl(binary, path, "certificates"))
    leaves = {r[0]: r[4] for r in rows[1:] if r[1] == "Leaf"}
    assert leaves == {k: format(int(v), "x") for k, v in minted.items()}

    states = json.loads(istioctl(binary, path, "connections", "-o", "json"))
    by_name = {s["info"]["name"]: s for s in states}
    assert set(by_name) == {"client", "server"}
    assert by_name["server"]["info"]["namespace"] == "prod"
    (inbound,) = by_name["server"]["connections"]["inbound"]
    assert inbound["actualDst"] == f"{m.server.ip}:{APP_PORT}"
    assert inbound["protocol"] == "HBONE"
    (outbound,) = by_name["client"]["connections"]["outbound"]
    assert outbound["originalDst"] == f"{m.server.ip}:{APP_PORT}"
    assert outbound["actualDst"] == f"{m.server.ip}:15008"
    rows = table(istioctl(binary, path, "connections"))
    assert rows[0][:3] == ["WORKLOAD", "DIRECTION", "LOCAL"]
    workloads = json.loads(istioctl(binary, path, "workloads", "-o", "json"))
    assert {w["name"] for w in workloads} == {"client", "server"}
    rows = table(istioctl(binary, path, "services"))
    assert rows[1] == ["prod", "echo", m.vip, "None", "1/1"]
    everything = istioctl(binary, path, "all")
    assert "Inbound" in everything  # the connections table, from workloadState
    assert "spiffe://cluster.local/ns/prod/sa/server" in everything
