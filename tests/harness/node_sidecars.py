"""Sidecar-mode meshes on the real node: the injection webhook on the host, file-fed proxies.

Owns: ``meshctl inject webhook`` on the host registered by ``meshctl inject webhook-config
--url`` (the apiserver runs on the host, so 127.0.0.1 reaches it), and what a mesh without a
control plane gives each injected proxy through Istio's pod annotations: its certificate in a
Secret minted by ``meshctl ztunnel certs`` (``sidecar.istio.io/userVolume``/``userVolumeMount``
at the proxy's cert dir) and the workloads in a ConfigMap (``LOCAL_XDS_PATH`` through
``proxy.istio.io/config`` ``proxyMetadata``), which the proxies re-read when it changes.
Invariant: the webhook configuration and the process are gone when ``injecting`` exits.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from meshctl.core.k8s.inject.render import CERTS_PATH
from meshctl.core.k8s.inject.settings import InjectSettings
from tests.harness.cli import run_meshctl
from tests.harness.inject_webhook import WebhookProcess, start_webhook, stop_webhook
from tests.harness.kube import mutating_webhook_configuration

INJECTION_LABEL = {"meshctl-injection": "enabled"}
WORKLOADS_CONFIGMAP = "mesh-workloads"
WORKLOADS_DIR = "/etc/mesh-workloads"
WORKLOADS_FILE = "workloads.yaml"


def _meshctl(*args: str) -> str:
    out = run_meshctl(*args)
    if out.returncode != 0:
        raise RuntimeError(f"meshctl {' '.join(args)} exited {out.returncode}: {out.stderr}")
    return out.stdout


@contextlib.contextmanager
def injecting(api: k8s.ApiClient, workdir: Path, image: str) -> Iterator[WebhookProcess]:
    """The webhook on the host, injecting ``image``, registered for labelled namespaces."""
    workdir.mkdir(parents=True, exist_ok=True)
    webhook = start_webhook(workdir, image=image)
    try:
        config = json.loads(
            _meshctl(
                *("inject", "webhook-config", "--url", webhook.url),
                *("--ca-bundle", str(webhook.ca_file), "-o", "json"),
            )
        )
        with mutating_webhook_configuration(api, config):
            yield webhook
    finally:
        stop_webhook(webhook)


def enable_injection(api: k8s.ApiClient, namespace: str, timeout: float = 30) -> None:
    """Labels ``namespace`` for injection and waits until the apiserver calls the webhook (it
    learns of webhook configurations through an informer)."""
    core = k8s.CoreV1Api(api)
    core.patch_namespace(namespace, {"metadata": {"labels": INJECTION_LABEL}})
    probe = {
        "metadata": {"name": "injection-probe"},
        "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
    }
    deadline = time.monotonic() + timeout
    while True:
        pod = core.create_namespaced_pod(namespace, probe, dry_run="All")
        if any(c.name == "istio-proxy" for c in pod.spec.init_containers or ()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the webhook did not inject pods in {namespace} in {timeout}s")
        time.sleep(0.3)


def publish_certificates(
    api: k8s.ApiClient, namespace: str, accounts: Sequence[str], workdir: Path
) -> None:
    """One Secret ``<account>-certs`` per ServiceAccount (created too) from ``meshctl ztunnel
    certs`` with one development CA, whose root is also the namespace's mesh root ConfigMap."""
    core = k8s.CoreV1Api(api)
    ca_dir = workdir / "ca"
    for account in accounts:
        out = workdir / account
        _meshctl(
            *("ztunnel", "certs", "--out", str(out), "--ca-dir", str(ca_dir)),
            *("--workload", f"{namespace}/{account}/{account}"),
        )
        files = {p.name: p.read_text() for p in sorted(out.iterdir()) if p.suffix == ".pem"}
        core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
        core.create_namespaced_secret(
            namespace, {"metadata": {"name": f"{account}-certs"}, "stringData": files}
        )
    root = (ca_dir / "ca-cert.pem").read_text()
    core.create_namespaced_config_map(
        namespace,
        {
            "metadata": {"name": InjectSettings().root_ca_configmap},
            "data": {"root-cert.pem": root},
        },
    )


def mesh_annotations(account: str) -> dict[str, str]:
    """A pod template's annotations: the account's Secret at the proxy's cert dir, the
    workloads ConfigMap as its local config."""
    volumes = {
        "mesh-certs": {"secret": {"secretName": f"{account}-certs"}},
        "mesh-workloads": {"configMap": {"name": WORKLOADS_CONFIGMAP}},
    }
    mounts = {
        "mesh-certs": {"mountPath": CERTS_PATH, "readOnly": True},
        "mesh-workloads": {"mountPath": WORKLOADS_DIR, "readOnly": True},
    }
    config = {"proxyMetadata": {"LOCAL_XDS_PATH": f"{WORKLOADS_DIR}/{WORKLOADS_FILE}"}}
    return {
        "sidecar.istio.io/userVolume": json.dumps(volumes),
        "sidecar.istio.io/userVolumeMount": json.dumps(mounts),
        "proxy.istio.io/config": json.dumps(config),
    }


def pod_workload(pod: Any) -> dict[str, Any]:
    """A running pod as a workload of the local config (HBONE: it has our sidecar)."""
    meta = pod.metadata
    return {
        "uid": f"Kubernetes//Pod/{meta.namespace}/{meta.name}",
        "name": meta.name,
        "namespace": meta.namespace,
        "serviceAccount": pod.spec.service_account_name,
        "workloadIps": [pod.status.pod_ip],
        "protocol": "HBONE",
        "services": {},  # backs no Service (the local config asks for the field)
    }


def publish_workloads(api: k8s.ApiClient, namespace: str, pods: Sequence[Any]) -> None:
    """Creates or replaces the workloads ConfigMap with ``pods``."""
    document = yaml.safe_dump({"workloads": [pod_workload(p) for p in pods]})
    body = {"metadata": {"name": WORKLOADS_CONFIGMAP}, "data": {WORKLOADS_FILE: document}}
    core = k8s.CoreV1Api(api)
    try:
        core.replace_namespaced_config_map(WORKLOADS_CONFIGMAP, namespace, body)
    except ApiException as exc:
        if exc.status != 404:  # not there yet
            raise
        core.create_namespaced_config_map(namespace, body)


def deployment(
    name: str, account: str, containers: list[dict[str, Any]], replicas: int = 1
) -> dict[str, Any]:
    """A Deployment whose pods the webhook meshes with ``account``'s certificate."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": mesh_annotations(account)},
                "spec": {
                    "serviceAccountName": account,
                    "terminationGracePeriodSeconds": 1,
                    "containers": containers,
                },
            },
        },
    }
