"""A running pod that ambient mode should serve but the node agent never redirected (MSH0205).

Who belongs in ambient mode is Istio's rule as the node agent applies it
(``meshctl.core.k8s.ambient.enrollment``: the pod's or its namespace's
``istio.io/dataplane-mode=ambient``, not opted out with ``=none``, not hostNetwork, no sidecar,
not finished or being deleted). The agent marks each pod it redirects with
``ambient.istio.io/redirection: enabled``; a Running pod with an IP and without that mark is
outside the mesh. Pods not yet running (or manifests in files, without a status) are left alone:
the agent enrolls a pod when its network is set up.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

from meshctl.core.k8s import ambient

from . import codes
from .findings import Finding
from .installation import installation
from .snapshot import Item, Snapshot, field, has_sidecar

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Namespace, Pod


def check(snapshot: Snapshot) -> Iterator[Finding]:
    served = bool(installation(snapshot).node_proxies)
    namespaces = snapshot.namespaces()
    for pod in snapshot.of_kind("Pod"):
        if field(pod.obj, "status", "phase") != "Running" or not field(pod.obj, "status", "podIP"):
            continue
        if (
            has_sidecar(pod)
            or pod.annotations.get(ambient.REDIRECTION) == ambient.REDIRECTION_ENABLED
        ):
            continue
        labels = namespaces.get(pod.namespace)
        namespace = None if labels is None else cast("Namespace", {"metadata": {"labels": labels}})
        decided = ambient.enrollment(cast("Pod", _view(pod)), namespace)
        if not decided.enrolled:
            continue
        why = (
            "the node agent has not redirected it (it started before the agent ran on its node, "
            "or the agent failed for it)"
            if served
            else "no node proxy is installed"
        )
        yield Finding(
            codes.POD_NOT_ENROLLED,
            pod.subject,
            f"The pod belongs in ambient mode ({decided.reason}) but is not redirected: {why}; "
            "its traffic bypasses the mesh's mTLS and policies",
            "restart it so the node agent enrolls it (kubectl rollout restart on its workload, "
            "or delete the pod), and check the node agent on its node ('meshctl verify')",
            (pod.namespace,),
        )


def _view(pod: Item) -> dict[str, object]:
    """The fields ``enrollment`` reads, as text (it expects an API server's pod)."""
    return {
        "metadata": {
            "namespace": pod.namespace,
            "labels": pod.labels,
            "deletionTimestamp": field(pod.obj, "metadata", "deletionTimestamp"),
        },
        "spec": {"hostNetwork": field(pod.obj, "spec", "hostNetwork") is True},
        "status": {"phase": field(pod.obj, "status", "phase")},
    }
