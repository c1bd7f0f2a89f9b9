"""Where the mesh lives on a cluster and on its nodes, written once: the mesh's namespace, its
control plane's Service and port, and the host directories the node agents mount.

Every default that names one of these (install values, the stand-alone manifests, the node
agent's and the control plane's settings, the injector) reads it from here. Invariant: a host
directory a node agent's container mounts is seen at ``HOST_MOUNT`` plus the host's own path
(``mounted``).
"""

from __future__ import annotations

from typing import Final

MESH_NAMESPACE: Final = "meshctl-system"
CONTROL_PLANE_SERVICE: Final = "meshctl-controlplane"  # istiod's place: CA and discovery
CONTROL_PLANE_PORT: Final = 15012  # gRPC over TLS: CA and xDS (istiod's 15012)
DEFAULT_REVISION: Final = "default"
# The mesh root's ConfigMap in every namespace (istio-ca-root-cert's place), key root-cert.pem.
ROOT_CONFIGMAP: Final = "meshctl-ca-root-cert"

# The node's CNI directories (containerd's and CRI-O's defaults) and where the runtime pins pod
# network namespaces (containerd: /var/run/netns/cni-...).
HOST_CNI_BIN_DIR: Final = "/opt/cni/bin"
HOST_CNI_CONF_DIR: Final = "/etc/cni/net.d"
HOST_NETNS_DIR: Final = "/var/run/netns"
# Where a node agent's container mounts the host's CNI directories.
HOST_MOUNT: Final = "/host"


def mounted(host_path: str) -> str:
    """``host_path`` as a node agent's container sees it (under ``HOST_MOUNT``)."""
    return f"{HOST_MOUNT}{host_path}"


def revisioned(base: str, revision: str) -> str:
    """``base`` for the default revision, ``base-<revision>`` otherwise (istiod's naming)."""
    return base if revision == DEFAULT_REVISION else f"{base}-{revision}"


def control_plane_address(namespace: str, revision: str = DEFAULT_REVISION) -> str:
    """Where a proxy of ``revision`` finds its CA and discovery:
    ``meshctl-controlplane[-<rev>].<namespace>.svc:15012``, as istiod[-<rev>]."""
    service = revisioned(CONTROL_PLANE_SERVICE, revision)
    return f"{service}.{namespace}.svc:{CONTROL_PLANE_PORT}"
