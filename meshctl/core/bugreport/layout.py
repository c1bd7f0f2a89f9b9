"""What a bug report collects from which pod, where each piece goes in the archive, and what fits.

Owns the pods' roles (control plane, node proxy, CNI node agent, gateway, sidecar-injected
workload) read from the labels and containers install and the injector give them; which
containers' logs are kept and which pods have an admin port to dump; the archive's member names;
and the size budget: members in priority order, the summary always first, each later member kept
whole, cut, or left out once the total cap is reached, each cut or omission named. Pure.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from meshctl.core.k8s import layout
from meshctl.core.k8s.inject import render

SUMMARY = "SUMMARY.md"
# The labels install gives each component's pods (app.kubernetes.io/name); a unit test holds
# them to the plugins' own constants.
NODE_PROXY_NAME = "meshctl-ztunnel"
CNI_AGENT_NAME = "meshctl-cni-node"
GATEWAY_NAME = "meshctl-ingressgateway"
GATEWAY_MANAGED_LABEL = "gateway.meshctl.io/managed"  # a Gateway API gateway's pods
NAME_LABEL = "app.kubernetes.io/name"
ADMIN_PORT = 15000  # the proxies' admin (config_dump), on the pod's loopback
CNI_STATUS_PORT = 8000  # the CNI node agent's readiness server
CNI_CONFLIST_PATH = "/debug/conflist"
CONFIG_DUMP_PATH = "/config_dump"
MIN_CUT = 4096  # bytes: a member cut shorter than this is left out instead


class Role(enum.StrEnum):
    CONTROL_PLANE = "controlplane"
    NODE_PROXY = "node-proxy"
    CNI_AGENT = "cni-agent"
    GATEWAY = "gateway"
    SIDECAR = "sidecar"
    OTHER = "other"


def role_of(pod: Mapping[str, Any]) -> Role:
    """What a pod is to the mesh, from its labels and containers."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    name = str(labels.get(NAME_LABEL) or "")
    if name.startswith(layout.CONTROL_PLANE_SERVICE):
        return Role.CONTROL_PLANE
    if name == NODE_PROXY_NAME:
        return Role.NODE_PROXY
    if name == CNI_AGENT_NAME:
        return Role.CNI_AGENT
    if name == GATEWAY_NAME or labels.get(GATEWAY_MANAGED_LABEL) == "true":
        return Role.GATEWAY
    if render.PROXY_CONTAINER in container_names(pod):
        return Role.SIDECAR
    return Role.OTHER


def container_names(pod: Mapping[str, Any]) -> list[str]:
    spec = pod.get("spec") or {}
    return [
        str(c.get("name"))
        for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    ]


def logged_containers(pod: Mapping[str, Any], role: Role) -> list[str]:
    """Whose logs the report keeps: every container of a mesh component, only the injected
    ones of a workload (its own containers' logs are the user's business)."""
    names = container_names(pod)
    if role is Role.SIDECAR:
        return [n for n in names if n in render.CONTAINERS]
    if role is Role.OTHER:
        return []
    return names


def has_admin(role: Role) -> bool:
    """Whether the pod's proxy serves ``/config_dump`` on the admin port."""
    return role in (Role.NODE_PROXY, Role.GATEWAY, Role.SIDECAR)


def restarts(pod: Mapping[str, Any]) -> dict[str, int]:
    """Each container's restart count, those that restarted only."""
    status = pod.get("status") or {}
    found: dict[str, int] = {}
    for item in [
        *(status.get("initContainerStatuses") or ()),
        *(status.get("containerStatuses") or ()),
    ]:
        count = item.get("restartCount")
        if isinstance(count, int) and count > 0:
            found[str(item.get("name"))] = count
    return found


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


# --- member names ---------------------------------------------------------------------------


def log_member(namespace: str, pod: str, container: str, *, previous: bool = False) -> str:
    return f"logs/{namespace}/{pod}/{container}{'.previous' if previous else ''}.log"


def dump_member(namespace: str, pod: str) -> str:
    return f"proxies/{namespace}/{pod}/config_dump.json"


def conflist_member(node: str) -> str:
    return f"cni/{node}/conflist.json"


def objects_member(namespace: str | None, kind: str) -> str:
    return f"objects/{namespace or '_cluster'}/{kind}.yaml"


def events_member(namespace: str) -> str:
    return f"events/{namespace}.yaml"


# --- the budget -----------------------------------------------------------------------------


class Priority(enum.IntEnum):
    """Lower is kept first when the total cap is reached."""

    VERSIONS = 0
    INSTALL = 1
    OBJECTS = 2
    EVENTS = 3
    NODE = 4  # CNI config
    CONTROL_PLANE_LOG = 5
    DUMP = 6
    PROXY_LOG = 7
    PREVIOUS_LOG = 8


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    data: bytes
    priority: int


@dataclass(frozen=True, slots=True)
class Fitted:
    members: list[Member]  # in archive order
    cut: list[str]  # "NAME: kept N of M bytes"
    left_out: list[str]  # "NAME (M bytes)"


def fit(members: Iterable[Member], cap: int) -> Fitted:
    """The members that fit in ``cap`` bytes, by priority then name; one that does not fit
    whole is cut to what is left (a line says so at its end) when that is at least ``MIN_CUT``,
    else left out. Names are unique in the result (the first of a name wins)."""
    seen: set[str] = set()
    ordered: list[Member] = []
    for member in sorted(members, key=lambda m: (m.priority, m.name)):
        if member.name not in seen:
            seen.add(member.name)
            ordered.append(member)
    kept: list[Member] = []
    cut: list[str] = []
    left_out: list[str] = []
    room = cap
    for member in ordered:
        size = len(member.data)
        if size <= room:
            kept.append(member)
            room -= size
            continue
        note = f"\n... cut by the report's size cap: {size - room} more bytes not kept\n"
        keep = room - len(note)
        if keep >= MIN_CUT:
            kept.append(Member(member.name, member.data[:keep] + note.encode(), member.priority))
            cut.append(f"{member.name}: kept {keep} of {size} bytes")
            room = 0
        else:
            left_out.append(f"{member.name} ({size} bytes)")
    return Fitted(kept, cut, left_out)
