"""``meshctl install``, ``verify`` and ``uninstall`` on the real node, from the meshctl image.

The user's path: ``meshctl install --profile default -y`` from this checkout (the CLI), the mesh's
pods from the meshctl image the node imported; then an app Deployment of two replicas in a
namespace labelled for injection: the webhook injects it, its HTTP probes pass through the proxy,
and the two pods talk with mutual TLS and identities from the control plane's CA. ``verify`` is
all ✔ on that, names what we break, and is all ✔ again after a second install. The tests of this
module run in order on one install; the last one removes it with ``--purge``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from meshctl.core.k8s.cni.spec import PLUGIN_TYPE
from tests.harness import nodehost
from tests.harness import workloads as wl
from tests.harness.mesh_install import (
    OURS,
    Mesh,
    failing,
    installed,
    ours,
)
from tests.harness.node import CNI_CONF_DIR, CONFLIST_NAME, TestNode, report_namespace

pytestmark = pytest.mark.node

SYSTEM_NS = "meshctl-system"
APP_PORT = 8080
PROXY = "istio-proxy"


def resource_versions(node: TestNode) -> dict[str, str]:
    listed = node.cluster.kubectl_run(
        "get", "all,configmaps,secrets,serviceaccounts,roles,rolebindings,clusterroles,"
        "clusterrolebindings,mutatingwebhookconfigurations,customresourcedefinitions,"
        "poddisruptionbudgets,namespaces",
        "-A", "-l", OURS, "-o", "json",
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    items = json.loads(listed.stdout)["items"]
    return {
        f"{i['kind']}/{i['metadata'].get('namespace', '')}/{i['metadata']['name']}": i["metadata"][
            "resourceVersion"
        ]
        for i in items
        if i["kind"] not in ("Pod", "ReplicaSet", "ControllerRevision", "Endpoints")
    }


@pytest.fixture(scope="module")
def mesh(kube_node: TestNode) -> Iterator[Mesh]:
    # CNI-mode injection: the CNI agent enters the pods' netns where this node pins them.
    netns_dir = nodehost.WORKDIR / "containerd" / "state"
    with installed(
        Mesh(kube_node, extra=["--set", f"components.cni.netnsDir={netns_dir}"])
    ) as mesh:
        yield mesh


def test_default_install_is_ready_and_verify_is_all_green(kube_node: TestNode, mesh: Mesh):
    with kube_node.cluster.api_client() as api:
        running = wl.pods(api, SYSTEM_NS)
        assert running, "no pods in meshctl-system"
        for pod in running:
            assert pod.status.phase == "Running", pod.metadata.name
            assert wl.pod_ready(pod), pod.metadata.name
        assert {c.image for p in running for c in p.spec.containers} == {mesh.image}
    code, checks, printed = mesh.verify()
    assert code == 0, printed
    assert not failing(checks), printed
    table = mesh.run("verify", timeout=60)
    assert table.returncode == 0, table.stdout + table.stderr
    assert "✔" in table.stdout, table.stdout
    assert "✘" not in table.stdout, table.stdout


def test_the_dry_run_manifest_is_valid_for_the_api_server(
    kube_node: TestNode, mesh: Mesh, tmp_path
):
    """``install --dry-run -o yaml`` of the same values: ``kubectl apply --dry-run=server``
    takes every object (as a second applier, so it is validated, admitted and not written)."""
    printed = mesh.run("install", "--dry-run", "-o", "yaml", *mesh.values, timeout=60)
    assert printed.returncode == 0, printed.stderr
    assert "&id" not in printed.stdout
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(printed.stdout)
    checked = kube_node.cluster.kubectl_run(
        "apply", "--dry-run=server", "--server-side", "--field-manager=meshctl", "-f", str(manifest)
    )
    assert checked.returncode == 0, checked.stderr
    assert "(server dry run)" in checked.stdout, checked.stdout


def test_install_twice_changes_nothing(kube_node: TestNode, mesh: Mesh):
    before = resource_versions(kube_node)
    again = mesh.install()
    assert again.returncode == 0, again.stderr
    after = resource_versions(kube_node)
    moved = {k: (v, after.get(k)) for k, v in before.items() if after.get(k) != v}
    assert not moved, moved
    assert set(after) == set(before)


def app_deployment(image: str) -> dict[str, Any]:
    probe = {"httpGet": {"path": "/", "port": APP_PORT}, "periodSeconds": 2}
    # The test image runs as nobody (65534): only /tmp is writable.
    script = (
        "mkdir -p /tmp/www && echo served > /tmp/www/index.html"
        f" && exec httpd -f -p {APP_PORT} -h /tmp/www"
    )
    command = ["sh", "-c", script]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "serviceAccountName": "web",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "main",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "command": command,
                            "ports": [{"containerPort": APP_PORT, "name": "http"}],
                            "readinessProbe": probe,
                            "livenessProbe": probe,
                        }
                    ],
                },
            },
        },
    }


def test_injected_app_probes_and_mtls(kube_node: TestNode, mesh: Mesh, node_namespace, request):
    report_namespace(request.node, SYSTEM_NS)
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        core.patch_namespace(
            node_namespace, {"metadata": {"labels": {"istio-injection": "enabled"}}}
        )
        core.create_namespaced_service_account(node_namespace, {"metadata": {"name": "web"}})
        wl.apply(api, [app_deployment(kube_node.image("busybox"))], node_namespace)
        wl.wait_rollout(api, "Deployment", node_namespace, "web", timeout=180)
        pods = wl.pods(api, node_namespace, "app=web")
        assert len(pods) == 2
        for pod in pods:
            names = [c.name for c in [*(pod.spec.init_containers or []), *pod.spec.containers]]
            assert PROXY in names, names
            main = next(c for c in pod.spec.containers if c.name == "main")
            # The probes were rewritten to the proxy's status port (they pass through it).
            assert main.readiness_probe.http_get.port == 15020, main.readiness_probe
            assert main.liveness_probe.http_get.port == 15020, main.liveness_probe
        client, server = pods
        target = f"http://{server.status.pod_ip}:{APP_PORT}/"

        def get(pod: str, ip: str, port: int, path: str) -> Any:
            # nc, not the static busybox's wget (which crashes in these pods).
            request = f"printf 'GET {path} HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {ip} {port}"
            return wl.pod_exec(
                api, node_namespace, pod, ["sh", "-c", request], container="main", timeout=20
            )

        last: list[Any] = []

        def fetched() -> bool:
            done = get(client.metadata.name, server.status.pod_ip, APP_PORT, "/")
            last[:] = [done]
            return " 200 " in done.stdout.split("\r\n", 1)[0] and done.stdout.endswith("served\n")

        deadline = time.monotonic() + 60  # until discovery carries both pods as meshed
        while not fetched():
            if time.monotonic() > deadline:
                dumps = {
                    p.metadata.name: get(p.metadata.name, "127.0.0.1", 15000, "/config_dump")
                    for p in pods
                }
                pytest.fail(f"{client.metadata.name} never fetched {target}: {last}\n{dumps}")
            time.sleep(1)
        identity = f"spiffe://cluster.local/ns/{node_namespace}/sa/web"
        text = core.connect_get_namespaced_pod_proxy_with_path(
            f"{server.metadata.name}:15020", node_namespace, "stats/prometheus"
        )
        lines = [
            line
            for line in str(text).splitlines()
            if line.startswith("istio_tcp_connections_opened_total")
            and f'source_principal="{identity}"' in line
            and f'destination_principal="{identity}"' in line
            and 'connection_security_policy="mutual_tls"' in line
        ]
        assert lines, str(text)[-3000:]
        workload = mesh.run("verify", "--workload", f"{node_namespace}/{server.metadata.name}")
        assert workload.returncode == 0, workload.stdout + workload.stderr


def test_verify_names_what_is_broken_and_install_repairs_it(kube_node: TestNode, mesh: Mesh):
    with kube_node.cluster.api_client() as api:
        admission = k8s.AdmissionregistrationV1Api(api)
        apps = k8s.AppsV1Api(api)
        admission.delete_mutating_webhook_configuration("meshctl-sidecar-injector")
        apps.patch_namespaced_deployment(
            "meshctl-controlplane", SYSTEM_NS,
            {"spec": {"replicas": 0, "template": {"spec": {"containers": [
                {"name": "discovery", "image": "localhost/somebody-else:1"}]}}}},
        )  # fmt: skip
        # Our entry out of the node's conflist (another installer rewrote it).
        conflist = CNI_CONF_DIR / CONFLIST_NAME
        data = json.loads(conflist.read_text())
        data["plugins"] = [p for p in data["plugins"] if p.get("type") != PLUGIN_TYPE]
        conflist.write_text(json.dumps(data))
        code, checks, printed = mesh.verify()
        assert code == 3, printed
        broken = failing(checks)
        text = json.dumps(broken)
        assert "meshctl-sidecar-injector" in text, printed
        assert "replicas" in text, printed
        assert "localhost/somebody-else:1" in text, printed
        assert all(c.get("hint") for c in broken.values()), printed
        # The node agent puts the entry back within its poll interval; verify says it did.
        cni = next(c for n, c in checks.items() if "CNI config" in n)
        assert cni["result"] in ("warning", "error"), printed
        assert kube_node.cluster.node_name in json.dumps(cni), printed
        assert cni.get("hint"), printed
        repaired = mesh.install()
        assert repaired.returncode == 0, repaired.stderr
        assert any(
            p.get("type") == PLUGIN_TYPE for p in json.loads(conflist.read_text())["plugins"]
        )
        code, checks, printed = mesh.verify("--wait", "90s")
        assert not failing(checks), printed


def seed_003_webhook() -> dict[str, Any]:
    """Seed 003's leftover of a failed Istio install (its metadata and clientConfig; the rules
    and selector of Istio's injector, which the seed's excerpt cuts off)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {
            "name": "w-istio-sidecar-injector-istio-system",
            "labels": {"app": "sidecar-injector"},
        },
        "webhooks": [
            {
                "name": "sidecar-injector.istio.io",
                "admissionReviewVersions": ["v1beta1", "v1"],
                "clientConfig": {
                    "service": {"name": "istiod", "namespace": "istio-system", "path": "/inject"}
                },
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"istio-injection": "enabled"}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
            }
        ],
    }


