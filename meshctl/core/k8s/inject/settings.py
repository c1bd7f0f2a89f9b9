"""What the injector puts into pods: image, revision, proxy identity and mesh settings.

``InjectSettings`` is built once at the edge (flags > env > the ``inject:`` section of the settings
file > defaults, via ``meshctl.config.resolve``) and passed down. Invariant: an instance is valid
(checked on construction), so the pipeline never meets a bad setting halfway through a file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from meshctl import values
from meshctl.config import setting
from meshctl.core.k8s import layout
from meshctl.core.k8s.image import DEFAULT_PULL_POLICY, PULL_POLICIES, default_image
from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject.errors import InvalidAnnotationError
from meshctl.errors import ConfigError

# The proxy runs as a non-root id (Istio's default 1337).
PROXY_ID = values.Integer(1, 2**31 - 1, what="a non-root uid/gid", metavar="ID")
# A label value (the revision lands in the `istio.io/rev` selector of the webhook configuration).
_LABEL_VALUE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_NETWORK = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@dataclass(frozen=True, slots=True, kw_only=True)
class InjectSettings:
    """Settings of one injection run (CLI) or of the webhook server."""

    image: str = setting(default_image(), env="MESHCTL_INJECT_IMAGE", flag="--image")
    image_pull_policy: str = setting(
        DEFAULT_PULL_POLICY, env="MESHCTL_INJECT_IMAGE_PULL_POLICY", choices=PULL_POLICIES
    )
    revision: str = setting(
        layout.DEFAULT_REVISION, env="MESHCTL_INJECT_REVISION", flag="--revision"
    )
    proxy_uid: int = setting(
        1337, env="MESHCTL_INJECT_PROXY_UID", flag="--proxy-uid", parse=PROXY_ID
    )
    proxy_gid: int | None = setting(
        None, env="MESHCTL_INJECT_PROXY_GID", flag="--proxy-gid", parse=PROXY_ID
    )
    native_sidecar: bool = setting(
        True, env="MESHCTL_INJECT_NATIVE_SIDECAR", flag="--native-sidecar"
    )
    cni: bool = setting(False, env="MESHCTL_INJECT_CNI", flag="--cni")
    # With Multus as the cluster's CNI: the NetworkAttachmentDefinition (ns/name) of the mesh's
    # CNI plugin, added to each CNI-mode pod's k8s.v1.cni.cncf.io/networks ("" = chained CNI).
    multus_network: str = setting("", env="MESHCTL_INJECT_MULTUS_NETWORK")
    # Mesh settings the proxy needs to find the CA and name itself.
    trust_domain: str = setting("cluster.local", env="MESHCTL_TRUST_DOMAIN")
    cluster_id: str = setting("Kubernetes", env="MESHCTL_CLUSTER_ID")
    mesh_id: str = setting("", env="MESHCTL_MESH_ID")
    # Empty: the control plane of this revision (``meshctl controlplane run``'s Service).
    ca_address: str = setting("", env="MESHCTL_CA_ADDRESS")
    token_audience: str = setting("meshctl-ca", env="MESHCTL_TOKEN_AUDIENCE")
    root_ca_configmap: str = setting(layout.ROOT_CONFIGMAP, env="MESHCTL_ROOT_CA_CONFIGMAP")
    # Proxy resources unless the pod's sidecar.istio.io/proxy* annotations say otherwise.
    proxy_cpu: str = setting("100m", env="MESHCTL_INJECT_PROXY_CPU")
    proxy_memory: str = setting("128Mi", env="MESHCTL_INJECT_PROXY_MEMORY")
    proxy_cpu_limit: str = setting("2000m", env="MESHCTL_INJECT_PROXY_CPU_LIMIT")
    proxy_memory_limit: str = setting("1Gi", env="MESHCTL_INJECT_PROXY_MEMORY_LIMIT")

    def __post_init__(self) -> None:
        if not self.image or any(c.isspace() for c in self.image):
            raise ConfigError(
                f"inject setting image: invalid value {self.image!r}",
                hint="give an image reference such as registry.example/meshctl:1.0",
            )
        if not _LABEL_VALUE.match(self.revision):
            raise ConfigError(
                f"inject setting revision: invalid value {self.revision!r}",
                hint="a revision is a label value: lower-case letters, digits and '-', "
                "at most 63 characters",
            )
        for name, uid in (("proxy-uid", self.proxy_uid), ("proxy-gid", self.proxy_gid)):
            if uid is not None and not 0 < uid < 2**31:
                raise ConfigError(
                    f"inject setting {name}: invalid value {uid}",
                    hint="the proxy runs as a non-root id between 1 and 2147483647",
                )
        for name in ("proxy_cpu", "proxy_memory", "proxy_cpu_limit", "proxy_memory_limit"):
            value = getattr(self, name)
            try:
                ann.parse_quantity(name, value)
            except InvalidAnnotationError as exc:
                raise ConfigError(
                    f"inject setting {name.replace('_', '-')}: invalid value {value!r}",
                    hint="use a Kubernetes quantity such as 100m, 0.5, 128Mi or 1G",
                ) from exc
        for resource in ("cpu", "memory"):
            request, limit = (
                getattr(self, f"proxy_{resource}"),
                getattr(self, f"proxy_{resource}_limit"),
            )
            if ann.quantity(request) > ann.quantity(limit):
                raise ConfigError(
                    f"inject settings: proxy-{resource} {request} exceeds proxy-{resource}-limit "
                    f"{limit}",
                    hint="the API server refuses a container whose request exceeds its limit",
                )
        if self.multus_network and not _NETWORK.match(self.multus_network):
            raise ConfigError(
                f"inject setting multus-network: invalid value {self.multus_network!r}",
                hint="name a NetworkAttachmentDefinition as NAMESPACE/NAME, e.g. default/istio-cni",
            )
        for name in ("trust_domain", "cluster_id", "token_audience", "root_ca_configmap"):
            if not getattr(self, name):
                raise ConfigError(
                    f"inject setting {name.replace('_', '-')} must not be empty",
                    hint="leave it out to use the default",
                )

    @property
    def control_plane_address(self) -> str:
        """Where the proxy finds its CA: ``ca_address``, else this revision's control plane
        (``meshctl-controlplane[-<rev>].meshctl-system.svc:15012``, as istiod[-<rev>])."""
        if self.ca_address:
            return self.ca_address
        return layout.control_plane_address(layout.MESH_NAMESPACE, self.revision)

    @property
    def gid(self) -> int:
        """The proxy's group id: ``proxy_gid``, else the same number as its uid."""
        return self.proxy_uid if self.proxy_gid is None else self.proxy_gid
