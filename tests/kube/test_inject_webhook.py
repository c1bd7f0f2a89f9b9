"""The injection webhook behind a real kube-apiserver: pods are stored with their sidecar.

``meshctl inject webhook`` serves on 127.0.0.1 with a test CA; the configuration printed by
``meshctl inject webhook-config --url`` is registered as is (so the API server also validates
it), and pods created through the API come back injected, or not, by the selector matrix.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from meshctl.core.k8s.inject import kinds
from tests.harness.inject_webhook import (
    TEST_IMAGE,
    WebhookProcess,
    start_webhook,
    stop_webhook,
)
from tests.harness.kube import KubeCluster, create_namespace, delete_namespace

pytestmark = pytest.mark.kube

GOLDENS = Path(__file__).resolve().parents[1] / "testdata" / "inject"


def webhook_config(webhook: WebhookProcess) -> dict[str, Any]:
    """What ``meshctl inject webhook-config`` prints for this webhook, as JSON."""
    result = subprocess.run(
        [
            *(sys.executable, "-c", "from meshctl.entry import run; run()"),
            *("inject", "webhook-config", "--url", webhook.url),
            *("--ca-bundle", str(webhook.ca_file), "-o", "json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "MESHCTL_CONFIG": ""},
    )
    config: dict[str, Any] = json.loads(result.stdout)
    return config


@pytest.fixture(scope="module")
def injecting(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookProcess]:
    """The webhook running and registered; removed (and stopped) after the module."""
    webhook = start_webhook(tmp_path_factory.mktemp("inject-webhook"))
    config = webhook_config(webhook)
    name = config["metadata"]["name"]
    with kube_cluster.api_client() as api:
        admission = k8s.AdmissionregistrationV1Api(api)
        try:
            admission.create_mutating_webhook_configuration(config)
            probe_ns = f"inject-probe-{secrets.token_hex(3)}"
            create_namespace(api, probe_ns, {"meshctl-injection": "enabled"})
            try:
                wait_until_injecting(api, probe_ns)
            finally:
                delete_namespace(api, probe_ns)
            yield webhook
        finally:
            with contextlib.suppress(ApiException):
                admission.delete_mutating_webhook_configuration(name)
            assert stop_webhook(webhook) == 0


def wait_until_injecting(api: k8s.ApiClient, namespace: str, timeout: float = 30.0) -> None:
    """The API server learns of webhook configurations through an informer: wait for it."""
    core = k8s.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = core.create_namespaced_pod(namespace, pod_body("probe"), dry_run="All")
        if "istio-proxy" in container_names(pod):
            return
        time.sleep(0.2)
    raise TimeoutError(f"the webhook did not inject pods in {namespace} within {timeout}s")


def pod_body(name: str, labels: dict[str, str] | None = None, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations},
        # Never pulled: nothing runs containers here.
        "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
    }


def container_names(pod: Any) -> list[str]:
    spec = pod.spec
    return [c.name for c in (spec.init_containers or []) + (spec.containers or [])]


@pytest.fixture
def namespace_factory(kube_api: k8s.ApiClient) -> Iterator[Any]:
    created: list[str] = []

    def make(labels: dict[str, str]) -> str:
        name = f"inject-{secrets.token_hex(4)}"
        create_namespace(kube_api, name, labels)
        created.append(name)
        return name

    try:
        yield make
    finally:
        for name in created:
            delete_namespace(kube_api, name)


def stored(api: k8s.ApiClient, namespace: str, body: dict[str, Any]) -> Any:
    """Creates the pod and reads back what the API server stored."""
    core = k8s.CoreV1Api(api)
    created = core.create_namespaced_pod(namespace, body)
    return core.read_namespaced_pod(created.metadata.name, namespace)


def test_pod_in_a_labelled_namespace_is_stored_with_the_sidecar(
    injecting: WebhookProcess, kube_api: k8s.ApiClient, namespace_factory: Any
):
    ns = namespace_factory({"meshctl-injection": "enabled"})
    pod = stored(kube_api, ns, pod_body("web", {"app": "web"}))
    assert container_names(pod) == ["istio-init", "istio-proxy", "app"]
    proxy = pod.spec.init_containers[1]
    assert proxy.restart_policy == "Always"
    assert proxy.image == TEST_IMAGE
    assert proxy.security_context.run_as_user == 1337
    assert pod.metadata.labels["security.istio.io/tlsMode"] == "istio"
    status = json.loads(pod.metadata.annotations["sidecar.istio.io/status"])
    assert status["initContainers"] == ["istio-init", "istio-proxy"]
    assert {v.name for v in pod.spec.volumes} >= {"istio-token", "istiod-ca-cert"}


def test_pod_from_a_deployment_template_is_injected(
    injecting: WebhookProcess, kube_api: k8s.ApiClient, namespace_factory: Any
):
    ns = namespace_factory({"istio-injection": "enabled"})
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "reviews"},
        "spec": {
            "selector": {"matchLabels": {"app": "reviews"}},
            "template": {
                "metadata": {"labels": {"app": "reviews"}},
                "spec": {
                    "containers": [
                        {
                            "name": "reviews",
                            "image": "registry.invalid/reviews:1",
                            "readinessProbe": {"httpGet": {"path": "/ready", "port": 9080}},
                        }
                    ]
                },
            },
        },
    }
    created = k8s.AppsV1Api(kube_api).create_namespaced_deployment(ns, deployment)
    # No controller-manager runs here: make the pod as the ReplicaSet controller would.
    template = deployment["spec"]["template"]
    pod_hash = "6c9d8f7b5"
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"reviews-{pod_hash}-",
            "labels": {**template["metadata"]["labels"], "pod-template-hash": pod_hash},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"reviews-{pod_hash}",
                    "uid": created.metadata.uid,  # any uid; no garbage collector runs
                    "controller": True,
                }
            ],
        },
        "spec": template["spec"],
    }
    pod = stored(kube_api, ns, body)
    assert container_names(pod) == ["istio-init", "istio-proxy", "reviews"]
    env = {e.name: e.value for e in pod.spec.init_containers[1].env}
    assert env["ISTIO_META_WORKLOAD_NAME"] == "reviews"
    probe = pod.spec.containers[0].readiness_probe.http_get
    assert (probe.path, probe.port) == ("/app-health/reviews/readyz", 15020)
    # The API server defaults the probe (scheme, timeout) before mutating webhooks see it.
    assert json.loads(env["ISTIO_KUBE_APP_PROBERS"]) == {
        "/app-health/reviews/readyz": {
            "httpGet": {"path": "/ready", "port": 9080, "scheme": "HTTP"},
            "timeoutSeconds": 1,
        }
    }
    # The Deployment object itself is not a pod: stored as sent.
    stored_deployment = k8s.AppsV1Api(kube_api).read_namespaced_deployment("reviews", ns)
    assert [c.name for c in stored_deployment.spec.template.spec.containers] == ["reviews"]


def test_pod_in_an_unlabelled_namespace_is_not_injected(
    injecting: WebhookProcess, kube_api: k8s.ApiClient, namespace_factory: Any
):
    ns = namespace_factory({})
    pod = stored(kube_api, ns, pod_body("plain", {"app": "plain"}))
    assert container_names(pod) == ["app"]
    assert "sidecar.istio.io/status" not in (pod.metadata.annotations or {})


def test_the_opt_out_label_wins_over_the_namespace(
    injecting: WebhookProcess, kube_api: k8s.ApiClient, namespace_factory: Any
):
    ns = namespace_factory({"meshctl-injection": "enabled"})
    pod = stored(kube_api, ns, pod_body("out", {"sidecar.istio.io/inject": "false"}))
    assert container_names(pod) == ["app"]


def test_the_opt_out_annotation_is_honoured_by_the_handler(
    injecting: WebhookProcess, kube_api: k8s.ApiClient, namespace_factory: Any
):
    ns = namespace_factory({"meshctl-injection": "enabled"})
    body = pod_body("out", None, **{"sidecar.istio.io/inject": "false"})
    assert container_names(stored(kube_api, ns, body)) == ["app"]


def test_the_opt_in_label_injects_in_an_unlabelled_namespace(
    injecting: WebhookProcess, kube_api: k8s.ApiClient, namespace_factory: Any
):
    ns = namespace_factory({})
    pod = stored(kube_api, ns, pod_body("in", {"sidecar.istio.io/inject": "true"}))
    assert "istio-proxy" in container_names(pod)


def test_a_bad_annotation_is_refused_with_its_message(
    injecting: WebhookProcess, kube_api: k8s.ApiClient, namespace_factory: Any
):
    ns = namespace_factory({"meshctl-injection": "enabled"})
    body = pod_body("bad", None, **{"traffic.sidecar.istio.io/excludeInboundPorts": "x"})
    with pytest.raises(ApiException) as caught:
        k8s.CoreV1Api(kube_api).create_namespaced_pod(ns, body)
    assert caught.value.status == 400
    assert (
        "invalid value 'x' for annotation 'traffic.sidecar.istio.io/excludeInboundPorts'"
        in caught.value.body
    )


def test_every_golden_pod_passes_the_api_servers_validation(
    injecting: WebhookProcess, kube_api: k8s.ApiClient, namespace_factory: Any
):
    """What the CLI writes is a valid pod to the API server (dry run, no webhook involved)."""
    ns = namespace_factory({})
    core = k8s.CoreV1Api(kube_api)
    checked = 0
    for golden in sorted(GOLDENS.glob("*.yaml.injected")):
        for number, document in enumerate(yaml.safe_load_all(golden.read_text())):
            claims = (document.get("spec") or {}).get("volumeClaimTemplates") or []
            for template in templates(document):
                body = {"apiVersion": "v1", "kind": "Pod", **template}
                # A StatefulSet's claims become volumes of its pods; stand in with emptyDirs.
                volumes = [{"name": c["metadata"]["name"], "emptyDir": {}} for c in claims]
                body["spec"] = {
                    **body["spec"],
                    "volumes": volumes + (body["spec"].get("volumes") or []),
                }
                metadata = dict(body.get("metadata") or {})
                metadata.pop("namespace", None)
                metadata["name"] = f"golden-{checked}"
                body["metadata"] = metadata
                # ServiceAccounts named in the goldens do not exist in this namespace.
                body["spec"] = {**body["spec"], "serviceAccountName": "default"}
                try:
                    core.create_namespaced_pod(ns, body, dry_run="All")
                except ApiException as exc:
                    pytest.fail(f"{golden.name} document {number + 1}: {exc.body}")
                checked += 1
    assert checked >= 15


def templates(obj: Any) -> list[dict[str, Any]]:
    if not isinstance(obj, dict):
        return []
    if kinds.is_list(obj):
        return [t for item in obj.get("items") or [] for t in templates(item)]
    path = kinds.template_path(obj)
    if path is None:
        return []
    for part in path:
        obj = obj[part]
    return [obj]


def test_an_annotation_without_effect_reaches_the_client_as_an_api_warning(
    injecting: WebhookProcess, kube_api: k8s.ApiClient, namespace_factory: Any
):
    ns = namespace_factory({"meshctl-injection": "enabled"})
    body = pod_body("warned", None, **{"sidecar.istio.io/bootstrapOverride": "custom"})
    pod, _, headers = k8s.CoreV1Api(kube_api).create_namespaced_pod_with_http_info(ns, body)
    assert "istio-proxy" in container_names(pod)
    # RFC 7234 warn-code 299, as the API server relays admission warnings (kubectl prints them).
    assert "annotation 'sidecar.istio.io/bootstrapOverride' is not supported by meshctl" in (
        headers.get("Warning") or ""
    )
