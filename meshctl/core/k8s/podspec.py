"""Pieces of pod specs the node DaemonSets share (the CNI node agent, the node proxy).

Invariants: a node component runs as root only for what root owns (host paths, pod namespaces),
never privileged, never able to gain privileges, with a read-only root filesystem and every
capability dropped except the ones it names; it runs on every Linux node (every taint
tolerated, node-critical priority) and is never itself injected. A rolling update replaces one
node's pod at a time: the old one goes first (``maxUnavailable: 1``), or, for a component that
can run twice on a node and hand over to its successor (``surge``), the new one starts beside
it and the old one is stopped only once the new one is Ready (``maxSurge: 1``,
``maxUnavailable: 0``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Capabilities, SecurityContext


def node_security_context(add: Sequence[str] = ()) -> SecurityContext:
    """The container securityContext of a node component that needs the ``add`` capabilities."""
    capabilities: Capabilities = {"drop": ["ALL"]}
    if add:
        capabilities["add"] = list(add)
    return {
        "runAsUser": 0,
        "runAsGroup": 0,
        "runAsNonRoot": False,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": capabilities,
    }


def node_daemonset(
    *,
    meta: Mapping[str, object],
    labels: Mapping[str, str],
    container: Mapping[str, object],
    volumes: Sequence[Mapping[str, object]],
    grace_seconds: int,
    host_network: bool = False,
    surge: bool = False,
    service_account: str = "",
) -> dict[str, object]:
    """The DaemonSet of a node component: one pod per Linux node, its ServiceAccount named as
    the DaemonSet unless ``service_account`` is given, pods selected by the
    ``app.kubernetes.io/name`` label of ``labels``. ``surge``: the update starts the new pod
    beside the old one (nothing node-exclusive may be held then: no hostNetwork port, no
    host-path lock or socket it serves)."""
    if surge and host_network:
        raise ValueError("a hostNetwork node component cannot run twice on a node (surge)")
    name = labels["app.kubernetes.io/name"]
    rolling: dict[str, object] = (
        {"maxSurge": 1, "maxUnavailable": 0} if surge else {"maxUnavailable": 1}
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": rolling},
            "template": {
                "metadata": {
                    "labels": labels,
                    # A node component is never itself a pod of the mesh.
                    "annotations": {"sidecar.istio.io/inject": "false"},
                },
                "spec": {
                    **(
                        {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}
                        if host_network
                        else {}
                    ),
                    "serviceAccountName": service_account or name,
                    # Pods cannot start on a node without the mesh's node components in place.
                    "priorityClassName": "system-node-critical",
                    "tolerations": [{"operator": "Exists"}],
                    "terminationGracePeriodSeconds": grace_seconds,
                    "nodeSelector": {"kubernetes.io/os": "linux"},
                    "containers": [container],
                    "volumes": list(volumes),
                },
            },
        },
    }
