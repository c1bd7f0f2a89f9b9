"""The canary upgrade of docs/upgrade.md on the real node, with traffic through the mesh all along.

The default revision is installed and tag ``prod`` points at it; an app namespace runs a server
Deployment (two replicas, behind a Service) and a client pod that sends one HTTP request through
the mesh to the Service every ~100 ms and counts answers that are not ``200``. Then the user's
steps: install revision ``canary`` beside ``default`` (uninstalling ``default`` is refused while
the tag names it), move the tag (``tag set prod --revision canary --overwrite``), restart the
server, check its new pods are served by canary, uninstall ``default``, then ``meshctl upgrade``
canary in place (a changed value rolls its control plane). Failures are counted per step.

One ambient profile install serves two app namespaces at once:
- sidecar: the namespace is labelled ``istio.io/rev=prod``; the restarted pods' proxies come
  from canary's injector and talk to canary's control plane. Any failed request fails the test.
  The client is not restarted (it keeps counting; its proxy keeps the configuration it holds
  when its control plane goes).
- ambient: the namespace is labelled ambient (a tag chooses no control plane for ambient pods:
  docs/upgrade.md); installing canary re-renders the shared node proxy with canary's address,
  which rolls it: the new node proxy starts beside the old one, takes every pod's listeners too
  and the old one drains only once the new one is Ready (docs/ztunnel.md). Any failed request
  fails the test here too.
Failures are reported per step for both.
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
# came back; the counts are in /tmp/count (ok failed) after every request (renamed into place:
# a reader never sees a half-written file); /tmp/stop ends it.
CLIENT_LOOP = """
ok=0; failed=0
while [ ! -f /tmp/stop ]; do
  line=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 "$TARGET" 8080 2>&1 | head -n 1)
  case "$line" in
    *" 200 "*) ok=$((ok + 1)) ;;
    *) failed=$((failed + 1)); echo "FAIL $(date +%T) [$line]" ;;
  esac
  echo "$ok $failed" > /tmp/count.new && mv /tmp/count.new /tmp/count
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
    ok, failed = done.stdout.split()
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


class App:
    """One namespace's server (two replicas behind a Service) and its counting client."""

    def __init__(self, api: k8s.ApiClient, namespace: str, mode: str) -> None:
        self.api, self.namespace, self.mode = api, namespace, mode
        self.core = k8s.CoreV1Api(api)

    def start(self, image: str, labels: dict[str, str]) -> None:
        self.core.patch_namespace(self.namespace, {"metadata": {"labels": labels}})
        for sa in ("web", "client"):
            self.core.create_namespaced_service_account(self.namespace, {"metadata": {"name": sa}})
        wl.apply(self.api, server(image), self.namespace)

    def start_client(self, image: str) -> None:
        wl.wait_rollout(self.api, "Deployment", self.namespace, "web", timeout=180)
        vip = self.core.read_namespaced_service("web", self.namespace).spec.cluster_ip
        client = wl.busybox_pod(
            "client", image, ["sh", "-c", CLIENT_LOOP], serviceAccountName="client"
        )
        client["spec"]["containers"][0]["env"] = [{"name": "TARGET", "value": vip}]
        wl.apply(self.api, [client], self.namespace)

    def warm(self) -> None:
        """Until the client got answers (discovery carries the Service), then count from there."""
        wl.wait_pod_ready(self.api, self.namespace, "client", timeout=120)
        warm = wl.retry(self.counts_or_none, lambda c: c[0] >= 5, timeout=90)
        assert warm[0] >= 5, f"{self.mode}: the client never reached the server: {warm}"

    def counts(self) -> tuple[int, int]:
        return counts(self.api, self.namespace)

    def counts_or_none(self) -> tuple[int, int]:
        """The counts, (0, 0) before the client wrote any."""
        try:
            return self.counts()
        except ValueError:
            return (0, 0)

    def restarts(self) -> int:
        """How often the client's container restarted (a restart would reset its counts)."""
        pod = self.core.read_namespaced_pod("client", self.namespace)
        return sum(c.restart_count for c in pod.status.container_statuses or [])

    def servers(self) -> list[Any]:
        return wl.pods(self.api, self.namespace, "app=web")

    def restart(self) -> set[str]:
        old = {p.metadata.name for p in self.servers()}
        restarted = {"kubectl.kubernetes.io/restartedAt": str(time.time())}
        k8s.AppsV1Api(self.api).patch_namespaced_deployment(
            "web", self.namespace,
            {"spec": {"template": {"metadata": {"annotations": restarted}}}},
        )  # fmt: skip
        return old

    def restarted(self, old: set[str]) -> list[Any]:
        pods = wl.retry(
            self.servers,
            lambda pods: (
                len(pods) == 2
                and not {p.metadata.name for p in pods} & old
                and all(p.metadata.deletion_timestamp is None and wl.pod_ready(p) for p in pods)
            ),
            timeout=180,
        )
        assert not {p.metadata.name for p in pods} & old, f"{self.mode}: the restart did not end"
        return pods

    def stop(self) -> str:
        wl.pod_exec(self.api, self.namespace, "client", ["touch", "/tmp/stop"], container="main")
        return wl.pod_logs(self.api, self.namespace, "client", container="main", tail=30)


