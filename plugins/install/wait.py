"""Waiting for an applied install to become ready, and for an uninstall to be gone.

Every component's waitable objects (workloads, CRDs, namespaces) are polled together, once a
second, until ready or until the deadline. Invariant: a timeout is one error naming the object
still not ready, why (its own status), the pod that holds it up and the newest event about it,
so the user sees ``ImagePullBackOff`` rather than "timed out".
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from meshctl.core.k8s.install import manifest as mf
from meshctl.core.k8s.install.readiness import readiness, waits
from meshctl.errors import MeshctlError
from meshctl.kube import objects
from meshctl.kube.inventory import Inventory, pod_problem

from .progress import DONE, FAILED, WAITING, Progress

POLL = 1.0


def _duration(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


def explain(inventory: Inventory, obj: Mapping[str, object], reason: str) -> str:
    """``reason`` with the evidence: the first pod not ready and the newest event."""
    parts = [reason]
    if obj.get("kind") in ("Deployment", "DaemonSet", "StatefulSet"):
        for pod in inventory.pods(obj):
            problem = pod_problem(pod)
            if problem:
                parts.append(problem)
                events = inventory.events(pod, limit=1)
                if events:
                    parts.append(f"last event: {events[0]}")
                break
    if len(parts) == 1:
        events = inventory.events(obj, limit=1)
        if events:
            parts.append(f"last event: {events[0]}")
    return "; ".join(parts)


def wait_ready(
    inventory: Inventory,
    by_component: Mapping[str, Sequence[mf.Rendered]],
    progress: Progress,
    timeout: float,
) -> None:
    """Until every component's objects are ready; raises naming the first one that is not."""
    deadline = time.monotonic() + timeout
    pending = {name: [r for r in items if waits(r.kind)] for name, items in by_component.items()}
    stuck: dict[str, tuple[mf.Rendered, Mapping[str, object] | None, str]] = {}
    while True:
        for name in list(pending):
            blocking = None
            for item in pending[name]:
                live = inventory.get(item.object)
                state = readiness(live)
                if not state.ready:
                    blocking = (item, live, state.reason)
                    break
            if blocking is None:
                progress.update(name, DONE)
                del pending[name]
                stuck.pop(name, None)
            else:
                stuck[name] = blocking
                progress.update(name, WAITING, f"{blocking[0].key}: {blocking[2]}")
        if not pending:
            return
        if time.monotonic() >= deadline:
            name, (item, last, reason) = next(iter(stuck.items()))
            detail = explain(inventory, last or item.object, reason)
            for other in pending:
                progress.update(other, FAILED, "not ready")
            progress.close()
            raise MeshctlError(
                f"{item.key} not ready after {_duration(timeout)}: {detail}",
                hint="fix the cause, then run the same 'meshctl install' again "
                "(it converges; --readiness-timeout waits longer)",
            )
        progress.tick()
        time.sleep(POLL)


def wait_gone(
    inventory: Inventory,
    by_component: Mapping[str, Sequence[Mapping[str, object]]],
    progress: Progress,
    timeout: float,
) -> None:
    """Until none of the objects exists any more (their finalizers and dependents done)."""
    deadline = time.monotonic() + timeout
    pending = {name: list(items) for name, items in by_component.items()}
    while True:
        for name in list(pending):
            left = []
            for obj in pending[name]:
                resource = inventory.resource(obj)
                key = mf.key_of(obj)
                namespace = key.namespace or None if resource.namespaced else None
                if objects.get(inventory.kube, resource, key.name, namespace) is not None:
                    left.append(obj)
            pending[name] = left
            if left:
                progress.update(name, WAITING, f"{mf.key_of(left[0])} terminating")
            else:
                progress.update(name, DONE)
                del pending[name]
        if not pending:
            return
        if time.monotonic() >= deadline:
            obj = next(iter(pending.values()))[0]
            for other in pending:
                progress.update(other, FAILED, "still there")
            progress.close()
            detail = explain(inventory, obj, "still terminating")
            raise MeshctlError(
                f"{mf.key_of(obj)} not gone after {_duration(timeout)}: {detail}",
                hint="a finalizer or a stuck pod holds it; run 'meshctl uninstall' again later",
            )
        progress.tick()
        time.sleep(POLL)
