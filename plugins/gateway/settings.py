"""Settings of ``meshctl gateway run``: flags > env (the pod's env, as ``ztunnel run`` reads it)
> defaults. The CA, discovery and pod variables are ``ztunnel run``'s names (one pod env for
every proxy the mesh runs; the type is a ``meshctl.proxy.xds_client.DiscoverySettings``);
``GATEWAY_NAME`` names what this proxy serves."""

from __future__ import annotations

from dataclasses import dataclass

from meshctl import values
from meshctl.config import setting

MAX_WORKERS = 64
_DURATION_HINT = f"write a duration, {values.DURATION_EXAMPLES}"
_ADDRESS_HINT = "write HOST:PORT, e.g. meshctl-controlplane.meshctl-system.svc:15012"


def _gateway(text: str) -> str:
    """``NAMESPACE/NAME`` of a Gateway, ``ingress`` for the Ingress proxy, or "" (the files')."""
    if text in ("", "ingress"):
        return text
    namespace, slash, name = text.partition("/")
    if not slash or not namespace or not name or "/" in name:
        raise ValueError(f"{text!r} is not NAMESPACE/NAME or 'ingress'")
    return text


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewaySettings:
    gateway: str = setting(
        "",
        env="GATEWAY_NAME",
        parse=_gateway,
        hint="write NAMESPACE/NAME of a Gateway, or 'ingress' for the Ingress proxy",
    )
    # Standalone: Kubernetes objects from files (repeatable), instead of discovery.
    config: tuple[str, ...] = ()
    pod_name: str | None = setting(None, env="POD_NAME")
    pod_namespace: str | None = setting(None, env="POD_NAMESPACE")
    service_account: str | None = setting(None, env="SERVICE_ACCOUNT")
    trust_domain: str = setting("cluster.local", env="TRUST_DOMAIN")
    # The gateway's own mesh certificate (cert-chain.pem, key.pem, root-cert.pem) for HBONE to
    # meshed endpoints, as ``ztunnel run`` reads it; its identity is ns/POD_NAMESPACE/sa/
    # SERVICE_ACCOUNT.
    cert_dir: str = setting("/var/run/secrets/workload-spiffe-credentials", env="MESHCTL_CERT_DIR")
    ca_address: str | None = setting(
        None, env=("CA_ADDRESS", "CA_ADDR"), parse=values.DIAL_ADDRESS, hint=_ADDRESS_HINT
    )
    ca_root: str = setting("/var/run/secrets/istio/root-cert.pem", env="CA_ROOT_CA")
    ca_server_name: str | None = setting(None, env="ALT_CA_HOSTNAME")
    # A token file (read on every call) or, if no such file exists, the token itself (ztunnel).
    auth_token: str = setting(
        "/var/run/secrets/tokens/istio-token", env="AUTH_TOKEN", flag="--token-file"
    )
    cluster_id: str = setting("Kubernetes", env="ISTIO_META_CLUSTER_ID")
    secret_ttl: float = setting(
        86400.0, env="SECRET_TTL", parse=values.Duration(minimum=1.0), hint=_DURATION_HINT
    )
    xds_address: str | None = setting(
        None, env="XDS_ADDRESS", parse=values.DIAL_ADDRESS, hint=_ADDRESS_HINT
    )
    xds_root_ca: str = setting("/var/run/secrets/istio/root-cert.pem", env="XDS_ROOT_CA")
    alt_xds_hostname: str | None = setting(None, env="ALT_XDS_HOSTNAME")
    xds_on_demand: bool = setting(False, env="XDS_ON_DEMAND")
    instance_ip: str = setting("", env="INSTANCE_IP")
    node_name: str = setting("", env="NODE_NAME")
    # Where listeners bind ("0.0.0.0" in a pod; 127.0.0.1 for tests on loopback), and what is
    # added to every listener port the table names (0 in a pod: ports 80 and 443 as they are).
    bind_address: str = setting("0.0.0.0", env="MESHCTL_GATEWAY_BIND")  # noqa: S104
    port_offset: int = setting(
        0, env="MESHCTL_GATEWAY_PORT_OFFSET", parse=values.Integer(0, 65535, what="an offset")
    )
    drain_deadline: float = setting(
        5.0,
        env="CONNECTION_TERMINATION_DEADLINE",
        parse=values.Duration(maximum=3600),
        hint=_DURATION_HINT,
    )
    # A client that has not sent a whole request head (or TLS handshake) by then is dropped.
    header_timeout: float = setting(
        10.0,
        env="MESHCTL_HEADER_TIMEOUT",
        parse=values.Duration(positive=True, maximum=300),
        hint=_DURATION_HINT,
    )
    # A request whose Content-Length is above this is answered 413 (0: no limit of ours).
    max_request_body: int = setting(
        0, env="MESHCTL_MAX_REQUEST_BODY", parse=values.Integer(0, 2**62, what="a byte count")
    )
    idle_timeout: float = setting(
        60.0,
        env="MESHCTL_IDLE_TIMEOUT",
        parse=values.Duration(positive=True, maximum=3600),
        hint=_DURATION_HINT,
    )
    reload_interval: float = setting(
        1.0,
        env="MESHCTL_RELOAD_INTERVAL",
        parse=values.Duration(positive=True),
        hint=_DURATION_HINT,
    )
    # Data-plane worker processes sharing the listener ports (1: one process does everything).
    workers: int = setting(
        1, env="MESHCTL_GATEWAY_WORKERS", parse=values.Integer(1, MAX_WORKERS, what="a count")
    )
    run_dir: str = setting("", env="MESHCTL_RUN_DIR")
    admin_port: int = setting(15000)
    metrics_port: int = setting(15020)
    readiness_port: int = setting(15021)