def test_seed_003_leftovers_are_explained_and_force_converges(kube_node: TestNode, mesh: Mesh):
    """Seed 003: a failed install left a webhook that would intercept our pods, and an object
    with our name that is not ours."""
    ours_name = "meshctl-sidecar-injector"
    leftover = seed_003_webhook()
    with kube_node.cluster.api_client() as api:
        admission = k8s.AdmissionregistrationV1Api(api)
        admission.delete_mutating_webhook_configuration(ours_name)
        same_name = json.loads(json.dumps(leftover))
        same_name["metadata"]["name"] = ours_name
        admission.create_mutating_webhook_configuration(same_name)
        admission.create_mutating_webhook_configuration(leftover)
        try:
            refused = mesh.install()
            assert refused.returncode != 0, refused.stderr
            for named in (ours_name, "w-istio-sidecar-injector-istio-system", "--force"):
                assert named in refused.stderr, refused.stderr
            assert "Traceback" not in refused.stderr
            kept = admission.read_mutating_webhook_configuration(ours_name)
            assert kept.webhooks[0].name == "sidecar-injector.istio.io"  # untouched
            forced = mesh.install("--force")
            assert forced.returncode == 0, forced.stderr
            adopted = admission.read_mutating_webhook_configuration(ours_name)
            assert OURS in (adopted.metadata.labels or {})
            assert all(w.name != "sidecar-injector.istio.io" for w in adopted.webhooks)
            names = [m.metadata.name for m in admission.list_mutating_webhook_configuration().items]
            assert "w-istio-sidecar-injector-istio-system" not in names
        finally:
            with contextlib.suppress(ApiException):
                admission.delete_mutating_webhook_configuration(
                    "w-istio-sidecar-injector-istio-system"
                )
            left = admission.read_mutating_webhook_configuration(ours_name)
            if OURS not in (left.metadata.labels or {}):  # the next tests need ours back
                admission.delete_mutating_webhook_configuration(ours_name)
                mesh.install()
    code, _, printed = mesh.verify("--wait", "60s")
    assert code == 0, printed


