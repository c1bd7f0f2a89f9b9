"""A Gateway's own proxy, as Kubernetes objects: ServiceAccount, Deployment and Service.

Owns the shape of what the gateway controller provisions for each accepted Gateway of our class
(as Istio's and Envoy Gateway's controllers do), named ``<gateway>-<class>`` in the Gateway's
namespace (Istio's naming: a Gateway never takes the name of a user's Service), each with the
Gateway as its controlling owner, so deleting the Gateway removes them. The pod runs the control
plane's image as ``meshctl gateway run --gateway <ns>/<name>`` with the env and mounts a proxy
of the injector's rendering has (identity from the projected ``istio-token``, the mesh's root
from the root ConfigMap, CA and discovery at the control plane), may bind the listeners' ports
below 1024 (the pod's ``net.ipv4.ip_unprivileged_port_start=0``, Istio's gateway template) and
is ready on 15021; that container (``proxy_container``, ``proxy_volumes``) is also the installed
ingress gateway's (``--gateway ingress``). The Service (LoadBalancer, as Istio's) exposes each
listener port and the status port. Invariants: pure; equal inputs render equal objects, and
``digest`` names them, so the controller writes only when the rendering changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meshctl.core.k8s.inject import render
from meshctl.core.k8s.inject.interception import READINESS_PORT, STATUS_PORT
from meshctl.core.k8s.inject.settings import InjectSettings

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Volume

GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name"  # GEP-1762's label
MANAGED_LABEL = "gateway.meshctl.io/managed"
RENDERED_ANNOTATION = "gateway.meshctl.io/rendered"  # digest of what we last wrote
CONTAINER = "gateway"
MAX_NAME = 63


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayProxy:
    """What the rendering needs of one Gateway."""

    namespace: str
    name: str
    uid: str
    class_name: str
    ports: tuple[tuple[str, int], ...]  # (protocol, port) of its listeners, one per port


def resource_name(gateway: str, class_name: str) -> str:
    """``<gateway>-<class>``, cut to a DNS label (a hash keeps long names apart)."""
    name = f"{gateway}-{class_name}"
    if len(name) <= MAX_NAME:
        return name
    tail = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9].rstrip('-.')}-{tail}"


def listener_ports(listeners: Sequence[Any]) -> tuple[tuple[str, int], ...]:
    """(protocol, port) of each listener port, first listener's protocol per port, sorted."""
    seen: dict[int, str] = {}
    for listener in listeners:
        if not isinstance(listener, Mapping):
            continue
        port, protocol = listener.get("port"), listener.get("protocol")
        if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
            seen.setdefault(port, protocol if isinstance(protocol, str) else "TCP")
    return tuple((seen[p], p) for p in sorted(seen))


def _env(gateway: str, settings: InjectSettings) -> list[dict[str, Any]]:
    def field_env(name: str, path: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}

    return [
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("SERVICE_ACCOUNT", "spec.serviceAccountName"),
        field_env("INSTANCE_IP", "status.podIP"),
        field_env("NODE_NAME", "spec.nodeName"),
        {"name": "CA_ADDRESS", "value": settings.control_plane_address},
        {"name": "XDS_ADDRESS", "value": settings.control_plane_address},
        {"name": "TRUST_DOMAIN", "value": settings.trust_domain},
        {"name": "ISTIO_META_CLUSTER_ID", "value": settings.cluster_id},
        {"name": "GATEWAY_NAME", "value": gateway},  # ``gateway run``'s env for --gateway
    ]


def _mounts() -> list[dict[str, Any]]:
    return [
        {"name": render.CERTS_VOLUME, "mountPath": render.CERTS_PATH},
        {"name": render.TMP_VOLUME, "mountPath": "/tmp"},  # noqa: S108 -- the pod's emptyDir
        {"name": render.TOKEN_VOLUME, "mountPath": render.TOKEN_PATH, "readOnly": True},
        {"name": render.ROOT_CA_VOLUME, "mountPath": render.ROOT_CA_PATH, "readOnly": True},
    ]


def _port_name(protocol: str, port: int) -> str:
    return f"{protocol.lower()[:8]}-{port}"


