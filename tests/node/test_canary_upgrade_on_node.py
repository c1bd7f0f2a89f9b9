"""The canary upgrade of docs/upgrade.md on the real node, with traffic through the mesh all along.

The default revision is installed and tag ``prod`` points at it; an app namespace runs a server
Deployment (two replicas, behind a Service) and a client pod that sends one HTTP request through
the mesh to the Service every ~100 ms and counts answers that are not ``200``. Then the user's
steps: install revision ``canary`` beside ``default`` (uninstalling ``default`` is refused while
the tag names it), move the tag (``tag set prod --revision canary --overwrite``), restart the
server, check its new pods are served by canary, uninstall ``default``, then ``meshctl upgrade``
canary in place (a changed value rolls its control plane). Failures are counted per step.

- sidecar: the namespace is labelled ``istio.io/rev=prod``; the restarted pods' proxies come
  from canary's injector and talk to canary's control plane. Any failed request fails the test.
  The client is not restarted (it keeps counting; its proxy keeps the configuration it holds
  when its control plane goes).
- ambient: the namespace is labelled ambient (a tag chooses no control plane for ambient pods:
  docs/upgrade.md); installing canary re-renders the shared node proxy with canary's address,
  which rolls it: the failures of that step are measured and reported, every other step must
  have none.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s

from meshctl.core.k8s import ambient
from tests.harness import nodehost
from tests.harness import workloads as wl
from tests.harness.ambient_pods import NODE_PROXY_SELECTOR, mtls_opened
from tests.harness.mesh_install import Mesh, installed
from tests.harness.node import TestNode, report_namespace

pytestmark = pytest.mark.node

SYSTEM_NS = "meshctl-system"
APP_PORT = 8080
PROXY = "istio-proxy"
AMBIENT_LABEL = ambient.DATAPLANE_MODE
# The client's loop: one request every ~100 ms; failures are logged with their time and what
# came back; the counts are in /tmp/count (ok failed) after every request; /tmp/stop ends it.
CLIENT_LOOP = """
ok=0; failed=0
while [ ! -f /tmp/stop ]; do
  line=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 "$TARGET" 8080 2>&1 | head -n 1)
  case "$line" in
    *" 200 "*) ok=$((ok + 1)) ;;
    *) failed=$((failed + 1)); echo "FAIL $(date +%T) [$line]" ;;
  esac
  echo "$ok $failed" > /tmp/count
  usleep 100000 2>/dev/null || sleep 1
