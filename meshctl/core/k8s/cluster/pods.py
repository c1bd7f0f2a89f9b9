"""A Pod (with its Namespace's labels) as the store's ``Workload``, the way Istio's control plane
builds it for ztunnel (pilot ``ambient/workloads.go``).

Owns: ``PodFacts`` (the few fields of a Pod the mesh reads, so the control plane never keeps
whole Pod objects), and ``build_workload``: uid ``<cluster>//Pod/<namespace>/<name>``, every pod
IP, service account, node, owner-derived workload name and type, canonical name and revision from
Istio's labels, HBONE when the pod is meshed (sidecar-injected, or enrolled in ambient mode) else
plain TCP, healthy only when Ready and not being deleted. Invariants: pure; a terminal pod
(Succeeded/Failed) or one without an IP is no workload; host-network pods keep the node's IP but
are marked so the store never looks them up by it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshctl.core.mesh.addresses import IPAddress
from meshctl.core.mesh.records import Protocol, Workload

from . import objects
from .settings import ClusterSettings

# Istio's labels and annotations (istio/api label/annotation packages), read as Istio reads them.
SIDECAR_STATUS = "sidecar.istio.io/status"  # written by injection: the pod runs our sidecar
AMBIENT_REDIRECTION = "ambient.istio.io/redirection"  # "enabled" once the node agent captures
DATAPLANE_MODE = "istio.io/dataplane-mode"  # "ambient" enrols (namespace or pod), "none" opts out
TUNNEL_LABEL = "networking.istio.io/tunnel"  # "http": the workload speaks HBONE itself
CANONICAL_NAME = ("service.istio.io/canonical-name", "app.kubernetes.io/name", "app")
CANONICAL_REVISION = ("service.istio.io/canonical-revision", "app.kubernetes.io/version", "version")
_KEPT_ANNOTATIONS = (SIDECAR_STATUS, AMBIENT_REDIRECTION)
# A CronJob's Jobs are named "<cronjob>-<scheduled time in minutes>" (8 to 10 digits).
_CRONJOB_JOB = re.compile(r"^(.+)-\d{8,10}$")


@dataclass(frozen=True, slots=True, kw_only=True)
class PodFacts:
    """What the mesh reads of a Pod."""

    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)  # only _KEPT_ANNOTATIONS
    ips: tuple[IPAddress, ...] = ()
    terminal: bool = False
    ready: bool = False
    deleting: bool = False
    host_network: bool = False
    node: str = ""
    service_account: str = "default"
    workload_name: str = ""
    workload_type: str = "pod"
    ports: Mapping[str, int] = field(default_factory=dict)  # named container ports

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def read_pod(obj: Mapping[str, object]) -> PodFacts:
    """``PodFacts`` of a Pod object; ``objects.ObjectError`` when it is malformed."""
    namespace, name = objects.identify(obj, "Pod")
    labels = objects.string_map(obj, "metadata", "labels")
    annotations = objects.string_map(obj, "metadata", "annotations")
    ips = [
        objects.ip_literal(objects.field(entry, "ip"), "status.podIPs[].ip")
        for entry in objects.items(obj, "status", "podIPs")
    ]
    if not ips and objects.text(obj, "status", "podIP"):
        ips = [objects.ip_literal(objects.text(obj, "status", "podIP"), "status.podIP")]
    ready = any(
        objects.field(c, "type") == "Ready" and objects.field(c, "status") == "True"
        for c in objects.items(obj, "status", "conditions")
    )
    ports: dict[str, int] = {}
    for container in objects.items(obj, "spec", "containers"):
        for port in objects.items(container, "ports"):
            number = objects.field(port, "containerPort")
            if isinstance(objects.field(port, "name"), str) and isinstance(number, int):
                ports.setdefault(port["name"], number)
    workload_name, workload_type = _owner(obj, name, labels)
    return PodFacts(
        namespace=namespace,
        name=name,
        labels=labels,
        annotations={k: annotations[k] for k in _KEPT_ANNOTATIONS if k in annotations},
        ips=tuple(ips),
        terminal=objects.text(obj, "status", "phase") in ("Succeeded", "Failed"),
        ready=ready,
        deleting=objects.field(obj, "metadata", "deletionTimestamp") is not None,
        host_network=objects.field(obj, "spec", "hostNetwork") is True,
        node=objects.text(obj, "spec", "nodeName"),
        service_account=objects.text(obj, "spec", "serviceAccountName") or "default",
        workload_name=workload_name,
        workload_type=workload_type,
        ports=ports,
    )


def _owner(obj: Any, name: str, labels: Mapping[str, str]) -> tuple[str, str]:
    """Istio's heuristic (``GetDeployMetaFromPod``): a generated pod's controller names it.

    ReplicaSet ``<deployment>-<pod-template-hash>`` -> the Deployment; Job -> the Job, or its
    CronJob when the Job carries a CronJob's timestamp suffix; anything else -> the pod itself.
    """
    if not objects.text(obj, "metadata", "generateName"):
        return name, "pod"
    controller = next(
        (
            r
            for r in objects.items(obj, "metadata", "ownerReferences")
            if objects.field(r, "controller") is True
        ),
        None,
    )
    if controller is None:
        return name, "pod"
    kind, owner = objects.text(controller, "kind"), objects.text(controller, "name")
    template_hash = labels.get("pod-template-hash", "")
    if kind == "ReplicaSet" and template_hash and owner.endswith(f"-{template_hash}"):
        return owner[: -len(template_hash) - 1], "deployment"
    if kind == "Job":
        cron = _CRONJOB_JOB.match(owner)
        return (cron.group(1), "cronjob") if cron else (owner, "job")
    return name, "pod"


def canonical(labels: Mapping[str, str], workload_name: str) -> tuple[str, str]:
    """Istio's canonical service name and revision (``kubelabels.CanonicalService``)."""
    name = next((labels[k] for k in CANONICAL_NAME if labels.get(k)), workload_name)
    revision = next((labels[k] for k in CANONICAL_REVISION if labels.get(k)), "latest")
    return name, revision


