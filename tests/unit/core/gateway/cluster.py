"""Kubernetes objects (plain dicts, as the API serves them) for the translation tests."""

from __future__ import annotations

from typing import Any

from meshctl.core.gateway.gateways import Address, CertificateFacts, GatewayRuntime
from meshctl.core.gateway.local import CLUSTER_FIELDS
from meshctl.core.gateway.translate import Cluster, Options, Translation, translate

NOW = "2026-12-02T10:00:00Z"
CREATED = "2026-01-01T00:00:00Z"
GROUP = "gateway.networking.k8s.io"


def _meta(name: str, namespace: str | None, generation: int, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "generation": generation, "creationTimestamp": CREATED}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta | extra


def gateway_class(name: str = "meshctl", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "GatewayClass",
        "metadata": _meta(name, None, 1),
        "spec": {"controllerName": "meshctl.io/gateway-controller"} | spec,
    }


def listener(
    name: str = "http", port: int = 80, protocol: str = "HTTP", **extra: Any
) -> dict[str, Any]:
    return {"name": name, "port": port, "protocol": protocol} | extra


def https(name: str = "https", port: int = 443, *certs: dict[str, Any], **extra: Any):
    refs = list(certs) or [{"name": "cert"}]
    return listener(name, port, "HTTPS", tls={"certificateRefs": refs}, **extra)


def gateway(
    *listeners: dict[str, Any],
    name: str = "gw",
    namespace: str = "infra",
    generation: int = 1,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Gateway",
        "metadata": _meta(name, namespace, generation),
        "spec": {"gatewayClassName": "meshctl", "listeners": list(listeners) or [listener()]}
        | spec,
    }


def rule(*backends: str, path: str | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = dict(extra)
    if path is not None:
        out["matches"] = [{"path": {"type": "PathPrefix", "value": path}}]
    out["backendRefs"] = [
        {"name": b.split(":")[0], "port": int(b.split(":")[1]) if ":" in b else 80}
        for b in backends
    ]
    return out


def route(
    name: str = "web",
    *rules: dict[str, Any],
    namespace: str = "infra",
    parents: list[dict[str, Any]] | None = None,
    hostnames: list[str] | None = None,
    generation: int = 1,
    created: str = CREATED,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "parentRefs": parents if parents is not None else [{"name": "gw", "namespace": "infra"}],
        "rules": list(rules) or [rule("svc")],
    }
    if hostnames:
        spec["hostnames"] = hostnames
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "HTTPRoute",
        "metadata": _meta(name, namespace, generation, creationTimestamp=created),
        "spec": spec,
    }


def service(name: str = "svc", namespace: str = "infra", *ports: int, **named: int):
    entries = [{"port": p} for p in ports or (80,)]
    entries += [{"name": n, "port": p} for n, p in named.items()]
    return {
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"ports": entries},
    }


def grant(namespace: str, sources: list[tuple[str, str, str]], targets: list[tuple[str, str, str]]):
    return {
        "apiVersion": f"{GROUP}/v1beta1",
        "kind": "ReferenceGrant",
        "metadata": {"name": "allow", "namespace": namespace},
        "spec": {
            "from": [{"group": g, "kind": k, "namespace": n} for g, k, n in sources],
            "to": [{"group": g, "kind": k} | ({"name": n} if n else {}) for g, k, n in targets],
        },
    }


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def cluster(
    *objects: dict[str, Any],
    certificates: dict[tuple[str, str], CertificateFacts] | None = None,
    ready: bool = True,
    addresses: tuple[str, ...] = ("10.96.0.10",),
) -> Cluster:
    lists: dict[str, list[Any]] = {field: [] for field in CLUSTER_FIELDS.values()}
    for obj in objects:
        lists[CLUSTER_FIELDS[obj["kind"]]].append(obj)
    runtime = {
        (g["metadata"]["namespace"], g["metadata"]["name"]): GatewayRuntime(
            ready=ready, addresses=tuple(Address(value=a) for a in addresses)
        )
        for g in lists["gateways"]
    }
    return Cluster(
        **lists,  # type: ignore[arg-type]
        certificates=certificates
        if certificates is not None
        else {("infra", "cert"): CertificateFacts()},
        runtime=runtime,
        ingress_addresses=tuple(Address(value=a) for a in addresses),
    )


def run(*objects: dict[str, Any], now: str = NOW, options: Options | None = None, **facts: Any):
    return translate(cluster(*objects, **facts), now=now, options=options or Options())


def status(result: Translation, kind: str, name: str, namespace: str = "infra") -> dict[str, Any]:
    for update in result.statuses:
        if (update.kind, update.namespace, update.name) == (kind, namespace, name):
            return update.status
    raise AssertionError(f"no status for {kind} {namespace}/{name}")


def condition(conditions: list[dict[str, Any]], kind: str) -> tuple[str, str]:
    """(status, reason) of the condition of that type."""
    for c in conditions:
        if c["type"] == kind:
            return c["status"], c["reason"]
    raise AssertionError(f"no {kind} condition in {conditions}")


def listener_status(result: Translation, name: str, gateway_name: str = "gw") -> dict[str, Any]:
    for entry in status(result, "Gateway", gateway_name)["listeners"]:
        if entry["name"] == name:
            return entry
    raise AssertionError(f"no listener {name}")


def parent(result: Translation, route_name: str = "web", namespace: str = "infra", index: int = 0):
    return status(result, "HTTPRoute", route_name, namespace)["parents"][index]
