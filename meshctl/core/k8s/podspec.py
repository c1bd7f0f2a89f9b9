"""Pieces of pod specs the node DaemonSets share (the CNI node agent, the node proxy).

Invariants: a node component runs as root only for what root owns (host paths, pod namespaces),
never privileged, never able to gain privileges, with a read-only root filesystem and every
capability dropped except the ones it names; it runs on every Linux node (every taint
tolerated, node-critical priority, one node at a time in a rolling update) and is never itself
injected.
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
    service_account: str = "",
) -> dict[str, object]:
    """The DaemonSet of a node component: one pod per Linux node, its ServiceAccount named as
    the DaemonSet unless ``service_account`` is given, pods selected by the
    ``app.kubernetes.io/name`` label of ``labels``."""
    name = labels["app.kubernetes.io/name"]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
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
