"""The node agent's side of the API server, and what stands in for it without one.

Owns the two protocols the agent reconciles against — ``PodSource`` (this node's Pods and all
Namespaces as watch events; ``ClusterPods``: the process's shared informers, or the local
inventory file) and ``PodApi`` (a pod's ``ambient.istio.io/redirection`` annotation, a Warning
event on it, and the agent's own DaemonSet read on exit; ``KubePodApi``, or ``LocalPodApi``
without an API server) — so the agent's reconciler runs the same on both, and in tests against
stand-ins. Invariants: a write that fails is logged and reported as not done, never raised (the
reconciler tries again); an event message is at most 1000 characters; the exit decision waits at
most 5 s for the API server and keeps the pods when it cannot tell.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol, TypeAlias

from meshctl.core.k8s import ambient
from meshctl.errors import KubeError
from meshctl.kube import objects
from meshctl.kube.client import Kube
from meshctl.kube.informer import Informers, subscribe
from meshctl.kube.resources import DAEMONSETS, EVENTS, NAMESPACES, PODS
from meshctl.kube.watch import WatchEvent

from .podstate import PodState

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Namespace, Pod

log = logging.getLogger(__name__)

COMPONENT = "meshctl-cni-node"
_EXIT_READ_TIMEOUT = 5.0


# What a ``PodSource`` delivers: this node's Pods and every Namespace (``event.resource`` says
# which an event is about).
PodEvent: TypeAlias = "WatchEvent[Pod | Namespace]"


class PodSource(Protocol):
    """This node's Pods and every Namespace, as a watch says them (``WatchEvent.resource``
    tells the kinds apart; one SYNCED per kind once its first view is whole)."""

    name: str  # for the log: "watches", "local inventory PATH"

    def subscribe(self) -> AbstractAsyncContextManager[AsyncIterator[PodEvent]]: ...


class PodApi(Protocol):
    """What the agent writes about pods, and reads about itself on exit."""

    async def annotate(self, pod: PodState, value: str | None) -> bool:
        """Set (or with None remove) the pod's redirection annotation; False: not written."""

    async def warn(self, pod: PodState, reason: str, message: str) -> None:
        """Record a Warning event on the pod (best effort)."""

    async def exit_plan(self, mode: str) -> ambient.ExitPlan:
        """Whether stopping now is an uninstall (release every pod) or an upgrade."""


class ClusterPods:
    """The pods of ``node`` and all namespaces, from the process's shared informers."""

    name = "watches"

    def __init__(self, informers: Informers, node: str) -> None:
        self._pods = informers.informer(PODS, field_selector=f"spec.nodeName={node}")
        self._namespaces = informers.informer(NAMESPACES)

    def subscribe(self) -> AbstractAsyncContextManager[AsyncIterator[PodEvent]]:
        return subscribe([self._pods, self._namespaces])


class KubePodApi:
    """``PodApi`` on the API server; ``own_pod``: the agent's pod (namespace, name), if known."""

    def __init__(self, kube: Kube, *, node: str, own_pod: tuple[str, str] = ("", "")) -> None:
        self._kube = kube
        self._node = node
        self._own = own_pod

    async def annotate(self, pod: PodState, value: str | None) -> bool:
        body = {"metadata": {"annotations": {ambient.REDIRECTION: value}}}
        try:
            await asyncio.to_thread(objects.patch, self._kube, PODS, pod.name, body, pod.namespace)
        except KubeError as exc:
            log.warning("pod %s: annotation %s not written: %s", pod.ref, value, exc.message)
            return False
        return True

    async def warn(self, pod: PodState, reason: str, message: str) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
            },
            "reason": reason,
            "message": message[:1000],
            "type": "Warning",
            "source": {"component": COMPONENT, "host": self._node},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await asyncio.to_thread(objects.create, self._kube, EVENTS, body, pod.namespace)
        except KubeError as exc:
            log.warning("pod %s: event not recorded: %s", pod.ref, exc.message)

    async def exit_plan(self, mode: str) -> ambient.ExitPlan:
        """From this agent's DaemonSet as the API server has it now."""
        namespace, name = self._own
        if mode != "auto" or not (name and namespace):
            return ambient.exit_plan(None, None, mode=mode)
        kube = self._kube
        try:
            async with asyncio.timeout(_EXIT_READ_TIMEOUT):
                own = await asyncio.to_thread(objects.get, kube, PODS, name, namespace)
                refs = ((own or {}).get("metadata") or {}).get("ownerReferences") or ()
                owner = next((r for r in refs if r.get("kind") == "DaemonSet"), None)
                daemonset = None
                if owner is not None:
                    daemonset = await asyncio.to_thread(
                        objects.get, kube, DAEMONSETS, str(owner.get("name")), namespace
                    )
        except (KubeError, TimeoutError) as exc:
            why = exc.message if isinstance(exc, KubeError) else "no answer within 5 s"
            return ambient.ExitPlan(False, f"cannot read its DaemonSet ({why}): keeping them")
        return ambient.exit_plan(own, daemonset)


class LocalPodApi:
    """No API server (``--local-inventory``): the annotation is the agent's record alone
    (``/status``), a failure's log line is its only record."""

    async def annotate(self, pod: PodState, value: str | None) -> bool:
        return True

    async def warn(self, pod: PodState, reason: str, message: str) -> None:
        return None

    async def exit_plan(self, mode: str) -> ambient.ExitPlan:
        return ambient.exit_plan(None, None, mode=mode)