def proxy_container(
    gateway: str, ports: Sequence[tuple[str, int]], settings: InjectSettings
) -> dict[str, Any]:
    """The container running ``meshctl gateway run --gateway <gateway>`` (``NS/NAME``, or
    ``ingress``) with the proxy env and mounts (``proxy_volumes``), its ``(name, port)`` ports
    declared, ready on 15021. Shared with the installed ingress gateway."""
    return {
        "name": CONTAINER,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": [render.MESHCTL],
        "args": ["gateway", "run", "--gateway", gateway],
        "env": _env(gateway, settings),
        "ports": [
            *(render.container_port(name, port) for name, port in ports),
            render.container_port("mesh-metrics", STATUS_PORT),
            render.container_port("status-port", READINESS_PORT),
        ],
        "readinessProbe": {
            "httpGet": {"path": "/healthz/ready", "port": READINESS_PORT},
            "periodSeconds": 2,
            "timeoutSeconds": 3,
            "failureThreshold": 3,
        },
        # The sidecar's defaults (Istio's gateway chart has the same): the injector's settings.
        "resources": {
            "requests": {"cpu": settings.proxy_cpu, "memory": settings.proxy_memory},
            "limits": {"cpu": settings.proxy_cpu_limit, "memory": settings.proxy_memory_limit},
        },
        # Low listener ports come from the pod's sysctl, not a capability; what it writes (TLS
        # pairs handed to ssl, metrics files) goes to the /tmp emptyDir.
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "runAsUser": settings.proxy_uid,
            "runAsGroup": settings.gid,
            "runAsNonRoot": True,
        },
        "volumeMounts": _mounts(),
    }


def proxy_volumes(settings: InjectSettings) -> list[Volume]:
    """The pod volumes ``proxy_container`` mounts (token, root ConfigMap, certs, tmp)."""
    return render.volumes(settings, render.pod_options({}, settings))


def render_proxy(proxy: GatewayProxy, settings: InjectSettings) -> list[dict[str, Any]]:
    """ServiceAccount, Deployment, Service (each with ``RENDERED_ANNOTATION``)."""
    name = resource_name(proxy.name, proxy.class_name)
    selector = {GATEWAY_NAME_LABEL: proxy.name}
    labels = {
        **selector,
        MANAGED_LABEL: "true",
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/managed-by": "meshctl",
    }
    owner = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "name": proxy.name,
        "uid": proxy.uid,
        "controller": True,
    }

    def meta() -> dict[str, Any]:
        return {
            "name": name,
            "namespace": proxy.namespace,
            "labels": dict(labels),
            "ownerReferences": [dict(owner)],
        }

    container = proxy_container(
        f"{proxy.namespace}/{proxy.name}",
        [(_port_name(pr, p), p) for pr, p in proxy.ports],
        settings,
    )
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta()},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta(),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": dict(selector)},
                "template": {
                    "metadata": {
                        # Not injected: the gateway's proxy is its main container.
                        "labels": {**labels, "sidecar.istio.io/inject": "false"},
                    },
                    "spec": {
                        "serviceAccountName": name,
                        "securityContext": {"sysctls": [dict(render.GATEWAY_SYSCTL)]},
                        "containers": [container],
                        "volumes": proxy_volumes(settings),
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(),
            "spec": {
                "type": "LoadBalancer",
                "selector": dict(selector),
                "ports": [
                    *(
                        {"name": _port_name(pr, p), "port": p, "targetPort": p, "protocol": "TCP"}
                        for pr, p in proxy.ports
                    ),
                    {
                        "name": "status-port",
                        "port": READINESS_PORT,
                        "targetPort": READINESS_PORT,
                        "protocol": "TCP",
                    },
                ],
            },
        },
    ]
    for obj in objects:
        obj["metadata"]["annotations"] = {RENDERED_ANNOTATION: digest(obj)}
    return objects


def digest(obj: Mapping[str, Any]) -> str:
    """What an object's rendering is, in 16 hex digits (its own annotation left out)."""
    plain = dict(obj)
    plain["metadata"] = {k: v for k, v in obj["metadata"].items() if k != "annotations"}
    text = json.dumps(plain, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
