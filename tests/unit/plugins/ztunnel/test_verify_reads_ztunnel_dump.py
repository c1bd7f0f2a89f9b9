"""``meshctl verify --workload`` of an ambient pod reads the node proxy's dump in ztunnel's
shapes: the pod's certificate from ``workloadState``, its roots' decimal serial numbers matched
against the mesh's root ConfigMap (whose certificates meshctl describes in hexadecimal)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from meshctl_plugins.ztunnel import ambient_checks, checks

from meshctl.core.k8s import ambient
from meshctl.core.k8s.install.checks import Outcome
from meshctl.core.pki import certs
from meshctl.core.pki.identity import SpiffeId
from meshctl.core.wire import ztunnel_dump
from meshctl.proxy.file_sources import cert_facts

POD: Any = {
    "metadata": {
        "name": "web-1",
        "namespace": "shop",
        "uid": "uid-1",
        "annotations": {ambient.REDIRECTION: ambient.REDIRECTION_ENABLED},
    },
    "spec": {"serviceAccountName": "web", "nodeName": "n1"},
}


def _dump(root: certs.KeyPair) -> dict[str, Any]:
    now = datetime.now(UTC)
    who = SpiffeId("cluster.local", "shop", "web")
    leaf = certs.mint_workload(root, who, now=now, ttl=timedelta(hours=1))
    chain, roots = leaf.cert_pem.decode(), root.cert_pem.decode()
    entry = ztunnel_dump.identity_certs(
        str(who), "Available", cert_facts(chain), chain, cert_facts(roots), roots
    )
    state = {"uid-1": {"info": {}, "state": "Up", "certificate": entry}}
    return json.loads(json.dumps({"workloadState": state}))


@pytest.mark.parametrize("same_root", [True, False])
def test_the_pods_roots_are_matched_with_the_mesh_root_by_serial(monkeypatch, same_root):
    now = datetime.now(UTC)
    mesh_root = certs.mint_root(trust_domain="cluster.local", now=now, ttl=timedelta(days=1))
    other = certs.mint_root(trust_domain="cluster.local", now=now, ttl=timedelta(days=1))
    dump = _dump(mesh_root if same_root else other)
    root_cm = {"data": {"root-cert.pem": mesh_root.cert_pem.decode()}}
    monkeypatch.setattr("meshctl.kube.objects.get", lambda *a, **k: root_cm)
    monkeypatch.setattr(
        "meshctl.kube.portforward.http_get", lambda *a, **k: (200, json.dumps(dump).encode())
    )
    node_proxy = {"metadata": {"name": "ztunnel-abc", "namespace": "meshctl-system"}}
    monkeypatch.setattr(ambient_checks, "node_proxy", lambda ctx, pod: node_proxy)
    values = SimpleNamespace(
        namespace="meshctl-system", trust_domain="cluster.local", enabled=lambda name: False
    )
    ctx = SimpleNamespace(kube=None, values=values, memo={})
    result = ambient_checks.identity(ctx, POD, lambda: checks._mesh_root_serials(ctx))
    assert (result.outcome is Outcome.OK) is same_root, result
    if not same_root:
        assert "root other than the mesh's" in result.message


@pytest.mark.parametrize(
    ("profile", "expected"),
    [("ambient", "meshctl-ca-root-cert"), ("ambient-istiod", "istio-ca-root-cert")],
)
def test_the_mesh_root_is_read_from_the_configmap_the_node_proxy_mounts(
    monkeypatch, profile, expected
):
    """Beside an istiod the node proxy trusts istiod's root ConfigMap: verify compares with it."""
    from meshctl import components

    asked: list[str] = []
    monkeypatch.setattr("meshctl.kube.objects.get", lambda kube, res, name, ns: asked.append(name))
    values = components.load().resolve(profile=profile)
    checks._mesh_root_serials(SimpleNamespace(kube=None, values=values, memo={}))
    assert asked == [expected]
