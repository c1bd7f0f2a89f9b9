"""When an applied object is ready, read from its status alone (what install waits for).

Istio's verify-install rules: a Deployment is ready when its controller observed the current
generation, its progress deadline has not passed, every replica is updated, no old replica is
left and every updated replica is available; a DaemonSet when every node that should run it runs
the current template ready; a CRD when Established; a Namespace when Active; a Job when it did
not fail. Any other kind is ready once it exists. Invariant: the reason of a not-ready object says
what is missing in the object's own terms ("1 of 2 replicas available").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    reason: str = ""


def _int(status: Mapping[str, Any], key: str) -> int:
    value = status.get(key)
    return int(value) if isinstance(value, int) else 0


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind:
            return dict(condition)
    return None


def _observed(obj: Mapping[str, Any]) -> Readiness | None:
    generation = (obj.get("metadata") or {}).get("generation")
    observed = (obj.get("status") or {}).get("observedGeneration")
    if isinstance(generation, int) and (not isinstance(observed, int) or observed < generation):
        return Readiness(False, f"waiting for its controller to observe generation {generation}")
    return None


def deployment(obj: Mapping[str, Any]) -> Readiness:
    pending = _observed(obj)
    if pending:
        return pending
    status = obj.get("status") or {}
    wanted = (obj.get("spec") or {}).get("replicas", 1)
    progressing = _condition(obj, "Progressing")
    if progressing and progressing.get("reason") == "ProgressDeadlineExceeded":
        return Readiness(False, f"progress deadline exceeded: {progressing.get('message', '')}")
    updated = _int(status, "updatedReplicas")
    if updated < wanted:
        return Readiness(False, f"{updated} of {wanted} replicas updated")
    if _int(status, "replicas") > updated:
        return Readiness(False, f"{_int(status, 'replicas') - updated} old replicas terminating")
    available = _int(status, "availableReplicas")
    if available < updated:
        return Readiness(False, f"{available} of {updated} replicas available")
    return Readiness(True, f"{available}/{wanted} available")


def daemonset(obj: Mapping[str, Any]) -> Readiness:
    pending = _observed(obj)
    if pending:
        return pending
    status = obj.get("status") or {}
    desired = _int(status, "desiredNumberScheduled")
    scheduled = _int(status, "currentNumberScheduled")
    if scheduled < desired:
        return Readiness(False, f"{scheduled} of {desired} nodes scheduled")
    updated = _int(status, "updatedNumberScheduled")
    if updated < desired:
        return Readiness(False, f"{updated} of {desired} nodes updated")
    ready = _int(status, "numberReady")
    if ready < desired:
        return Readiness(False, f"{ready} of {desired} nodes ready")
    return Readiness(True, f"{ready}/{desired} nodes ready")


def statefulset(obj: Mapping[str, Any]) -> Readiness:
    pending = _observed(obj)
    if pending:
        return pending
    status = obj.get("status") or {}
    wanted = (obj.get("spec") or {}).get("replicas", 1)
    ready = _int(status, "readyReplicas")
    if ready < wanted:
        return Readiness(False, f"{ready} of {wanted} replicas ready")
    return Readiness(True, f"{ready}/{wanted} ready")


def crd(obj: Mapping[str, Any]) -> Readiness:
    established = _condition(obj, "Established")
    if established and established.get("status") == "True":
        return Readiness(True, "established")
    names = _condition(obj, "NamesAccepted")
    if names and names.get("status") == "False":
        return Readiness(False, f"names not accepted: {names.get('message', '')}")
    return Readiness(False, "not established yet")


def namespace(obj: Mapping[str, Any]) -> Readiness:
    phase = (obj.get("status") or {}).get("phase")
    if phase == "Terminating":
        return Readiness(False, "terminating (being deleted)")
    return Readiness(True, "active")


def job(obj: Mapping[str, Any]) -> Readiness:
    failed = _condition(obj, "Failed")
    if failed and failed.get("status") == "True":
        return Readiness(False, f"failed: {failed.get('message', '')}")
    return Readiness(True, "not failed")


_BY_KIND = {
    "Deployment": deployment,
    "DaemonSet": daemonset,
    "StatefulSet": statefulset,
    "CustomResourceDefinition": crd,
    "Namespace": namespace,
    "Job": job,
}


def readiness(obj: Mapping[str, Any] | None) -> Readiness:
    """The readiness of a live object (``None``: it does not exist)."""
    if obj is None:
        return Readiness(False, "not found")
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return Readiness(False, "being deleted")
    rule = _BY_KIND.get(str(obj.get("kind", "")))
    return rule(obj) if rule else Readiness(True, "exists")


def waits(kind: str) -> bool:
    """Whether install waits on this kind beyond its creation."""
    return kind in _BY_KIND
