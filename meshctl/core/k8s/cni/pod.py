"""Which pods the CNI plugin captures, and with which ``meshctl iptables apply`` arguments.

Invariants: a pod is captured only when it was injected in CNI mode (status annotation present,
no capture init container, a proxy container, interception not NONE, not opted out); the arguments
come from ``capture_args`` (the init container's own mapping) with the proxy's uid/gid read from
its container, so the CNI path installs exactly the rules the init container would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject.interception import PROXY_UID, capture_args
from meshctl.core.k8s.inject.render import INIT_CONTAINER, PROXY_CONTAINER
from meshctl.structured import InputError, load_json


@dataclass(frozen=True, slots=True)
class Decision:
    """Capture or not, why, and the apply arguments when capturing."""

    capture: bool
    reason: str
    args: tuple[str, ...] = ()


def excluded(namespace: str, exclude_namespaces: Sequence[str]) -> bool:
    return namespace in exclude_namespaces


def decide(pod: Mapping[str, Any]) -> Decision:  # noqa: PLR0911 (one exit per reason)
    """The decision for a pod object as the API returns it (plain JSON).

    Raises ``InvalidAnnotationError`` when the pod asks for capture with unusable values.
    """
    metadata = _mapping(pod.get("metadata"))
    spec = _mapping(pod.get("spec"))
    annotations = {str(k): str(v) for k, v in _mapping(metadata.get("annotations")).items()}
    labels = _mapping(metadata.get("labels"))
    if spec.get("hostNetwork") is True:
        return Decision(False, "the pod uses hostNetwork")
    if ann.STATUS not in annotations:
        return Decision(False, f"not injected (no {ann.STATUS} annotation)")
    for where, values in (("label", labels), ("annotation", annotations)):
        value = values.get(ann.INJECT)
        if value is not None:
            if not ann.parse_bool(ann.INJECT, str(value)):
                return Decision(False, f"opted out ({where} {ann.INJECT}={value})")
            break
    containers = [
        _mapping(c) for key in ("initContainers", "containers") for c in spec.get(key) or ()
    ]
    names = {c.get("name") for c in containers}
    if INIT_CONTAINER in names or INIT_CONTAINER in _status_init_containers(annotations):
        return Decision(False, f"injected with the {INIT_CONTAINER} container, which captures")
    proxy = next((c for c in containers if c.get("name") == PROXY_CONTAINER), None)
    if proxy is None:
        return Decision(False, f"no {PROXY_CONTAINER} container")
    context = _mapping(proxy.get("securityContext"))
    uid = _int(context.get("runAsUser"), PROXY_UID)
    gid = _int(context.get("runAsGroup"), uid)
    args = capture_args(annotations, proxy_uid=uid, proxy_gid=gid)
    if not args:
        return Decision(False, f"{ann.INTERCEPTION_MODE} is NONE")
    return Decision(True, "injected in CNI mode", tuple(args))


def _status_init_containers(annotations: Mapping[str, str]) -> list[str]:
    try:
        status = load_json(annotations.get(ann.STATUS, "{}"), ann.STATUS)
    except (InputError, TypeError):
        return []
    names = status.get("initContainers") if isinstance(status, dict) else None
    return [str(n) for n in names] if isinstance(names, list) else []


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