def tunnel(pod: PodFacts, namespace_labels: Mapping[str, str]) -> tuple[Protocol, bool]:
    """(protocol, native tunnel): HBONE when the pod is meshed.

    Sidecar-injected pods (the injector's status annotation) and pods labelled as speaking HBONE
    terminate the tunnel themselves (native); ambient pods are captured by their node's proxy:
    redirected (the node agent's annotation), or enrolled by the pod's or namespace's
    ``istio.io/dataplane-mode=ambient`` label unless the pod opts out with ``none``.
    """
    if SIDECAR_STATUS in pod.annotations or pod.labels.get(TUNNEL_LABEL) == "http":
        return Protocol.HBONE, True
    if pod.host_network:
        return Protocol.TCP, False  # nothing captures a host-network pod's traffic
    if pod.annotations.get(AMBIENT_REDIRECTION) == "enabled":
        return Protocol.HBONE, False
    mode = pod.labels.get(DATAPLANE_MODE) or namespace_labels.get(DATAPLANE_MODE)
    if mode == "ambient" and pod.labels.get(DATAPLANE_MODE) != "none":
        return Protocol.HBONE, False
    return Protocol.TCP, False


def workload_uid(settings: ClusterSettings, namespace: str, name: str) -> str:
    """Istio's pod workload uid: ``<cluster>//Pod/<namespace>/<name>``."""
    return f"{settings.cluster_id}//Pod/{namespace}/{name}"


def build_workload(
    pod: PodFacts,
    *,
    settings: ClusterSettings,
    namespace_labels: Mapping[str, str],
    services: Mapping[str, Mapping[int, int]],
    policies: tuple[str, ...],
) -> Workload | None:
    """The pod's workload, or None when it is none (terminal, or no IP yet)."""
    if pod.terminal or not pod.ips:
        return None
    protocol, native = tunnel(pod, namespace_labels)
    canonical_name, canonical_revision = canonical(pod.labels, pod.workload_name)
    extra: dict[str, object] = {}
    if pod.host_network:
        extra["networkMode"] = "HostNetwork"
    if native:
        extra["nativeTunnel"] = True
    return Workload(
        uid=workload_uid(settings, pod.namespace, pod.name),
        name=pod.name,
        namespace=pod.namespace,
        service_account=pod.service_account,
        workload_ips=pod.ips,
        protocol=protocol,
        trust_domain=settings.trust_domain,
        node=pod.node,
        workload_name=pod.workload_name,
        workload_type=pod.workload_type,
        canonical_name=canonical_name,
        canonical_revision=canonical_revision,
        cluster_id=settings.cluster_id,
        authorization_policies=policies,
        healthy=pod.ready and not pod.deleting,
        services={key: dict(sorted(ports.items())) for key, ports in sorted(services.items())},
        extra=extra,
    )
