"""Pieces of pod specs the node DaemonSets share (the CNI node agent, the node proxy).

Invariant: a node component runs as root only for what root owns (host paths, pod namespaces),
never privileged, never able to gain privileges, with a read-only root filesystem and every
capability dropped except the ones it names.
"""

from __future__ import annotations

from collections.abc import Sequence
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
