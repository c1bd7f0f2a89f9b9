"""What a cluster's objects mean for the mesh beyond their own fields (Istio's meshConfig bits)."""

from __future__ import annotations

from dataclasses import dataclass

from meshctl.core.k8s.layout import MESH_NAMESPACE
from meshctl.core.mesh.records import DEFAULT_TRUST_DOMAIN


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSettings:
    """``cluster_id`` prefixes workload uids; ``root_namespace`` holds mesh-wide policies."""

    cluster_id: str = "Kubernetes"
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    domain_suffix: str = "cluster.local"
    root_namespace: str = MESH_NAMESPACE
