"""Settings of ``meshctl controlplane run``: flags > env (istiod's names where it has one) > the
``controlplane:`` section of the settings file > defaults, checked once at the edge."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from datetime import timedelta

from meshctl import values
from meshctl.config import setting
from meshctl.core.k8s import layout
from meshctl.core.pki import ca, callers
from meshctl.core.pki.identity import SpiffeId
from meshctl.errors import ConfigError

# Replicas beyond this are a typo, not a plan (install values and `manifest --replicas`).
MAX_REPLICAS = 100
DEFAULT_REPLICAS = 2  # one leads, one stands by
SERVICE = layout.CONTROL_PLANE_SERVICE  # the Service (and the name in the serving certificate)

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # RFC 1123 label
_DNS_NAME = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Port 0 (any free port) is for tests that run several control planes side by side.
_LISTEN = values.ListenAddress(zero_ok=True)
_LISTEN_HINT = "e.g. :15012 or 0.0.0.0:15012 ([::]:15012 for IPv6)"


def _listen(default: str, env: str) -> str:
    """A listen address setting, checked while the command line (or env, or file) is read."""
    result: str = setting(default, env=env, parse=_LISTEN, hint=_LISTEN_HINT)
    return result


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration(value: str, name: str) -> timedelta:
    """``"24h"`` -> 24 hours (ms, s, m, h, d; a bare number is seconds); errors name ``name``."""
    text = value.strip()
    for unit in sorted(_UNITS, key=len, reverse=True):
        number = text[: -len(unit)]
        if text.endswith(unit) and number.replace(".", "", 1).isdigit():
            return timedelta(seconds=float(number) * _UNITS[unit])
    if text.replace(".", "", 1).isdigit():
        return timedelta(seconds=float(text))
    raise ConfigError(f"{name}: {value!r} is not a duration", hint="write e.g. 30s, 24h or 90d")


def address(value: str, name: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` (all addresses) or ``[v6]:PORT`` as (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(
            f"{name}: {value!r} is not HOST:PORT", hint="e.g. :15012 or 0.0.0.0:15012"
        )
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 -- a server's default: every address
    try:
        ipaddress.ip_address(host)
    except ValueError as exc:
        raise ConfigError(
            f"{name}: {host!r} is not an IP address", hint="listen on an address of this host"
        ) from exc
    return host, int(port)


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlPlaneSettings:
    """Everything ``controlplane run`` needs beyond the global options."""

    namespace: str = setting(layout.MESH_NAMESPACE, env="POD_NAMESPACE")
    trust_domain: str = setting("cluster.local", env="TRUST_DOMAIN")
    revision: str = setting(layout.DEFAULT_REVISION, env="REVISION")
    cluster_id: str = setting("Kubernetes", env="CLUSTER_ID")
    pod_name: str = setting("", env="POD_NAME")  # this replica's name in the leader lease
    grpc_address: str = _listen(":15012", "MESHCTL_GRPC_ADDRESS")
    webhook_address: str = _listen(":15017", "MESHCTL_WEBHOOK_ADDRESS")
    metrics_address: str = _listen(":15014", "MESHCTL_MONITORING_ADDRESS")
    readiness_address: str = _listen(":8080", "MESHCTL_READINESS_ADDRESS")
    trusted_node_accounts: tuple[str, ...] = setting(
        callers.DEFAULT_NODE_ACCOUNTS, env="CA_TRUSTED_NODE_ACCOUNTS"
    )
    default_workload_cert_ttl: str = setting("24h", env="DEFAULT_WORKLOAD_CERT_TTL")
    max_workload_cert_ttl: str = setting("90d", env="MAX_WORKLOAD_CERT_TTL")
    self_signed_ca_key: str = setting(
        "ec-p256", env="MESHCTL_SELF_SIGNED_CA_KEY", choices=ca.KEY_TYPES
    )
    # More names for the serving certificate (15012 and 15017), e.g. an address outside the
    # cluster or the IP a test dials; the Service names are always in it.
    serving_names: tuple[str, ...] = setting((), env="MESHCTL_SERVING_NAMES")
    serving_cert_ttl: str = setting("24h", env="MESHCTL_SERVING_CERT_TTL")
    drain_deadline: str = setting("10s", env="MESHCTL_DRAIN_DEADLINE")
    lease_duration: str = setting("15s", env="MESHCTL_LEASE_DURATION")
    renew_deadline: str = setting("10s", env="MESHCTL_RENEW_DEADLINE")
    retry_period: str = setting("2s", env="MESHCTL_RETRY_PERIOD")
    max_message_bytes: int = setting(4 * 1024 * 1024, env="MESHCTL_GRPC_MAX_MESSAGE")
    # Discovery: policies here without a selector apply mesh-wide (Istio's meshConfig
    # rootNamespace; empty: --namespace), and Service host names end in the cluster's domain.
    root_namespace: str = setting("", env="MESHCTL_ROOT_NAMESPACE")
    domain_suffix: str = setting("cluster.local", env="DOMAIN_SUFFIX")
    # More names the root ConfigMap is published under in every namespace, e.g. Istio's
    # istio-ca-root-cert for proxies (Istio's ztunnel chart) that mount that one.
    root_configmap_aliases: tuple[str, ...] = setting((), env="MESHCTL_ROOT_CONFIGMAP_ALIASES")

    def __post_init__(self) -> None:
        for name, value in (("namespace", self.namespace), ("revision", self.revision)):
            if not _LABEL.match(value):
                raise ConfigError(
                    f"{name} {value!r} is not a DNS-1123 label",
                    hint="lower-case letters, digits, -",
                )
        try:
            SpiffeId(self.trust_domain, "ns", "sa")
        except ValueError as exc:
            raise ConfigError(f"trust domain: {exc}", hint="e.g. cluster.local") from exc
        try:
            callers.parse_node_accounts(self.trusted_node_accounts)
        except ValueError as exc:
            raise ConfigError(
                f"trusted node accounts: {exc}", hint="a comma list of NAMESPACE/SERVICE_ACCOUNT"
            ) from exc
        for name in ("grpc_address", "webhook_address", "metrics_address", "readiness_address"):
            address(getattr(self, name), name.replace("_", "-"))
        if self.default_ttl > self.max_ttl:
            raise ConfigError(
                f"default workload certificate TTL {self.default_workload_cert_ttl} exceeds "
                f"the maximum {self.max_workload_cert_ttl}",
                hint="raise --max-workload-cert-ttl or lower DEFAULT_WORKLOAD_CERT_TTL",
            )
        if self.max_ttl <= timedelta(0):
            raise ConfigError("max workload certificate TTL must be positive", hint="e.g. 90d")
        for value in self.serving_names:
            if not _DNS_NAME.match(value) and not _is_ip(value.strip("[]")):
                raise ConfigError(
                    f"serving name {value!r} is neither a DNS name nor an IP address",
                    hint="e.g. controlplane.example.org or 127.0.0.1",
                )
        if not 1024 <= self.max_message_bytes <= 256 * 1024 * 1024:
            raise ConfigError(
                f"gRPC max message {self.max_message_bytes} is out of range",
                hint="between 1024 and 268435456 bytes",
            )
        self.timing()  # checks the lease relations
        if self.root_namespace and not _LABEL.match(self.root_namespace):
            raise ConfigError(
                f"root namespace {self.root_namespace!r} is not a DNS-1123 label",
                hint="the namespace whose policies apply mesh-wide, e.g. meshctl-system",
            )
        _check_configmap_names(self.root_configmap_aliases)
        if not _DNS_NAME.match(self.domain_suffix):
            raise ConfigError(
                f"domain suffix {self.domain_suffix!r} is not a DNS name", hint="e.g. cluster.local"
            )

    @property
    def default_ttl(self) -> timedelta:
        return duration(self.default_workload_cert_ttl, "default workload cert TTL")

    @property
    def max_ttl(self) -> timedelta:
        return duration(self.max_workload_cert_ttl, "max workload cert TTL")

    @property
    def node_accounts(self) -> frozenset[str]:
        return callers.parse_node_accounts(self.trusted_node_accounts)

    @property
    def mesh_root_namespace(self) -> str:
        return self.root_namespace or self.namespace

    @property
    def root_configmaps(self) -> tuple[str, ...]:
        """Every name the root ConfigMap is published under: ours first, then the aliases."""
        return tuple(dict.fromkeys((layout.ROOT_CONFIGMAP, *self.root_configmap_aliases)))

    @property
    def service_name(self) -> str:
        """``meshctl-controlplane`` or ``meshctl-controlplane-<rev>``."""
        return layout.revisioned(SERVICE, self.revision)

    def serving_dns_and_ips(self) -> tuple[list[str], list[str]]:
        """The serving certificate's DNS names and IP addresses."""
        dns = [f"{self.service_name}.{self.namespace}.svc"]
        dns.append(f"{dns[0]}.cluster.local")
        if self.revision != "default":
            dns.insert(1, f"{SERVICE}.{self.namespace}.svc")
        ips: list[str] = []
        for value in self.serving_names:
            try:
                ips.append(str(ipaddress.ip_address(value.strip("[]"))))
            except ValueError:
                dns.append(value)
        return list(dict.fromkeys(dns)), ips

    def timing(self) -> tuple[float, float, float]:
        values = tuple(
            duration(v, n).total_seconds()
            for v, n in (
                (self.lease_duration, "lease duration"),
                (self.renew_deadline, "renew deadline"),
                (self.retry_period, "retry period"),
            )
        )
        lease, renew, retry = values
        if not lease > renew > retry > 0:
            raise ConfigError(
                "leader election needs lease duration > renew deadline > retry period > 0",
                hint="the defaults are 15s, 10s and 2s",
            )
        return lease, renew, retry


def _check_configmap_names(names: tuple[str, ...]) -> None:
    for name in names:
        if not _DNS_NAME.match(name) or name.startswith("*"):
            raise ConfigError(
                f"root ConfigMap alias {name!r} is not a ConfigMap name",
                hint="a DNS subdomain name, e.g. istio-ca-root-cert",
            )


def is_dns_name(text: str) -> bool:
    """Whether ``text`` may be a DNS name in a serving certificate (lower case, RFC 1123)."""
    return bool(_DNS_NAME.match(text))


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
