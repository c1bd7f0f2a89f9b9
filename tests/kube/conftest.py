"""Fixtures of the ambient kube tests: two nodes with agents and proxies, a mesh namespace.

Every test that starts a data plane (a sidecar or a node proxy) fails if an exception escaped
into its log, as in tests/netns.
"""

from __future__ import annotations

import pytest

from meshctl.core.k8s import ambient
from tests.harness.kube import (
    KubeCluster,
    create_namespace,
    delete_namespace,
    ensure_service_account,
    kubelet_node,
)
from tests.kube.ambient_support import ambient_nodes
from tests.netns.ztunnel_harness import no_exception_escapes_the_data_plane

__all__ = ["no_exception_escapes_the_data_plane"]  # an autouse fixture: registered by import


@pytest.fixture
def two_nodes(kube_cluster: KubeCluster, kube_api, netns_factory, tmp_path, kube_namespace):
    with (
        kubelet_node(kube_cluster, kube_api, netns_factory) as k0,
        kubelet_node(kube_cluster, kube_api, netns_factory) as k1,
        ambient_nodes(kube_cluster, [k0, k1], tmp_path, kube_namespace, kube_api) as nodes,
    ):
        yield nodes


@pytest.fixture
def mesh_namespace(kube_api, kube_namespace):
    name = f"{kube_namespace}-amb"[:60]
    create_namespace(kube_api, name, labels={ambient.DATAPLANE_MODE: ambient.MODE_AMBIENT})
    for sa in ("client", "server"):
        ensure_service_account(kube_api, name, sa)
    try:
        yield name
    finally:
        delete_namespace(kube_api, name)