def proxy_env(pod: Any, name: str) -> str | None:
    containers = [*(pod.spec.init_containers or []), *pod.spec.containers]
    proxy = next(c for c in containers if c.name == PROXY)
    return next((e.value for e in proxy.env or [] if e.name == name), None)


def test_upgrade_by_revision(kube_node: TestNode, mesh: Mesh, node_namespace, request):
    """A canary control plane beside the default one; a namespace moved onto it by its label;
    its pods restarted onto canary; then the default revision uninstalled."""
    report_namespace(request.node, SYSTEM_NS)
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        apps = k8s.AppsV1Api(api)
        core.patch_namespace(
            node_namespace, {"metadata": {"labels": {"istio-injection": "enabled"}}}
        )
        core.create_namespaced_service_account(node_namespace, {"metadata": {"name": "web"}})
        wl.apply(api, [app_deployment(kube_node.image("busybox"))], node_namespace)
        wl.wait_rollout(api, "Deployment", node_namespace, "web", timeout=180)
        before = wl.pods(api, node_namespace, "app=web")
        assert {proxy_env(p, "CA_ADDR") for p in before} == {
            f"meshctl-controlplane.{SYSTEM_NS}.svc:15012"
        }
        canary = mesh.install("--revision", "canary")
        assert canary.returncode == 0, canary.stderr
        assert apps.read_namespaced_deployment("meshctl-controlplane", SYSTEM_NS)
        assert apps.read_namespaced_deployment("meshctl-controlplane-canary", SYSTEM_NS)
        # Istio's move: drop istio-injection, label the namespace with the revision.
        core.patch_namespace(
            node_namespace,
            {"metadata": {"labels": {"istio-injection": None, "istio.io/rev": "canary"}}},
        )
        restarted = {"kubectl.kubernetes.io/restartedAt": str(time.time())}
        apps.patch_namespaced_deployment(
            "web", node_namespace,
            {"spec": {"template": {"metadata": {"annotations": restarted}}}},
        )  # fmt: skip
        wl.retry(
            lambda: wl.pods(api, node_namespace, "app=web"),
            lambda pods: (
                len(pods) == 2
                and all(p.metadata.deletion_timestamp is None and wl.pod_ready(p) for p in pods)
                and {proxy_env(p, "CA_ADDR") for p in pods}
                == {f"meshctl-controlplane-canary.{SYSTEM_NS}.svc:15012"}
            ),
            timeout=180,
        )
        removed = mesh.run("uninstall", "-y", "--revision", "default")
        assert removed.returncode == 0, removed.stderr
        left = [d.metadata.name for d in apps.list_namespaced_deployment(SYSTEM_NS).items]
        assert left == ["meshctl-controlplane-canary"], left
        # The shared parts stay for the remaining revision.
        assert apps.read_namespaced_daemon_set("meshctl-cni-node", SYSTEM_NS)
        code, _, printed = mesh.verify("--revision", "canary", "--wait", "60s")
        assert code == 0, printed


def test_uninstall_purge_leaves_nothing(kube_node: TestNode, mesh: Mesh):
    removed = mesh.run("uninstall", "-y", "--purge", timeout=300)
    assert removed.returncode == 0, removed.stderr
    assert ours(kube_node) == []
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        names = [n.metadata.name for n in core.list_namespace().items]
        maps = [c.metadata.name for c in core.list_config_map_for_all_namespaces().items]
        secrets = [c.metadata.name for c in core.list_secret_for_all_namespaces().items]
        hooks = k8s.AdmissionregistrationV1Api(api).list_mutating_webhook_configuration().items
    assert SYSTEM_NS not in names
    assert not [m for m in maps if m.startswith("meshctl-")], maps
    assert not [s for s in secrets if s.startswith("meshctl-")], secrets
    assert not [h.metadata.name for h in hooks if h.metadata.name.startswith("meshctl-")]
    # The node's CNI config is as the DaemonSet's cleanup leaves it: without our entry.
    plugins = json.loads((CNI_CONF_DIR / CONFLIST_NAME).read_text())["plugins"]
    assert all(p.get("type") != PLUGIN_TYPE for p in plugins), plugins