done
sleep 3600
"""


def server(image: str) -> list[dict[str, Any]]:
    """The server: two replicas, rolled one at a time, each stopping as Kubernetes recommends
    for zero-downtime rollouts (a preStop pause so the endpoint is gone from every client's
    view before the app stops; the native sidecar stops after the app)."""
    probe = {"httpGet": {"path": "/", "port": APP_PORT}, "periodSeconds": 1}
    script = (
        "mkdir -p /tmp/www && echo served > /tmp/www/index.html"
        f" && exec httpd -f -p {APP_PORT} -h /tmp/www"
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "serviceAccountName": "web",
                    "terminationGracePeriodSeconds": 20,
                    "containers": [
                        {
                            "name": "main",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "command": ["sh", "-c", script],
                            "ports": [{"containerPort": APP_PORT, "name": "http"}],
                            "readinessProbe": probe,
                            "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
                        }
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {
            "selector": {"app": "web"},
            "ports": [{"name": "http", "port": APP_PORT, "targetPort": APP_PORT}],
        },
    }
    return [service, deployment]


def proxy_env(pod: Any, name: str) -> str | None:
    containers = [*(pod.spec.init_containers or []), *pod.spec.containers]
    proxy = next(c for c in containers if c.name == PROXY)
    return next((e.value for e in proxy.env or [] if e.name == name), None)


def counts(api: k8s.ApiClient, namespace: str) -> tuple[int, int]:
    done = wl.pod_exec(api, namespace, "client", ["cat", "/tmp/count"], container="main")
    ok, failed = [*done.stdout.split(), "0", "0"][:2]
    return int(ok), int(failed)


def wait_bundle(api: k8s.ApiClient, configuration: str) -> None:
    """Until the revision's leader patched the mesh root into its webhook configuration (what
    ``tag set`` copies)."""
    admission = k8s.AdmissionregistrationV1Api(api)
    wl.retry(
        lambda: admission.read_mutating_webhook_configuration(configuration),
        lambda c: all(w.client_config.ca_bundle for w in c.webhooks),
        timeout=60,
    )


@pytest.mark.parametrize("mode", ["sidecar", "ambient"])
def test_canary_upgrade_with_traffic_throughout(  # noqa: PLR0915 (the user's steps, in order)
    kube_node: TestNode, node_namespace, request, mode
):
    report_namespace(request.node, SYSTEM_NS)
    netns_dir = nodehost.WORKDIR / "containerd" / "state"
    profile = "ambient" if mode == "ambient" else "default"
    mesh = Mesh(kube_node, profile, ["--set", f"components.cni.netnsDir={netns_dir}"])
    canary_plane = f"meshctl-controlplane-canary.{SYSTEM_NS}.svc:15012"
    with installed(mesh), kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        apps = k8s.AppsV1Api(api)
        wait_bundle(api, "meshctl-sidecar-injector")
        tagged = mesh.run("tag", "set", "prod", "--revision", "default", "-o", "table")
        assert tagged.returncode == 0, tagged.stderr
        label = {"istio.io/rev": "prod"} if mode == "sidecar" else {AMBIENT_LABEL: "ambient"}
        core.patch_namespace(node_namespace, {"metadata": {"labels": label}})
        for sa in ("web", "client"):
            core.create_namespaced_service_account(node_namespace, {"metadata": {"name": sa}})
        wl.apply(api, server(kube_node.image("busybox")), node_namespace)
        wl.wait_rollout(api, "Deployment", node_namespace, "web", timeout=180)
        vip = core.read_namespaced_service("web", node_namespace).spec.cluster_ip
        client = wl.busybox_pod(
            "client", kube_node.image("busybox"), ["sh", "-c", CLIENT_LOOP],
            serviceAccountName="client",
        )  # fmt: skip
        client["spec"]["containers"][0]["env"] = [{"name": "TARGET", "value": vip}]
        wl.apply(api, [client], node_namespace)
        wl.wait_pod_ready(api, node_namespace, "client", timeout=120)
        if mode == "sidecar":
            assert proxy_env(core.read_namespaced_pod("client", node_namespace), "CA_ADDR") == (
                f"meshctl-controlplane.{SYSTEM_NS}.svc:15012"
            )
        # Warm-up: until the client's proxy has the Service (discovery), then count from there.
        warm = wl.retry(lambda: counts(api, node_namespace), lambda c: c[0] >= 5, timeout=90)
        assert warm[0] >= 5, f"the client never reached the server: {warm}"
        steps = Steps(lambda: counts(api, node_namespace))

        canary = mesh.install("--revision", "canary")
        assert canary.returncode == 0, canary.stderr
        if mode == "ambient":  # the shared node proxy now follows canary's control plane
            proxies = wl.pods(api, SYSTEM_NS, NODE_PROXY_SELECTOR)
            assert {env_of(p, "CA_ADDRESS") for p in proxies} == {canary_plane}
        steps.end("install canary")
        refused = mesh.run("uninstall", "-y", "--revision", "default")
        assert refused.returncode == 1, refused.stderr
        assert "still the target of tag(s) prod" in refused.stderr, refused.stderr
        wait_bundle(api, "meshctl-sidecar-injector-canary")
        moved = mesh.run("tag", "set", "prod", "--revision", "canary", "--overwrite", "-o", "json")
        assert moved.returncode == 0, moved.stderr
        assert "moved from revision 'default' to 'canary'" in moved.stderr
        listed = json.loads(mesh.run("tag", "list", "-o", "json").stdout)
        using = [node_namespace] if mode == "sidecar" else []
        assert listed == [{"tag": "prod", "revision": "canary", "namespaces": using}]

        old = {p.metadata.name for p in wl.pods(api, node_namespace, "app=web")}
        restarted = {"kubectl.kubernetes.io/restartedAt": str(time.time())}
        apps.patch_namespaced_deployment(
            "web", node_namespace,
            {"spec": {"template": {"metadata": {"annotations": restarted}}}},
        )  # fmt: skip
        pods = wl.retry(
            lambda: wl.pods(api, node_namespace, "app=web"),
            lambda pods: (
                len(pods) == 2
                and not {p.metadata.name for p in pods} & old
                and all(p.metadata.deletion_timestamp is None and wl.pod_ready(p) for p in pods)
            ),
            timeout=180,
        )
        assert not {p.metadata.name for p in pods} & old, "the restart did not finish"
        for pod in pods:  # served by canary: its injector (annotation) and its control plane
            if mode == "sidecar":
                assert pod.metadata.annotations.get("istio.io/rev") == "canary", pod.metadata
                assert proxy_env(pod, "CA_ADDR") == canary_plane, pod.metadata.name
            else:
                enrolled = wl.retry(
                    lambda name=pod.metadata.name: core.read_namespaced_pod(name, node_namespace),
                    lambda p: (p.metadata.annotations or {}).get(ambient.REDIRECTION) == "enabled",
                    timeout=60,
                )
                assert enrolled.metadata.annotations[ambient.REDIRECTION] == "enabled"
        steps.end("move the tag, restart the server")

        removed = mesh.run("uninstall", "-y", "--revision", "default")
        assert removed.returncode == 0, removed.stderr
        left = [d.metadata.name for d in apps.list_namespaced_deployment(SYSTEM_NS).items]
        assert left == ["meshctl-controlplane-canary"], left
        time.sleep(3)
        steps.end("uninstall default")

        upgraded = mesh.run(
            "upgrade", "-y", "--revision", "canary",
            "--set", "components.controlplane.cpu=150m", "--readiness-timeout", "3m",
        )  # fmt: skip
        assert upgraded.returncode == 0, upgraded.stderr
        assert "Deployment meshctl-system/meshctl-controlplane-canary" in upgraded.stdout
        assert "upgraded: every object matches the manifest" in upgraded.stderr
        plane = apps.read_namespaced_deployment("meshctl-controlplane-canary", SYSTEM_NS)
        assert plane.spec.template.spec.containers[0].resources.requests["cpu"] == "150m"
        time.sleep(3)
        steps.end("upgrade canary in place")

        # Through the mesh: the server side counted mutual TLS from the client's identity.
        client_id = f"spiffe://cluster.local/ns/{node_namespace}/sa/client"
        server_id = f"spiffe://cluster.local/ns/{node_namespace}/sa/web"
        if mode == "sidecar":
            metrics = str(
                core.connect_get_namespaced_pod_proxy_with_path(
                    f"{pods[0].metadata.name}:15020", node_namespace, "stats/prometheus"
                )
            )
            assert mtls_lines(metrics, client_id, server_id), metrics[-3000:]
        else:
            assert mtls_opened(api, SYSTEM_NS, client_id, server_id) > 0
        wl.pod_exec(api, node_namespace, "client", ["touch", "/tmp/stop"], container="main")
        logs = wl.pod_logs(api, node_namespace, "client", container="main", tail=40)
        report = steps.report()
        print(f"\ncanary flow ({mode}):\n{report}\n{logs}")
        request.node.user_properties.append((f"canary_{mode}", report))
        assert steps.sent > 100, (report, logs)
        # The ambient node proxy's own rollout is measured, not held to zero (docs/upgrade.md).
        held = [s for s in steps.done if not (mode == "ambient" and s[0] == "install canary")]
        assert not [s for s in held if s[2]], f"requests failed:\n{report}\n{logs}"


def env_of(pod: Any, name: str) -> str | None:
    return next((e.value for c in pod.spec.containers for e in c.env or [] if e.name == name), None)


def mtls_lines(metrics: str, client_id: str, server_id: str) -> list[str]:
    return [
        line
        for line in metrics.splitlines()
        if line.startswith("istio_tcp_connections_opened_total")
        and f'source_principal="{client_id}"' in line
        and f'destination_principal="{server_id}"' in line
        and 'connection_security_policy="mutual_tls"' in line
    ]


class Steps:
    """Requests sent and failed during each step of the flow, from the client's counts."""

    def __init__(self, read: Callable[[], tuple[int, int]]) -> None:
        self.read = read
        self.last = read()
        self.started = time.monotonic()
        self.done: list[tuple[str, int, int, float]] = []  # step, sent, failed, seconds

    def end(self, step: str) -> None:
        now = self.read()
        sent = now[0] - self.last[0] + now[1] - self.last[1]
        self.done.append((step, sent, now[1] - self.last[1], time.monotonic() - self.started))
        self.last, self.started = now, time.monotonic()

    @property
    def sent(self) -> int:
        return sum(s[1] for s in self.done)

    def report(self) -> str:
        rows = [f"  {s}: {n} requests, {f} failed, {t:.0f}s" for s, n, f, t in self.done]
        failed = sum(s[2] for s in self.done)
        return "\n".join([*rows, f"  total: {self.sent} requests, {failed} failed"])