def test_canary_upgrade_with_traffic_throughout(  # noqa: PLR0915 (the user's steps, in order)
    kube_node: TestNode, node_namespace, request
):
    """Sidecar pods (tag ``prod``) and ambient pods, each with a counting client, on one ambient
    profile install (sidecars and the node proxy side by side)."""
    report_namespace(request.node, SYSTEM_NS)
    netns_dir = nodehost.WORKDIR / "containerd" / "state"
    mesh = Mesh(kube_node, "ambient", ["--set", f"components.cni.netnsDir={netns_dir}"])
    canary_plane = f"meshctl-controlplane-canary.{SYSTEM_NS}.svc:15012"
    image = kube_node.image("busybox")
    ambient_ns = f"{node_namespace}-amb"[:63]
    with installed(mesh), kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        apps = k8s.AppsV1Api(api)
        core.create_namespace({"metadata": {"name": ambient_ns}})
        report_namespace(request.node, ambient_ns)
        try:
            wl.wait_service_account(api, ambient_ns)
            wait_bundle(api, "meshctl-sidecar-injector")
            tagged = mesh.run("tag", "set", "prod", "--revision", "default", "-o", "table")
            assert tagged.returncode == 0, tagged.stderr
            sidecar = App(api, node_namespace, "sidecar")
            amb = App(api, ambient_ns, "ambient")
            sidecar.start(image, {"istio.io/rev": "prod"})
            amb.start(image, {AMBIENT_LABEL: "ambient"})
            for app in (sidecar, amb):
                app.start_client(image)
            for app in (sidecar, amb):
                app.warm()
            client = core.read_namespaced_pod("client", node_namespace)
            assert proxy_env(client, "CA_ADDR") == f"meshctl-controlplane.{SYSTEM_NS}.svc:15012"
            steps = {app.mode: Steps(app.counts) for app in (sidecar, amb)}

            def end(step: str) -> None:
                for counted in steps.values():
                    counted.end(step)

            canary = mesh.install("--revision", "canary")
            assert canary.returncode == 0, canary.stderr
            # The shared node proxy now follows canary's control plane (it rolled for that); the
            # old one may still be draining its connections.
            proxies = wl.retry(
                lambda: wl.pods(api, SYSTEM_NS, NODE_PROXY_SELECTOR),
                lambda ps: {env_of(p, "CA_ADDRESS") for p in ps} == {canary_plane},
                timeout=60,
            )
            assert {env_of(p, "CA_ADDRESS") for p in proxies} == {canary_plane}
            # The new proxy took every pod's listeners beside the old one's, and connections
            # queued on the old one's move to it (no "may reset connections" warning).
            (new_proxy,) = proxies
            proxy_log = wl.pod_logs(api, SYSTEM_NS, new_proxy.metadata.name, container="ztunnel")
            assert "tcp_migrate_req" not in proxy_log, proxy_log[-3000:]
            assert "cannot listen on" not in proxy_log, proxy_log[-3000:]
            procfs = [line for line in proxy_log.splitlines() if "pod sysctls" in line]
            print(f"\nnew node proxy, pod sysctls: {procfs or 'written through /proc/sys'}")
            end("install canary")
            refused = mesh.run("uninstall", "-y", "--revision", "default")
            assert refused.returncode == 1, refused.stderr
            assert "still the target of tag(s) prod" in refused.stderr, refused.stderr
            wait_bundle(api, "meshctl-sidecar-injector-canary")
            moved = mesh.run(
                "tag", "set", "prod", "--revision", "canary", "--overwrite", "-o", "json"
            )  # fmt: skip
            assert moved.returncode == 0, moved.stderr
            assert "moved from revision 'default' to 'canary'" in moved.stderr
            listed = json.loads(mesh.run("tag", "list", "-o", "json").stdout)
            assert listed == [{"tag": "prod", "revision": "canary", "namespaces": [node_namespace]}]

            old = {app.mode: app.restart() for app in (sidecar, amb)}
            for pod in sidecar.restarted(old["sidecar"]):  # canary's injector and control plane
                assert pod.metadata.annotations.get("istio.io/rev") == "canary", pod.metadata
                assert proxy_env(pod, "CA_ADDR") == canary_plane, pod.metadata.name
            for pod in amb.restarted(old["ambient"]):  # enrolled, served by the node proxy
                enrolled = wl.retry(
                    lambda name=pod.metadata.name: core.read_namespaced_pod(name, ambient_ns),
                    lambda p: (p.metadata.annotations or {}).get(ambient.REDIRECTION) == "enabled",
                    timeout=60,
                )
                assert enrolled.metadata.annotations[ambient.REDIRECTION] == "enabled"
            end("move the tag, restart the servers")

            removed = mesh.run("uninstall", "-y", "--revision", "default")
            assert removed.returncode == 0, removed.stderr
            left = [d.metadata.name for d in apps.list_namespaced_deployment(SYSTEM_NS).items]
            assert left == ["meshctl-controlplane-canary"], left
            time.sleep(3)
            end("uninstall default")

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
            end("upgrade canary in place")

            # Through the mesh: the server side counted mutual TLS from the client's identity.
            def ids(ns: str) -> tuple[str, str]:
                base = f"spiffe://cluster.local/ns/{ns}/sa"
                return f"{base}/client", f"{base}/web"

            server_pod = sidecar.servers()[0].metadata.name
            metrics = str(
                core.connect_get_namespaced_pod_proxy_with_path(
                    f"{server_pod}:15020", node_namespace, "stats/prometheus"
                )
            )
            assert mtls_lines(metrics, *ids(node_namespace)), metrics[-3000:]
            assert mtls_opened(api, SYSTEM_NS, *ids(ambient_ns)) > 0
            logs = {app.mode: app.stop() for app in (sidecar, amb)}
            report = "\n".join(f"{mode}:\n{s.report()}" for mode, s in steps.items())
            print(f"\ncanary flow:\n{report}\n{logs}")
            request.node.user_properties.append(("canary_flow", report))
            assert (sidecar.restarts(), amb.restarts()) == (0, 0), report
            for counted in steps.values():  # traffic flowed in every step
                assert all(s[1] > s[2] for s in counted.done), f"{report}\n{logs}"
            # No request may fail, sidecar or ambient (the node proxy's rollout is a handover).
            for mode in ("sidecar", "ambient"):
                failed = [s for s in steps[mode].done if s[2]]
                assert not failed, f"{mode}: requests failed:\n{report}\n{logs}"
        finally:
            wl.delete_namespace_now(api, ambient_ns)


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
