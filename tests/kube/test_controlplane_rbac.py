"""The control plane's manifest against the real API server: every object is accepted, and the
process does all of its work with exactly the RBAC the manifest grants (its ServiceAccount's
token, no admin), so the least-privilege rules are proven sufficient, not just written down."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from meshctl_plugins.controlplane.manifest import ControlPlaneValues
from meshctl_plugins.controlplane.manifest import objects as manifest_objects

from meshctl.core.k8s.install.components import InstallValues
from meshctl.kube import api as raw
from meshctl.kube import objects
from meshctl.kube.client import KubeSettings, connect
from meshctl.kube.resources import Resource
from tests.harness import controlplane as cp
from tests.harness.kube import (
    SA_ISSUER,
    KubeCluster,
    create_namespace,
    delete_namespace,
    request_token,
)

pytestmark = pytest.mark.kube

_RESOURCES = {
    "ServiceAccount": Resource("", "v1", "serviceaccounts", "ServiceAccount"),
    "ClusterRole": Resource(
        "rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False
    ),
    "ClusterRoleBinding": Resource(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        namespaced=False,
    ),
    "Role": Resource("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    "RoleBinding": Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    "Service": Resource("", "v1", "services", "Service"),
    "Deployment": Resource("apps", "v1", "deployments", "Deployment"),
    "PodDisruptionBudget": Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget"),
    "MutatingWebhookConfiguration": Resource(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        namespaced=False,
    ),
}
# Applied for real (the process needs them); the rest are checked with a server-side dry run.
_APPLIED = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "MutatingWebhookConfiguration",
}


@pytest.fixture
def installed(kube_cluster: KubeCluster) -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    home, revision = f"cp-{secrets.token_hex(3)}", f"r{secrets.token_hex(3)}"
    kube = connect(KubeSettings(kubeconfig=str(kube_cluster.kubeconfig)))
    install = InstallValues(namespace=home, revision=revision, image_pull_policy="")
    items = manifest_objects(install, ControlPlaneValues())
    with kube_cluster.api_client() as api, contextlib.ExitStack() as undo:
        create_namespace(api, home)
        undo.callback(delete_namespace, api, home)
        undo.callback(kube.api.close)
        for item in items:
            resource = _RESOURCES[item["kind"]]
            ns = home if resource.namespaced else None
            if item["kind"] in _APPLIED:
                objects.create(kube, resource, item, ns)
                if not resource.namespaced:
                    undo.callback(objects.delete, kube, resource, item["metadata"]["name"])
            else:
                raw.request(kube, "POST", resource.path(ns), query=[("dryRun", "All")], body=item)
        yield home, revision, items


def _token_kubeconfig(cluster: KubeCluster, token: str, path: Path) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": cluster.server,
                    "certificate-authority-data": base64.b64encode(cluster.ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "sa"}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def _wait(what: str, check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ApiException):
            value = check()
            if value:
                return value
        time.sleep(0.1)
    raise TimeoutError(what)


undo_objects: list[str] = []


@pytest.fixture(autouse=True)
def _delete_made_configurations(kube_api: k8s.ApiClient) -> Iterator[None]:
    yield
    admission = k8s.AdmissionregistrationV1Api(kube_api)
    while undo_objects:
        with contextlib.suppress(ApiException):
            admission.delete_mutating_webhook_configuration(undo_objects.pop())


def _stale_copy(api: k8s.ApiClient, source: str, name: str, labels: dict[str, str]) -> str:
    """A copy of ``source``'s webhooks under ``name`` with a stale caBundle, matching no
    namespace (so it never takes part in another test's admissions)."""
    admission = k8s.AdmissionregistrationV1Api(api)
    webhooks = api.sanitize_for_serialization(
        admission.read_mutating_webhook_configuration(source).webhooks
    )
    for hook in webhooks:
        hook["clientConfig"]["caBundle"] = base64.b64encode(b"old").decode()
        hook["namespaceSelector"] = {"matchLabels": {"meshctl-test-never": "true"}}
        hook.pop("objectSelector", None)
    body = {"metadata": {"name": name, "labels": labels}, "webhooks": webhooks}
    admission.create_mutating_webhook_configuration(body)
    return name


def test_the_control_plane_works_with_only_the_rbac_its_manifest_grants(
    kube_cluster: KubeCluster,
    kube_api: k8s.ApiClient,
    kube_namespace: str,
    installed: tuple[str, str, list[dict[str, Any]]],
    tmp_path: Path,
) -> None:
    home, revision, items = installed
    account = next(i for i in items if i["kind"] == "ServiceAccount")["metadata"]["name"]
    token = request_token(kube_cluster, home, account, SA_ISSUER, create=False)
    kubeconfig = _token_kubeconfig(kube_cluster, token, tmp_path / "sa.kubeconfig")
    with cp.running(
        kube_cluster,
        home,
        tmp_path,
        "--trusted-node-accounts",
        f"{home}/meshctl-ztunnel",
        revision=revision,
        kubeconfig=kubeconfig,
    ) as plane:
        root = cp.root_pem(kube_api, home)  # the Secret it created (create + get in its Role)
        core = k8s.CoreV1Api(kube_api)

        # TokenReview, and impersonation checks reading pods on a node.
        node_token = cp.pod_token(kube_cluster, home, "meshctl-ztunnel", "zt-1")
        cp.pod_token(kube_cluster, kube_namespace, "web", "web-1")
        web = f"spiffe://cluster.local/ns/{kube_namespace}/sa/web"

        async def impersonate() -> list[str]:
            async with plane.channel(root, node_token) as channel:
                return await cp.create_certificate(channel, cp.csr(web)[0], impersonate=web)

        assert asyncio.run(impersonate())[-1].encode() == root

        # Root distribution in a namespace made now (watch namespaces, create configmaps).
        def published() -> bool:
            cm = core.read_namespaced_config_map("meshctl-ca-root-cert", kube_namespace)
            return (cm.data or {}).get("root-cert.pem") == root.decode()

        _wait("root ConfigMap", published)

        # The caBundle of its own webhook configuration (watch + patch by name).
        name = next(i for i in items if i["kind"] == "MutatingWebhookConfiguration")["metadata"][
            "name"
        ]
        admission = k8s.AdmissionregistrationV1Api(kube_api)

        def patched() -> bool:
            stored = admission.read_mutating_webhook_configuration(name)
            return all(w.client_config.ca_bundle for w in stored.webhooks)

        _wait("caBundle patched", patched)

        # A revision tag's configuration (as `meshctl tag set` writes it, with a stale bundle)
        # follows the roots too; a configuration of the same revision that meshctl did not write
        # as a tag is left alone.
        own = admission.read_mutating_webhook_configuration(name)
        wanted = own.webhooks[0].client_config.ca_bundle
        tag_labels = {"istio.io/tag": "t1", "istio.io/rev": revision,
                      "app.kubernetes.io/managed-by": "meshctl"}  # fmt: skip
        tag = _stale_copy(kube_api, name, f"meshctl-revision-tag-t1-{revision}", tag_labels)
        foreign = _stale_copy(kube_api, name, f"foreign-{revision}", {"istio.io/rev": revision})
        for made in (tag, foreign):
            undo_objects.append(made)

        def tag_patched() -> bool:
            stored = admission.read_mutating_webhook_configuration(tag)
            return all(w.client_config.ca_bundle == wanted for w in stored.webhooks)

        _wait("tag's caBundle patched", tag_patched)
        stale = admission.read_mutating_webhook_configuration(foreign).webhooks
        assert all(w.client_config.ca_bundle == base64.b64encode(b"old").decode() for w in stale)
        lease = k8s.CoordinationV1Api(kube_api).read_namespaced_lease(
            f"meshctl-controlplane-{revision}-leader", home
        )
        assert lease.spec.holder_identity
        tail = plane.log_tail(200)
        # The message after each line's timestamp (whose milliseconds may read 403 themselves).
        messages = [line.split(" ", 2)[-1] for line in tail.splitlines()]
        refused = [m for m in messages if re.search(r"\b403\b|forbidden", m, re.IGNORECASE)]
        assert refused == [], tail
