"""What the injector puts into pods: image, revision, proxy identity and mesh settings.

``InjectSettings`` is built once at the edge (flags > env > the ``inject:`` section of the settings
file > defaults, via ``meshctl.config.resolve``) and passed down. Invariant: an instance is valid
(checked on construction), so the pipeline never meets a bad setting halfway through a file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from meshctl import values
from meshctl.config import setting
from meshctl.core.k8s import layout, proxyconfig
from meshctl.core.k8s.image import DEFAULT_PULL_POLICY, PULL_POLICIES, default_image
from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject.errors import InvalidAnnotationError
from meshctl.core.k8s.inject.interception import STATUS_PORT, interception_of
from meshctl.errors import ConfigError

# The proxy runs as a non-root id (Istio's default 1337).
PROXY_ID = values.Integer(1, 2**31 - 1, what="a non-root uid/gid", metavar="ID")
# A label value (the revision lands in the `istio.io/rev` selector of the webhook configuration).
_LABEL_VALUE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# A label value (topology.istio.io/network), possibly empty.
_NETWORK_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_NETWORK = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


RESOURCE_SETTINGS = (
    "proxy_cpu",
    "proxy_memory",
    "proxy_cpu_limit",
    "proxy_memory_limit",
    "proxy_ephemeral_storage",
    "proxy_ephemeral_storage_limit",
)
# The annotation a default stands for -> the setting's name (for messages).
_SETTING_OF = {
    ann.INTERCEPTION_MODE: "interception-mode",
    ann.INCLUDE_OUTBOUND_IP_RANGES: "include-ip-ranges",
    ann.EXCLUDE_OUTBOUND_IP_RANGES: "exclude-ip-ranges",
    ann.INCLUDE_INBOUND_PORTS: "include-inbound-ports",
    ann.EXCLUDE_INBOUND_PORTS: "exclude-inbound-ports",
    ann.INCLUDE_OUTBOUND_PORTS: "include-outbound-ports",
    ann.EXCLUDE_OUTBOUND_PORTS: "exclude-outbound-ports",
}


def _config_text(raw: Any) -> str:
    """``proxy-config`` as text: a mapping (settings file) becomes JSON, text stays."""
    if isinstance(raw, dict):
        return json.dumps(raw)
    if not isinstance(raw, str):
        raise TypeError("expected ProxyConfig YAML or JSON")
    return raw


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
    # Proxy resources unless the pod's sidecar.istio.io/proxy* annotations say otherwise ("":
    # none, as a null in Istio's values.global.proxy.resources).
    proxy_cpu: str = setting("100m", env="MESHCTL_INJECT_PROXY_CPU")
    proxy_memory: str = setting("128Mi", env="MESHCTL_INJECT_PROXY_MEMORY")
    proxy_cpu_limit: str = setting("2000m", env="MESHCTL_INJECT_PROXY_CPU_LIMIT")
    proxy_memory_limit: str = setting("1Gi", env="MESHCTL_INJECT_PROXY_MEMORY_LIMIT")
    proxy_ephemeral_storage: str = setting("", env="MESHCTL_INJECT_PROXY_EPHEMERAL_STORAGE")
    proxy_ephemeral_storage_limit: str = setting(
        "", env="MESHCTL_INJECT_PROXY_EPHEMERAL_STORAGE_LIMIT"
    )
    # Mesh-wide defaults of what each pod may say in its own annotations (a pod's annotation
    # wins), under Istio's names: values.global.network, meshConfig.defaultConfig
    # (interceptionMode and the ProxyConfig fields meshctl's proxy acts on),
    # values.global.proxy.{include,exclude}IPRanges / {include,exclude}{In,Out}boundPorts /
    # statusPort / readiness*, values.global.imagePullSecrets.
    network: str = setting("", env="MESHCTL_INJECT_NETWORK")
    interception_mode: str = setting(
        "REDIRECT", env="MESHCTL_INJECT_INTERCEPTION_MODE", choices=ann.INTERCEPTION_MODES
    )
    include_ip_ranges: str = setting("*", env="MESHCTL_INJECT_INCLUDE_IP_RANGES")
    exclude_ip_ranges: str = setting("", env="MESHCTL_INJECT_EXCLUDE_IP_RANGES")
    include_inbound_ports: str = setting("*", env="MESHCTL_INJECT_INCLUDE_INBOUND_PORTS")
    exclude_inbound_ports: str = setting("", env="MESHCTL_INJECT_EXCLUDE_INBOUND_PORTS")
    include_outbound_ports: str = setting("", env="MESHCTL_INJECT_INCLUDE_OUTBOUND_PORTS")
    exclude_outbound_ports: str = setting("", env="MESHCTL_INJECT_EXCLUDE_OUTBOUND_PORTS")
    status_port: int = setting(
        STATUS_PORT, env="MESHCTL_INJECT_STATUS_PORT", parse=values.Integer(0, 65535)
    )
    readiness_initial_delay_seconds: int = setting(
        0, env="MESHCTL_INJECT_READINESS_INITIAL_DELAY_SECONDS", parse=values.Integer(0, 2**31 - 1)
    )
    readiness_period_seconds: int = setting(
        15, env="MESHCTL_INJECT_READINESS_PERIOD_SECONDS", parse=values.Integer(1, 2**31 - 1)
    )
    readiness_failure_threshold: int = setting(
        4, env="MESHCTL_INJECT_READINESS_FAILURE_THRESHOLD", parse=values.Integer(1, 2**31 - 1)
    )
    image_pull_secrets: tuple[str, ...] = setting((), env="MESHCTL_INJECT_IMAGE_PULL_SECRETS")
    # YAML or JSON (a mapping in the settings file), Istio's ProxyConfig field names.
    proxy_config: str = setting("", env="MESHCTL_INJECT_PROXY_CONFIG", parse=_config_text)

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
        for name in RESOURCE_SETTINGS:
            value = getattr(self, name)
            if not value:
                continue
            try:
                ann.parse_quantity(name, value)
            except InvalidAnnotationError as exc:
                raise ConfigError(
                    f"inject setting {name.replace('_', '-')}: invalid value {value!r}",
                    hint="use a Kubernetes quantity such as 100m, 0.5, 128Mi or 1G",
                ) from exc
        for resource in ("cpu", "memory", "ephemeral_storage"):
            request, limit = (
                getattr(self, f"proxy_{resource}"),
                getattr(self, f"proxy_{resource}_limit"),
            )
            if request and limit and ann.quantity(request) > ann.quantity(limit):
                raise ConfigError(
                    f"inject settings: proxy-{resource} {request} exceeds proxy-{resource}-limit "
                    f"{limit}".replace("_", "-"),
                    hint="the API server refuses a container whose request exceeds its limit",
                )
        if self.multus_network and not _NETWORK.match(self.multus_network):
            raise ConfigError(
                f"inject setting multus-network: invalid value {self.multus_network!r}",
                hint="name a NetworkAttachmentDefinition as NAMESPACE/NAME, e.g. default/istio-cni",
            )
        self._check_pod_defaults()
        for name in ("trust_domain", "cluster_id", "token_audience", "root_ca_configmap"):
            if not getattr(self, name):
                raise ConfigError(
                    f"inject setting {name.replace('_', '-')} must not be empty",
                    hint="leave it out to use the default",
                )

    def _check_pod_defaults(self) -> None:
        """The mesh-wide defaults, checked by the parsers of the annotations they stand for."""
        if not _NETWORK_NAME.match(self.network):
            raise ConfigError(
                f"inject setting network: invalid value {self.network!r}",
                hint="a network name is a label value: letters, digits, '-', '_' and '.', "
                "at most 63 characters",
            )
        for secret in self.image_pull_secrets:
            # Not held to DNS rules: a name the API server refuses fails there, loudly.
            if not secret or any(c.isspace() or c == "," for c in secret):
                raise ConfigError(
                    f"inject setting image-pull-secrets: invalid Secret name {secret!r}",
                    hint="name Secrets of the pod's namespace, comma-separated",
                )
        for name, value, minimum in (
            ("status-port", self.status_port, 0),
            ("readiness-initial-delay-seconds", self.readiness_initial_delay_seconds, 0),
            ("readiness-period-seconds", self.readiness_period_seconds, 1),
            ("readiness-failure-threshold", self.readiness_failure_threshold, 1),
        ):
            top = 65535 if name == "status-port" else 2**31 - 1
            if not minimum <= value <= top:
                raise ConfigError(
                    f"inject setting {name}: invalid value {value}",
                    hint=f"a whole number from {minimum} to {top}",
                )
        try:
            interception_of(self.pod_defaults())
            self.mesh_proxy_config()
        except InvalidAnnotationError as exc:
            name = _SETTING_OF.get(exc.key, exc.key)
            raise ConfigError(
                f"inject setting {name}: invalid value {exc.value!r}",
                hint=(exc.hint or "").replace(exc.key, name),
            ) from None

    def pod_defaults(self) -> dict[str, str]:
        """The settings that differ from Istio's defaults, as the annotations a pod would carry
        to ask for them (so one parser reads both, and a pod's own annotation wins)."""
        given = {
            ann.INTERCEPTION_MODE: (self.interception_mode, "REDIRECT"),
            ann.INCLUDE_OUTBOUND_IP_RANGES: (self.include_ip_ranges, "*"),
            ann.EXCLUDE_OUTBOUND_IP_RANGES: (self.exclude_ip_ranges, ""),
            ann.INCLUDE_INBOUND_PORTS: (self.include_inbound_ports, "*"),
            ann.EXCLUDE_INBOUND_PORTS: (self.exclude_inbound_ports, ""),
            ann.INCLUDE_OUTBOUND_PORTS: (self.include_outbound_ports, ""),
            ann.EXCLUDE_OUTBOUND_PORTS: (self.exclude_outbound_ports, ""),
            ann.STATUS_PORT: (str(self.status_port), str(STATUS_PORT)),
            ann.READINESS_INITIAL_DELAY: (str(self.readiness_initial_delay_seconds), "0"),
            ann.READINESS_PERIOD: (str(self.readiness_period_seconds), "15"),
            ann.READINESS_FAILURE_THRESHOLD: (str(self.readiness_failure_threshold), "4"),
        }
        return {key: value for key, (value, default) in given.items() if value != default}

    def mesh_proxy_config(self) -> proxyconfig.ProxyConfig:
        """The mesh-wide ProxyConfig (``proxy-config``); a field meshctl's proxy cannot act on
        is refused here rather than ignored for every pod."""
        if not self.proxy_config:
            return proxyconfig.ProxyConfig()
        try:
            config = proxyconfig.parse(self.proxy_config, source="proxy-config")
        except ValueError as exc:
            raise InvalidAnnotationError(
                "proxy-config", self.proxy_config, expected=f"ProxyConfig fields ({exc})"
            ) from None
        if config.unsupported:
            acted_on = ", ".join(f for f in proxyconfig.ProxyConfigJson.__annotations__)
            raise InvalidAnnotationError(
                "proxy-config",
                self.proxy_config,
                expected=f"only the ProxyConfig fields meshctl's proxy acts on ({acted_on}), "
                f"not {', '.join(config.unsupported)}",
            )
        if config.status_port is not None:
            raise InvalidAnnotationError(
                "proxy-config",
                self.proxy_config,
                expected="ProxyConfig fields other than statusPort (set status-port instead)",
            )
        return config

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
