"""Ambient enrollment: which pods the node proxy serves, and how their capture is configured.

Owns Istio's rules for ambient mode as pure decisions over Pod and Namespace objects (their
views; every field read as possibly absent or null):
a pod is enrolled when it or its namespace carries ``istio.io/dataplane-mode=ambient``, the pod
does not carry ``istio.io/dataplane-mode=none``, is not hostNetwork, has no sidecar and is not
finished or being deleted; and the capture settings of its in-pod rules (the pod's annotations:
DNS capture, virtual interfaces) as a ``CaptureSettings`` value. Invariants: a decision is a
function of the two objects alone and always says why; the annotation values are Istio's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meshctl.core.capture.settings import CaptureSettings, parse_interfaces
from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject.errors import InvalidAnnotationError
from meshctl.core.k8s.inject.render import PROXY_CONTAINER

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Namespace, Pod

DATAPLANE_MODE = "istio.io/dataplane-mode"
MODE_AMBIENT = "ambient"
MODE_NONE = "none"
REDIRECTION = "ambient.istio.io/redirection"  # written by the node agent
REDIRECTION_ENABLED = "enabled"
REDIRECTION_PENDING = "pending"
DNS_CAPTURE = "ambient.istio.io/dns-capture"
BYPASS_INBOUND = "ambient.istio.io/bypass-inbound-capture"
VIRTUAL_INTERFACES = "istio.io/reroute-virtual-interfaces"


@dataclass(frozen=True, slots=True)
class Enrollment:
    enrolled: bool
    reason: str


def enrollment(  # noqa: PLR0911 (one answer per rule, each with its reason)
    pod: Pod,
    namespace: Namespace | None,
    *,
    excluded_namespaces: Sequence[str] = (),
) -> Enrollment:
    """Whether ``pod`` (in ``namespace``, None when unknown) belongs in ambient mode, and why."""
    meta = _mapping(pod.get("metadata"))
    spec = _mapping(pod.get("spec"))
    status = _mapping(pod.get("status"))
    labels = _mapping(meta.get("labels"))
    if str(meta.get("namespace", "")) in excluded_namespaces:
        return Enrollment(False, "namespace excluded")
    if meta.get("deletionTimestamp"):
        return Enrollment(False, "the pod is being deleted")
    if status.get("phase") in ("Succeeded", "Failed"):
        return Enrollment(False, f"the pod has {str(status['phase']).lower()}")
    if spec.get("hostNetwork") is True:
        return Enrollment(False, "the pod uses hostNetwork")
    if has_sidecar(pod):
        return Enrollment(False, "the pod has a sidecar")
    mode = labels.get(DATAPLANE_MODE)
    if mode == MODE_NONE:
        return Enrollment(False, f"opted out ({DATAPLANE_MODE}={MODE_NONE})")
    if mode == MODE_AMBIENT:
        return Enrollment(True, f"pod label {DATAPLANE_MODE}={MODE_AMBIENT}")
    ns_labels = _mapping(_mapping((namespace or {}).get("metadata")).get("labels"))
    if ns_labels.get(DATAPLANE_MODE) == MODE_AMBIENT:
        return Enrollment(True, f"namespace label {DATAPLANE_MODE}={MODE_AMBIENT}")
    if namespace is None:
        return Enrollment(False, "namespace unknown")
    return Enrollment(False, f"no {DATAPLANE_MODE}={MODE_AMBIENT} label on the pod or namespace")


@dataclass(frozen=True, slots=True)
class ExitPlan:
    """What a stopping node agent does with the pods it enrolled."""

    release: bool
    reason: str


def exit_plan(  # noqa: PLR0911 (one answer per case, each with its reason)
    own_pod: Pod | None, daemonset: Mapping[str, object] | None, *, mode: str = "auto"
) -> ExitPlan:
    """Release every pod (an uninstall) or keep them captured for the next agent (an upgrade
    or a restart), as istio-cni decides: by whether the agent's DaemonSet is going away.

    ``own_pod``: the agent's pod (None when unknown: not in a pod, or unreadable);
    ``daemonset``: its owning DaemonSet as read now (None when not found); ``mode``:
    ``always``/``never`` override the decision."""
    if mode == "always":
        return ExitPlan(True, "told to release its pods on exit")
    if mode == "never":
        return ExitPlan(False, "told to keep its pods on exit")
    if own_pod is None:
        return ExitPlan(False, "its own pod is unknown, so an upgrade cannot be ruled out")
    owner = next(
        (
            _mapping(ref)
            for ref in _mapping(own_pod.get("metadata")).get("ownerReferences") or ()
            if _mapping(ref).get("kind") == "DaemonSet"
        ),
        None,
    )
    if owner is None:
        return ExitPlan(False, "its pod has no DaemonSet owner")
    if daemonset is None:
        return ExitPlan(True, f"its DaemonSet {owner.get('name')} is gone (uninstall)")
    meta = _mapping(daemonset.get("metadata"))
    if meta.get("uid") != owner.get("uid"):
        return ExitPlan(False, "a new DaemonSet of the same name takes over (reinstall)")
    if meta.get("deletionTimestamp"):
        return ExitPlan(True, f"its DaemonSet {meta.get('name')} is being deleted (uninstall)")
    return ExitPlan(False, "its DaemonSet stays (an upgrade or a restart): the next agent serves")


AGENT_ENV = "AMBIENT_ENABLED"  # istio-cni's switch: the node agent runs in ambient mode


def runs_agent(pod: Pod) -> bool:
    """Whether ``pod`` is a running ambient node agent (its container has ``AMBIENT_ENABLED``
    true), whoever installed it."""
    if _mapping(pod.get("status")).get("phase") != "Running":
        return False
    return any(
        _mapping(e).get("name") == AGENT_ENV and str(_mapping(e).get("value")).lower() == "true"
        for c in _mapping(pod.get("spec")).get("containers") or ()
        for e in _mapping(c).get("env") or ()
    )


def left_captured(pods: Sequence[Pod], served_nodes: Sequence[str]) -> list[str]:
    """``NS/NAME (node N)`` of each pod still annotated as redirected for ambient on a node
    where no ambient node agent runs (``served_nodes`` are those where one does): its in-pod
    rules send its traffic to a node proxy that is gone, so it refuses every connection."""
    out = []
    for pod in pods:
        meta = _mapping(pod.get("metadata"))
        value = _mapping(meta.get("annotations")).get(REDIRECTION)
        node = str(_mapping(pod.get("spec")).get("nodeName") or "")
        if value not in (REDIRECTION_ENABLED, REDIRECTION_PENDING) or node in served_nodes:
            continue
        if _mapping(pod.get("status")).get("phase") in ("Succeeded", "Failed"):
            continue
        out.append(f"{meta.get('namespace')}/{meta.get('name')} (node {node or '?'})")
    return sorted(out)


def serving_node_proxy(pods: Sequence[Pod]) -> Pod | None:
    """Of a node's node proxy pods, the one that serves its pods: during a rollout's handover
    there are two, the old one terminating (``deletionTimestamp``) while it drains; the newest
    running one not being deleted, else the newest running one, else None."""
    running = [p for p in pods if _mapping(p.get("status")).get("phase") == "Running"]
    running.sort(key=lambda p: str(_mapping(p.get("metadata")).get("creationTimestamp") or ""))
    staying = [p for p in running if not _mapping(p.get("metadata")).get("deletionTimestamp")]
    chosen = staying or running
    return chosen[-1] if chosen else None


def has_sidecar(pod: Pod) -> bool:
    """Injected by a sidecar injector (status annotation) or running an ``istio-proxy``."""
    meta = _mapping(pod.get("metadata"))
    if ann.STATUS in _mapping(meta.get("annotations")):
        return True
    spec = _mapping(pod.get("spec"))
    containers = [
        _mapping(c) for key in ("initContainers", "containers") for c in spec.get(key) or ()
    ]
    return any(c.get("name") == PROXY_CONTAINER for c in containers)


def dns_requested(pod: Pod, *, default: bool) -> bool:
    """Whether the pod's DNS should go to the node proxy: ``ambient.istio.io/dns-capture`` over
    the node's default. Raises ``InvalidAnnotationError`` for a value that is not a boolean."""
    annotations = _mapping(_mapping(pod.get("metadata")).get("annotations"))
    value = annotations.get(DNS_CAPTURE)
    return default if value is None else ann.parse_bool(DNS_CAPTURE, str(value))


