"""``meshctl bug-report`` on the real node, against the ambient install (control plane, CNI node
agent, node proxy) with a sidecar-injected pod: the archive holds the control plane's log, the
sidecar's and the node proxy's config dumps (port-forward, never exec) and the node's CNI config
(the agent's /debug/conflist), and no key material anywhere: not the CA's private key, not the
pod's projected token, no PEM private key block, no JWT."""

from __future__ import annotations

import base64
import json
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from meshctl.core.k8s.cni.spec import PLUGIN_TYPE
from tests.harness import nodehost
from tests.harness import workloads as wl
from tests.harness.ambient_pods import NODE_PROXY_SELECTOR
from tests.harness.mesh_install import Mesh, installed
from tests.harness.node import TestNode, report_namespace

pytestmark = pytest.mark.node

SYSTEM_NS = "meshctl-system"
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"
# What must never be in a report: a PEM private key block, a JWT (two "eyJ" parts, anywhere),
# and base64url JSON starting a token (a JWT's header alone).
FORBIDDEN = (
    re.compile(rb"-----BEGIN .*PRIVATE KEY-----"),
    re.compile(rb"eyJ[A-Za-z0-9_-]+\.eyJ"),
    re.compile(rb"(?<![A-Za-z0-9+/_-])eyJ"),
)


@pytest.fixture(scope="module")
def ambient_mesh(kube_node: TestNode) -> Iterator[Mesh]:
    # This node's containerd pins pod netns under its own state directory, not /var/run/netns.
    netns_dir = nodehost.WORKDIR / "containerd" / "state"
    values = ["--set", f"components.cni.netnsDir={netns_dir}"]
    with installed(Mesh(kube_node, "ambient", values)) as mesh:
        yield mesh


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        names = tar.getnames()
        assert names[0].endswith("/SUMMARY.md"), names[:3]
        out = {}
        for info in tar.getmembers():
            handle = tar.extractfile(info)
            assert handle is not None, info.name
            out[info.name.split("/", 1)[1]] = handle.read()
        return out


def test_bug_report_of_a_meshed_pod_holds_logs_dumps_conflist_and_no_key_material(
    kube_node: TestNode, ambient_mesh: Mesh, node_namespace: str, tmp_path: Path, request
):
    report_namespace(request.node, SYSTEM_NS)
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        core.patch_namespace(
            node_namespace, {"metadata": {"labels": {"istio-injection": "enabled"}}}
        )
        pod = wl.busybox_pod("web", kube_node.image("busybox"), ["sleep", "3600"])
        core.create_namespaced_pod(node_namespace, pod)
        running = wl.wait_pod_ready(api, node_namespace, "web", timeout=120)
        names = [c.name for c in [*(running.spec.init_containers or []), *running.spec.containers]]
        assert "istio-proxy" in names, names
        token = wl.pod_exec(api, node_namespace, "web", ["cat", TOKEN_PATH], container="main")
        assert token.stdout.startswith("eyJ"), token.stderr
        secret = core.read_namespaced_secret("meshctl-ca-secret", SYSTEM_NS)
        keys = [
            base64.b64decode(v).decode()
            for v in (secret.data or {}).values()
            if b"PRIVATE KEY" in base64.b64decode(v)
        ]
        assert keys, "the CA Secret holds no private key to look for"
        control_plane = [
            p.metadata.name
            for p in wl.pods(api, SYSTEM_NS, "app.kubernetes.io/name=meshctl-controlplane")
        ]
        node_proxies = [p.metadata.name for p in wl.pods(api, SYSTEM_NS, NODE_PROXY_SELECTOR)]
    assert control_plane, "no control plane pod"
    assert node_proxies, "no node proxy pod"

    target = tmp_path / "report.tar.gz"
    done = ambient_mesh.run(
        "bug-report", "-n", node_namespace, "--since", "10m", "-O", str(target), "-o", "json",
        timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    summary = json.loads(done.stdout)
    assert summary["archive"] == str(target)
    assert summary["proxiesNotAnswering"] == [], summary
    assert summary["nacks"] == [], summary
    members = _members(target)

    assert any(name.startswith(f"logs/{SYSTEM_NS}/{control_plane[0]}/") for name in members), (
        sorted(members)
    )
    assert f"logs/{node_namespace}/web/istio-proxy.log" in members, sorted(members)
    sidecar = json.loads(members[f"proxies/{node_namespace}/web/config_dump.json"])
    assert sidecar["identity"] == f"spiffe://cluster.local/ns/{node_namespace}/sa/default"
    node_proxy = json.loads(members[f"proxies/{SYSTEM_NS}/{node_proxies[0]}/config_dump.json"])
    assert "workloadState" in node_proxy, sorted(node_proxy)
    (conflist,) = [name for name in members if name.startswith("cni/")]
    served = json.loads(members[conflist])
    active = json.loads(served["files"][served["active"]])
    assert any(p.get("type") == PLUGIN_TYPE for p in active["plugins"]), active
    assert "install/meshctl-install.yaml" in members
    assert f"objects/{SYSTEM_NS}/Secret.yaml" in members

    key_bodies = ["".join(k.strip().splitlines()[1:-1]) for k in keys]
    secrets = [token.stdout.strip().encode()] + [
        part.encode() for body in key_bodies for part in (body[:48], body[-48:])
    ]
    for name, data in members.items():
        for pattern in FORBIDDEN:
            found = pattern.search(data)
            assert found is None, f"{name}: {data[max(0, found.start() - 80) : found.end() + 80]!r}"
        for value in secrets:
            assert value not in data, f"{name} holds key material {value[:10]!r}..."
