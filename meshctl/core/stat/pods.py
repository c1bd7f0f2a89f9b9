"""Which pods are meshed and how, read from Pod objects: the proxy to scrape for each.

A pod is meshed by a sidecar (an injected ``istio-proxy``), by the node proxy of its node
(ambient: the node agent's ``ambient.istio.io/redirection=enabled``), or is a gateway (its own
proxy: the ``gateway.networking.k8s.io/gateway-name`` label of a Gateway's pods, or Istio's
``istio=ingressgateway`` of the installed ingress gateway). Its workload is Istio's (a
ReplicaSet's pods belong to the Deployment), the name the proxies put in ``*_workload`` labels.
Pure: Pod dicts in, values out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from meshctl.core.k8s import ambient
from meshctl.core.k8s.gatewaypod import GATEWAY_NAME_LABEL
from meshctl.core.k8s.inject.kinds import workload_name_of_pod

Mode = Literal["sidecar", "ambient", "gateway", ""]
INGRESS_SELECTOR = "istio=ingressgateway"  # the installed ingress gateway's pods (Istio's label)


@dataclass(frozen=True, slots=True, kw_only=True)
class MeshPod:
    namespace: str
    name: str
    workload: str
    node: str
    mode: Mode  # "" when not meshed
    running: bool


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def mesh_pod(pod: Mapping[str, Any]) -> MeshPod:
    meta = _mapping(pod.get("metadata"))
    labels = _mapping(meta.get("labels"))
    annotations = _mapping(meta.get("annotations"))
    mode: Mode = ""
    if labels.get(GATEWAY_NAME_LABEL) or labels.get("istio") == "ingressgateway":
        mode = "gateway"
    elif ambient.has_sidecar(pod):  # type: ignore[arg-type]
        mode = "sidecar"
    elif annotations.get(ambient.REDIRECTION) == ambient.REDIRECTION_ENABLED:
        mode = "ambient"
    status = _mapping(pod.get("status"))
    return MeshPod(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        workload=workload_name_of_pod(pod),
        node=str(_mapping(pod.get("spec")).get("nodeName") or ""),
        mode=mode,
        running=status.get("phase") == "Running" and meta.get("deletionTimestamp") is None,
    )