def capture_settings(pod: Pod, *, dns: bool = False, ipv6: bool = False) -> CaptureSettings:
    """The capture settings of the pod's in-pod rules: ambient mode, DNS capture when ``dns``
    (see ``dns_requested``), Istio's virtual interfaces annotation, both families with ``ipv6``.
    Raises ``InvalidAnnotationError`` for a virtual interfaces annotation that names no
    interface."""
    annotations = _mapping(_mapping(pod.get("metadata")).get("annotations"))
    virtual = str(annotations.get(VIRTUAL_INTERFACES, ""))
    try:
        interfaces = parse_interfaces(virtual)
    except ValueError as exc:
        raise InvalidAnnotationError(
            VIRTUAL_INTERFACES, virtual, expected=f"comma separated interface names ({exc})"
        ) from exc
    return CaptureSettings(
        mode="ambient",
        redirect_dns=dns,
        capture_all_dns=dns,
        kube_virt_interfaces=interfaces,
        dual_stack=ipv6,
    )


def pod_ips(pod: Pod) -> list[str]:
    """The pod's IPs as its status reports them (empty before the CNI result reached the API)."""
    status = _mapping(pod.get("status"))
    ips = [str(_mapping(p).get("ip", "")) for p in status.get("podIPs") or ()]
    if not ips and status.get("podIP"):
        ips = [str(status["podIP"])]
    return [ip for ip in ips if ip]


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
