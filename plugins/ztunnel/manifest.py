"""The node proxy of ambient mode as Kubernetes objects: a DaemonSet running ``ztunnel run
--mode node`` on every node, and its ServiceAccount. Plain dicts in apply order.

Invariants: the proxy talks to the node agent only through the host's ZDS socket directory
(the agent hands it each pod's netns there); it asks the mesh CA for pod certificates and the
control plane for workloads with its own projected token (audience ``meshctl-ca``), which the
CA honours for impersonation only as the trusted node account ``<namespace>/meshctl-ztunnel``
(beside an istiod: its address, root ConfigMap, audience and account, by the values of Istio's
ztunnel chart);
root, but only the capabilities that in-pod listeners and transparent deliveries need
(SYS_ADMIN to enter pod namespaces, NET_ADMIN for IP_TRANSPARENT and marks, NET_RAW), a read-only
root filesystem with a ``/tmp`` of its own (the one-file binary unpacks there), never privileged.
Nothing it holds is node-exclusive (its ports are in its own pod netns, the ZDS socket is the
agent's, pod listeners are SO_REUSEPORT), so an update surges: the new proxy starts beside the
old one, takes every pod's listeners too, and the old one drains only once the new one is Ready.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshctl.core.k8s import layout
from meshctl.core.k8s.install.components import InstallValues, Object
from meshctl.core.k8s.install.values import dns_label, value
from meshctl.core.k8s.podspec import node_daemonset, node_security_context
from meshctl.core.wire import zds

from .settings import DEFAULT_WORKERS, MAX_WORKERS

NAME = "meshctl-ztunnel"
READINESS_PORT = 15021
TOKEN_SECONDS = 43200
TOKEN_AUDIENCE = "meshctl-ca"  # noqa: S105 -- an audience name, not a secret
# A rollout hands over (docs/ztunnel.md): the old proxy stops accepting once its successor holds
# every pod's listeners, then its open connections have DRAIN_SECONDS to end; the supervisor kills
# what is left 2 s later, inside the pod's grace period.
GRACE_SECONDS = 30
DRAIN_SECONDS = 25


def _address(text: str) -> str | None:
    host, colon, port = text.rpartition(":")
    if not text or (colon and host and port.isdigit() and 0 < int(port) < 65536):
        return None
    return "is not HOST:PORT (e.g. istiod.istio-system.svc:15012)"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeProxyValues:
    """The node proxy's values (``components.ztunnel.*``)."""

    workers: int = value(
        DEFAULT_WORKERS, minimum=1, maximum=MAX_WORKERS, help="data-plane workers per node"
    )
    # Istio's ztunnel chart's names: set them to run beside an istiod (docs/ztunnel.md).
    ca_address: str = value(
        "", help="the CA's HOST:PORT (default: this install's control plane)", check=_address
    )
    xds_address: str = value(
        "", help="discovery's HOST:PORT (default: this install's control plane)", check=_address
    )
    trust_bundle_name: str = value(
        "",
        help=f"the root ConfigMap the proxy mounts (default {layout.ROOT_CONFIGMAP})",
        check=lambda text: dns_label(text) if text else None,
    )
    token_audience: str = value(
        TOKEN_AUDIENCE, help="the audience of the proxy's token (istiod's: istio-ca)"
    )
    service_account_name: str = value(
        NAME,
        help="the proxy's service account (the CA trusts it as a node proxy: istiod's default "
        "is istio-system/ztunnel)",
        check=dns_label,
    )


