"""Settings of ``meshctl ztunnel run``: flags > env (the injector's pod env) > file > defaults."""

from __future__ import annotations

from dataclasses import dataclass

from meshctl import values
from meshctl.config import setting
from meshctl.core.k8s.appprobes import PROBERS_ENV, parse_probers, parse_scrape
from meshctl.core.wire.zds import DEFAULT_SOCKET
from meshctl.errors import ConfigError

_DURATION_HINT = f"write a duration, {values.DURATION_EXAMPLES}"
_ADDRESS_HINT = "write HOST:PORT, e.g. meshctl-controlplane.meshctl-system.svc:15012"
MAX_WORKERS = 64
DEFAULT_WORKERS = 1


def _probers(text: str) -> str:
    """The injector's prober document, checked here so a bad one stops the proxy at start."""
    parse_probers(text)
    return text


def _scrape(text: str) -> str:
    parse_scrape(text)
    return text


@dataclass(frozen=True, slots=True, kw_only=True)
class InjectedConfig:
    """What the injector hands the proxy besides its settings: the pod's ProxyConfig."""

    proxy_config: str = setting("", env="PROXY_CONFIG")


@dataclass(frozen=True, slots=True, kw_only=True)
class ZtunnelSettings:
    # "node" is ztunnel's "shared" (the node proxy of ambient mode), "sidecar" its "dedicated".
    mode: str = setting(
        "sidecar", env="PROXY_MODE", choices=("sidecar", "dedicated", "node", "shared")
    )
    workload: str | None = setting(None, env="PROXY_WORKLOAD_INFO")
    # The injected sidecar's env (meshctl inject renders these from the downward API).
    pod_name: str | None = setting(None, env="POD_NAME")
    pod_namespace: str | None = setting(None, env="POD_NAMESPACE")
    service_account: str | None = setting(None, env="SERVICE_ACCOUNT")
    # The pod's IP: where app probes go, and what discovery's node id carries.
    instance_ip: str = setting("", env="INSTANCE_IP")
    # The kubelet's probes the injector moved to :15020/app-health/... (Istio's variable).
    app_probers: str = setting(
        "",
        env=PROBERS_ENV,
        parse=_probers,
        hint="the injector writes this variable; re-inject the pod (meshctl inject)",
    )
    # The app's prometheus.io/* scrape settings, merged into /stats/prometheus (Istio's name).
    app_metrics: str = setting(
        "",
        env="ISTIO_PROMETHEUS_ANNOTATIONS",
        parse=_scrape,
        hint="the injector writes this variable; re-inject the pod (meshctl inject)",
    )
    trust_domain: str = setting("cluster.local", env="TRUST_DOMAIN")
    cluster_id: str = setting("Kubernetes", env="ISTIO_META_CLUSTER_ID")
    local_config: str | None = setting(None, env="LOCAL_XDS_PATH")
    cert_dir: str = setting("/var/run/secrets/workload-spiffe-credentials", env="MESHCTL_CERT_DIR")
    # The mesh CA (ztunnel's CA_ADDRESS, istio-agent's CA_ADDR): certificates from
    # CreateCertificate when set and no certificate files are mounted in cert_dir.
    ca_address: str | None = setting(
        None, env=("CA_ADDRESS", "CA_ADDR"), parse=values.DIAL_ADDRESS, hint=_ADDRESS_HINT
    )
    ca_root: str = setting("/var/run/secrets/istio/root-cert.pem", env="CA_ROOT_CA")
    ca_server_name: str | None = setting(None, env="ALT_CA_HOSTNAME")
    # A token file (read on every call) or, if no such file exists, the token itself (ztunnel).
    auth_token: str = setting(
        "/var/run/secrets/tokens/istio-token", env="AUTH_TOKEN", flag="--token-file"
    )
    secret_ttl: float = setting(
        86400.0, env="SECRET_TTL", parse=values.Duration(minimum=1.0), hint=_DURATION_HINT
    )
    # Durations in seconds, written as ztunnel writes them: "5s", "300ms", "5m", "1h".
    drain_deadline: float = setting(
        5.0,
        env="CONNECTION_TERMINATION_DEADLINE",
        parse=values.Duration(maximum=3600),
        hint=_DURATION_HINT,
    )
    # A peer that has not finished the TLS handshake by then is dropped (slowloris guard).
    handshake_timeout: float = setting(
        5.0,
        env="MESHCTL_HANDSHAKE_TIMEOUT",
        parse=values.Duration(positive=True, maximum=300),
        hint=_DURATION_HINT,
    )
    pool_max_streams: int = setting(
        100, env="POOL_MAX_STREAMS_PER_CONNECTION", parse=values.Integer(1, 2**31 - 1)
    )
    pool_idle_timeout: float = setting(
        300.0,
        env="POOL_UNUSED_RELEASE_TIMEOUT",
        parse=values.Duration(positive=True),
        hint=_DURATION_HINT,
    )
    mark: int = setting(
        0, env="PACKET_MARK", parse=values.Integer(0, 0xFFFFFFFF, what="a mark", metavar="MARK")
    )
    # Sidecar inbound interception as the injector sets it (istio-init's -m): TPROXY keeps the
    # client's address, so inbound capture arrives at a transparent listener and deliveries to
    # the app leave from the client's address with the TPROXY mark (whose connmark routes the
    # app's replies back here).
    interception_mode: str = setting(
        "REDIRECT",
        env="ISTIO_META_INTERCEPTION_MODE",
        parse=values.Choice(("REDIRECT", "TPROXY", "NONE")),
        hint="the injector writes this variable; re-inject the pod (meshctl inject)",
    )
    tproxy_mark: int = setting(
        1337,
        env="ISTIO_INBOUND_TPROXY_MARK",
        parse=values.Integer(1, 0xFFFFFFFF, what="a mark", metavar="MARK"),
    )
    # Data-plane worker processes (ztunnel's worker threads); they share the listeners.
    workers: int = setting(
        DEFAULT_WORKERS,
        env="ZTUNNEL_WORKER_THREADS",
        parse=values.Integer(1, MAX_WORKERS, what="a count"),
    )
    reload_interval: float = setting(
        1.0,
        env="MESHCTL_RELOAD_INTERVAL",
        parse=values.Duration(positive=True),
        hint=_DURATION_HINT,
    )
    # Node mode: the node agent's ZDS socket; a development CA for pod certificates when no
    # mesh CA (``ca_address``) is given.
    inpod_uds: str = setting(DEFAULT_SOCKET, env="INPOD_UDS")
    # Files that live as long as this run (the workers' metrics); "": $TMPDIR/meshctl-ztunnel-UID.
    run_dir: str = setting("", env="MESHCTL_RUN_DIR")
    ca_dir: str | None = setting(None, env="MESHCTL_CA_DIR")
    # Discovery (ztunnel's names): the control plane, its roots, the token, who we are.
    xds_address: str | None = setting(
        None, env="XDS_ADDRESS", parse=values.DIAL_ADDRESS, hint=_ADDRESS_HINT
    )
    xds_root_ca: str = setting("/var/run/secrets/istio/root-cert.pem", env="XDS_ROOT_CA")
    alt_xds_hostname: str | None = setting(None, env="ALT_XDS_HOSTNAME")
    xds_on_demand: bool = setting(False, env="XDS_ON_DEMAND")
    node_name: str = setting("", env="NODE_NAME")
    outbound_port: int = setting(15001)
    inbound_plaintext_port: int = setting(15006)
    inbound_port: int = setting(15008)
    admin_port: int = setting(15000)
    metrics_port: int = setting(15020)
    readiness_port: int = setting(15021)

    @property
    def node_mode(self) -> bool:
        return self.mode in ("node", "shared")

    @property
    def tproxy(self) -> bool:
        """Sidecar inbound capture by TPROXY (the node proxy's in-pod capture is its own)."""
        return not self.node_mode and self.interception_mode == "TPROXY"

    def workload_ref(self) -> str:
        """NS/NAME/SA from ``--workload`` or the pod env; a clear error when neither is set."""
        if self.workload:
            return self.workload
        if self.pod_name and self.pod_namespace:
            return f"{self.pod_namespace}/{self.pod_name}/{self.service_account or 'default'}"
        raise ConfigError(
            "sidecar mode needs the workload it serves",
            hint="pass --workload NAMESPACE/NAME/SERVICE_ACCOUNT "
            "(or set POD_NAMESPACE, POD_NAME and SERVICE_ACCOUNT, as the injector does)",
        )
