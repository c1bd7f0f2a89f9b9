"""Fixtures of the ambient kube tests: two nodes with agents and proxies, a mesh namespace."""

from __future__ import annotations

import pytest

from meshctl.core import ambient
from tests.harness.kube import (
    KubeCluster,
    create_namespace,
    delete_namespace,
    ensure_service_account,
    kubelet_node,
)
from tests.kube.ambient_support import ambient_nodes


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
