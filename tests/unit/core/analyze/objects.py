"""Kubernetes objects as the analysis tests build them: a healthy meshed namespace and the
pieces a test breaks, and a run of the checks over them."""

from __future__ import annotations

from typing import Any

from meshctl.core.analyze.findings import Finding
from meshctl.core.analyze.run import Scope, analyze
from meshctl.core.analyze.snapshot import Item, Snapshot
from meshctl.core.k8s.inject.webhook_config import WebhookTarget, webhook_configuration

Obj = dict[str, Any]


def namespace(name: str, **labels: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def pod(
    name: str, ns: str = "shop", labels: dict[str, str] | None = None, *, sidecar: bool = True,
    ports: tuple[int, ...] = (8080,), annotations: dict[str, str] | None = None, **spec: Any,
) -> Obj:  # fmt: skip
    containers: list[Obj] = [
        {
            "name": "app",
            "image": "app",
            "ports": [{"containerPort": p, "name": f"http-{p}"} for p in ports],
        }
    ]
    meta: Obj = {"name": name, "namespace": ns, "labels": labels or {"app": "web"}}
    meta["annotations"] = dict(annotations or {})
    if sidecar:
        containers.append({"name": "istio-proxy", "image": "meshctl"})
        meta["annotations"]["sidecar.istio.io/status"] = "{}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": containers, **spec},
        "status": {"phase": "Running"},
    }


def deployment(name: str, ns: str, labels: dict[str, str], ports: tuple[int, ...] = ()) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [{"name": "c", "ports": [{"containerPort": p} for p in ports]}]
                },
            },
        },
    }


def control_plane(ns: str = "meshctl-system", revision: str = "default") -> Obj:
    labels = {"app.kubernetes.io/name": "meshctl-controlplane", "istio.io/rev": revision}
    name = "meshctl-controlplane" + ("" if revision == "default" else f"-{revision}")
    return deployment(name, ns, labels)


def node_proxy(ns: str = "meshctl-system") -> Obj:
    obj = deployment("meshctl-ztunnel", ns, {"app.kubernetes.io/name": "meshctl-ztunnel"})
    obj["kind"] = "DaemonSet"
    return obj


def injector(revision: str = "default") -> Obj:
    target = WebhookTarget(service="meshctl-controlplane")
    return webhook_configuration(ca_bundle=None, target=target, revision=revision)


def service(name: str, ns: str, ports: list[Obj], selector: dict[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": selector or {"app": "web"}, "ports": ports},
    }


def policy(name: str, ns: str = "shop", selector: dict[str, str] | None = None, ports=None) -> Obj:
    spec: Obj = {"rules": [{"to": [{"operation": {"ports": ports}}]}] if ports else [{}]}
    if selector is not None:
        spec["selector"] = {"matchLabels": selector}
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def healthy() -> list[Obj]:
    """A meshed namespace served by an installed control plane: nothing to report."""
    return [
        namespace("meshctl-system"),
        control_plane(),
        injector(),
        namespace("shop", **{"istio-injection": "enabled"}),
        pod("web-1"),
        service("web", "shop", [{"name": "http", "port": 80, "targetPort": 8080}]),
        policy("web", selector={"app": "web"}, ports=["8080"]),
    ]


def run(objects: list[Obj], namespaces: set[str] | None = None) -> list[Finding]:
    snapshot = Snapshot(tuple(Item(o) for o in objects))
    return analyze(snapshot, Scope(None if namespaces is None else frozenset(namespaces)))


def codes(objects: list[Obj], namespaces: set[str] | None = None) -> list[str]:
    return [f.code.id for f in run(objects, namespaces)]