def objects(
    install: InstallValues, own: NodeProxyValues, *, ca_address: str = "", xds_address: str = ""
) -> list[Object]:
    """ServiceAccount and DaemonSet; the CA and discovery are the values' addresses, else
    ``ca_address``/``xds_address``, else this namespace's control plane
    (``meshctl-controlplane.<namespace>.svc:15012``)."""
    namespace = install.namespace
    ztunnel_dir = zds.DEFAULT_DIR
    plane = layout.control_plane_address(namespace)
    service = f"{layout.CONTROL_PLANE_SERVICE}.{namespace}.svc"
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "meshctl"}
    meta: Object = {"name": NAME, "namespace": namespace, "labels": labels}
    account = own.service_account_name
    ca = own.ca_address or ca_address or plane
    xds = own.xds_address or xds_address or plane
    # Our control plane's certificate names its Service, also when reached by address; another
    # CA (an istiod) is checked by the host the proxy dials, as Istio's ztunnel does.
    alt_names: list[Object] = [
        {"name": var, "value": service}
        for var, given in (
            ("ALT_CA_HOSTNAME", own.ca_address),
            ("ALT_XDS_HOSTNAME", own.xds_address),
        )
        if not given
    ]
    field = [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
        ("NODE_NAME", "spec.nodeName"),
        ("INSTANCE_IP", "status.podIP"),
        ("SERVICE_ACCOUNT", "spec.serviceAccountName"),
    ]
    env: list[Object] = [
        {"name": "PROXY_MODE", "value": "node"},
        {"name": "INPOD_UDS", "value": f"{ztunnel_dir}/ztunnel.sock"},
        {"name": "CA_ADDRESS", "value": ca},
        {"name": "XDS_ADDRESS", "value": xds},
        {"name": "CA_ROOT_CA", "value": "/var/run/secrets/istio/root-cert.pem"},
        {"name": "XDS_ROOT_CA", "value": "/var/run/secrets/istio/root-cert.pem"},
        {"name": "AUTH_TOKEN", "value": "/var/run/secrets/tokens/istio-token"},
        *alt_names,
        {"name": "ZTUNNEL_WORKER_THREADS", "value": str(own.workers)},
        {"name": "CONNECTION_TERMINATION_DEADLINE", "value": f"{DRAIN_SECONDS}s"},
    ]
    env += [{"name": n, "valueFrom": {"fieldRef": {"fieldPath": f}}} for n, f in field]
    pull = install.image_pull_policy
    container: Object = {
        "name": "ztunnel",
        "image": install.image,
        "command": ["meshctl"],
        "args": ["--log-level", "info", "--log-format", "json", "ztunnel", "run"],
        "env": env,
        "ports": [
            {"name": "ztunnel-stats", "containerPort": 15020},
            {"name": "ztunnel-ready", "containerPort": READINESS_PORT},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/healthz/ready", "port": READINESS_PORT},
            "periodSeconds": 5,
        },
        "resources": {"requests": {"cpu": "100m", "memory": "96Mi"}},
        "securityContext": node_security_context(["NET_ADMIN", "NET_RAW", "SYS_ADMIN"]),
        "volumeMounts": [
            {"name": "cni-ztunnel-sock-dir", "mountPath": ztunnel_dir},
            {"name": "istio-token", "mountPath": "/var/run/secrets/tokens", "readOnly": True},
            {"name": "istiod-ca-cert", "mountPath": "/var/run/secrets/istio", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 -- the pod's own emptyDir
        ],
        **({"imagePullPolicy": pull} if pull else {}),
    }
    token: Object = {
        "serviceAccountToken": {
            "path": "istio-token",
            "audience": own.token_audience,
            "expirationSeconds": TOKEN_SECONDS,
        }
    }
    daemonset = node_daemonset(
        meta=meta,
        labels=labels,
        container=container,
        volumes=[
            {
                "name": "cni-ztunnel-sock-dir",
                "hostPath": {"path": ztunnel_dir, "type": "DirectoryOrCreate"},
            },
            {"name": "istio-token", "projected": {"sources": [token]}},
            {
                "name": "istiod-ca-cert",
                "configMap": {"name": own.trust_bundle_name or layout.ROOT_CONFIGMAP},
            },
            {"name": "tmp", "emptyDir": {}},
        ],
        grace_seconds=GRACE_SECONDS,
        surge=True,
        service_account=account,
    )
    service_account: Object = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {**meta, "name": account},
    }
    return [service_account, daemonset]
