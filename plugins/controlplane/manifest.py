"""The control plane's Kubernetes objects as data: RBAC, Service, Deployment, PDB, webhook config.

A pure function of the install's values and the component's own (``ControlPlaneValues``:
``components.controlplane.*``) returning plain dicts in apply order (the install command collects
every plugin's list). Invariants: least privilege (cluster-wide only what every
namespace needs: reading namespaces and pods, the root ConfigMap, TokenReviews; Secrets and the
Lease only in the control plane's namespace; the webhook configuration by name); the process runs
unprivileged with a read-only root filesystem; two replicas spread over nodes by default; the
MutatingWebhookConfiguration carries no caBundle (the leader patches the mesh root in).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from meshctl.core.k8s import layout
from meshctl.core.k8s.inject.webhook_config import (
    WebhookTarget,
    webhook_configuration,
)
from meshctl.core.k8s.install.components import InstallValues, Object
from meshctl.core.k8s.install.values import dns_label, value

from .authority import PLUG_IN_SECRET, SELF_SIGNED_SECRET
from .settings import DEFAULT_REPLICAS, MAX_REPLICAS, SERVICE

ISTIO_NAMESPACE = "istio-system"  # where Istio's charts put istiod and ztunnel
ISTIOD_SERVICE = "istiod"
ISTIO_ROOT_CONFIGMAP = "istio-ca-root-cert"
ISTIO_ZTUNNEL_ACCOUNT = "ztunnel"  # the ztunnel chart's service account
NODE_PROXY_ACCOUNT = "meshctl-ztunnel"  # ours (plugins/ztunnel's DaemonSet runs as it)
CLUSTER_DOMAIN = "cluster.local"

GRPC_PORT = layout.CONTROL_PLANE_PORT
WEBHOOK_PORT = 15017
MONITORING_PORT = 15014
READINESS_PORT = 8080
PROXY_UID = 1337


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlPlaneValues:
    """The control plane's values (``components.controlplane.*``)."""

    replicas: int = value(
        DEFAULT_REPLICAS,
        minimum=1,
        maximum=MAX_REPLICAS,
        help="control plane replicas (spread over nodes)",
    )
    cpu: str = value("100m", help="CPU request of each replica")
    memory: str = value("128Mi", help="memory request of each replica")
    inject: tuple[str, ...] = value(
        factory=tuple,
        help="injector settings NAME=VALUE for every pod this revision injects (the 'inject:' "
        "settings: network=NET, interception-mode=TPROXY, exclude-ip-ranges=CIDR, ...)",
    )
    # For Istio's ztunnel chart (its defaults point at istiod): docs/ztunnel.md.
    istio_names: bool = value(
        False,
        help="serve Istio's ztunnel chart with its defaults: trust istio-system/ztunnel as a "
        "node proxy, publish the root also as istio-ca-root-cert, and alias "
        "istiod.istio-system.svc to this control plane",
    )
    trusted_ztunnel_namespace: str = value(
        "",
        help="namespace of another node proxy to trust (istiod's trustedZtunnelNamespace; "
        "default with istioNames: istio-system)",
        check=lambda text: dns_label(text) if text else None,
    )
    trusted_ztunnel_name: str = value(
        "",
        help="its service account (istiod's trustedZtunnelName; default: ztunnel)",
        check=lambda text: dns_label(text) if text else None,
    )
    root_config_map_aliases: tuple[str, ...] = value(
        factory=tuple,
        help="more names for the root ConfigMap in every namespace (istioNames adds "
        "istio-ca-root-cert)",
        check=dns_label,
    )
    istiod_service_namespace: str = value(
        "",
        help="create Service istiod[-<revision>] there for this control plane, whose serving "
        "certificate then carries that name (default with istioNames: istio-system)",
        check=lambda text: dns_label(text) if text else None,
    )


def trusted_node_accounts(install: InstallValues, own: ControlPlaneValues) -> list[str]:
    """``NS/SA`` of every node proxy the CA lets act for pods on its node: ours, and another
    (Istio's ztunnel) when asked for by istiod's chart names or ``istioNames``."""
    accounts = [f"{install.namespace}/{NODE_PROXY_ACCOUNT}"]
    if own.istio_names or own.trusted_ztunnel_namespace or own.trusted_ztunnel_name:
        # istiod's defaults: the chart's account, in istiod's namespace (here: the alias's).
        default_namespace = istiod_alias_namespace(own) or install.namespace
        namespace = own.trusted_ztunnel_namespace or default_namespace
        accounts.append(f"{namespace}/{own.trusted_ztunnel_name or ISTIO_ZTUNNEL_ACCOUNT}")
    return list(dict.fromkeys(accounts))


def istio_env(install: InstallValues, own: ControlPlaneValues) -> list[tuple[str, str]]:
    """The process's settings for the aliases (none when no alias is asked for)."""
    env = []
    if aliases := root_config_map_aliases(own):
        env.append(("MESHCTL_ROOT_CONFIGMAP_ALIASES", ",".join(aliases)))
    if names := istiod_alias_names(install, own):
        env.append(("MESHCTL_SERVING_NAMES", ",".join(names)))
    return env


def root_config_map_aliases(own: ControlPlaneValues) -> list[str]:
    names = [*own.root_config_map_aliases, *([ISTIO_ROOT_CONFIGMAP] * own.istio_names)]
    return [n for n in dict.fromkeys(names) if n != layout.ROOT_CONFIGMAP]


def istiod_alias_namespace(own: ControlPlaneValues) -> str:
    """Where Service ``istiod[-<rev>]`` stands for this control plane ("" for nowhere)."""
    return own.istiod_service_namespace or (ISTIO_NAMESPACE if own.istio_names else "")


def istiod_alias_names(install: InstallValues, own: ControlPlaneValues) -> list[str]:
    """The alias's DNS names, for the serving certificate (what Istio's ztunnel checks)."""
    namespace = istiod_alias_namespace(own)
    if not namespace:
        return []
    host = f"{layout.revisioned(ISTIOD_SERVICE, install.revision)}.{namespace}.svc"
    return [host, f"{host}.{CLUSTER_DOMAIN}"]


def istiod_alias(
    install: InstallValues, own: ControlPlaneValues, selector: Object
) -> Object | None:
    """Service ``istiod[-<rev>]`` in the alias namespace, reaching this control plane on
    istiod's ports: selecting its pods when they run there, else (a Service selects pods of
    its own namespace only) an ExternalName to its Service, as Istio's chart points istiod
    at a remote control plane."""
    namespace = istiod_alias_namespace(own)
    if not namespace:
        return None
    name = layout.revisioned(ISTIOD_SERVICE, install.revision)
    labels = {"app.kubernetes.io/name": ISTIOD_SERVICE, "app.kubernetes.io/part-of": "meshctl"}
    target = layout.revisioned(SERVICE, install.revision)
    ports: list[Object] = [
        {"name": "grpc-xds", "port": GRPC_PORT, "targetPort": GRPC_PORT},
        {"name": "https-webhook", "port": 443, "targetPort": WEBHOOK_PORT},
        {"name": "http-monitoring", "port": MONITORING_PORT, "targetPort": MONITORING_PORT},
    ]
    spec: Object = (
        {"selector": dict(selector), "ports": ports}
        if namespace == install.namespace
        else {
            "type": "ExternalName",
            "externalName": f"{target}.{install.namespace}.svc.{CLUSTER_DOMAIN}",
            "ports": ports,
        }
    )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }


def objects(
    install: InstallValues, own: ControlPlaneValues, extra_env: Sequence[tuple[str, str]] = ()
) -> list[Object]:
    """ServiceAccount, RBAC, Service, Deployment, PodDisruptionBudget and the webhook config;
    ``extra_env`` is more env for the process (install passes the injector's settings: CNI mode,
    image)."""
    ns = install.namespace
    revision = install.revision
    name = layout.revisioned(SERVICE, revision)
    labels = {
        "app.kubernetes.io/name": SERVICE,
        "app.kubernetes.io/part-of": "meshctl",
        "istio.io/rev": revision,
    }
    selector = {"app.kubernetes.io/name": SERVICE, "istio.io/rev": revision}
    meta: Object = {"name": name, "namespace": ns, "labels": labels}
    cluster_rules: list[Object] = [
        {"apiGroups": [""], "resources": ["namespaces", "pods"], "verbs": ["get", "list", "watch"]},
        # Discovery watches what becomes workloads, services and policies.
        {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["security.istio.io"],
            "resources": ["authorizationpolicies"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            # Only ROOT_CONFIGMAP is ever written (create cannot be limited by name in RBAC).
            "verbs": ["get", "list", "watch", "create", "update"],
        },
        {
            "apiGroups": ["authentication.k8s.io"],
            "resources": ["tokenreviews"],
            "verbs": ["create"],
        },
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["mutatingwebhookconfigurations"],
            # Its own configuration and its revision tags' (named by the user: not listable by
            # name), selected by the istio.io/rev label; only caBundle fields are patched.
            "verbs": ["get", "list", "watch", "patch"],
        },
        *_gateway_rules(),
    ]
    namespace_rules: list[Object] = [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [SELF_SIGNED_SECRET, PLUG_IN_SECRET],
            "verbs": ["get", "list", "watch"],
        },
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [f"{name}-leader"],
            "verbs": ["get", "update"],
        },
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    ]

    def binding(kind: str) -> Object:
        scoped = kind == "RoleBinding"
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": kind,
            "metadata": meta if scoped else {"name": name, "labels": labels},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role" if scoped else "ClusterRole",
                "name": name,
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
        }

    def env_field(var: str, path: str) -> Object:
        return {"name": var, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}

    pull = install.image_pull_policy
    container: Object = {
        "name": "discovery",
        "image": install.image,
        **({"imagePullPolicy": pull} if pull else {}),
        "command": ["meshctl"],
        "args": ["--log-level", "info", "--log-format", "json", "controlplane", "run"],
        "env": [
            env_field("POD_NAME", "metadata.name"),
            env_field("POD_NAMESPACE", "metadata.namespace"),
            {"name": "REVISION", "value": revision},
            {"name": "TRUST_DOMAIN", "value": install.trust_domain},
            {
                "name": "CA_TRUSTED_NODE_ACCOUNTS",
                "value": ",".join(trusted_node_accounts(install, own)),
            },
            *({"name": k, "value": v} for k, v in istio_env(install, own)),
            *({"name": k, "value": v} for k, v in extra_env),
        ],
        "ports": [
            {"name": "grpc-xds", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "https-webhook", "containerPort": WEBHOOK_PORT, "protocol": "TCP"},
            {"name": "http-monitoring", "containerPort": MONITORING_PORT, "protocol": "TCP"},
            {"name": "http-ready", "containerPort": READINESS_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": READINESS_PORT},
            "initialDelaySeconds": 1,
            "periodSeconds": 3,
            "timeoutSeconds": 5,
        },
        "resources": {"requests": {"cpu": own.cpu, "memory": own.memory}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": PROXY_UID,
            "runAsGroup": PROXY_UID,
        },
        # The one writable place under the read-only root (key pairs load from memory instead).
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],  # noqa: S108 -- an emptyDir
    }
    deployment: Object = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": own.replicas,
            "selector": {"matchLabels": dict(selector)},
            "strategy": {"rollingUpdate": {"maxSurge": "100%", "maxUnavailable": "25%"}},
            "template": {
                "metadata": {
                    "labels": {**labels, "sidecar.istio.io/inject": "false"},
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(MONITORING_PORT),
                    },
                },
                "spec": {
                    "serviceAccountName": name,
                    "terminationGracePeriodSeconds": 30,
                    "affinity": {
                        "podAntiAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 100,
                                    "podAffinityTerm": {
                                        "topologyKey": "kubernetes.io/hostname",
                                        "labelSelector": {"matchLabels": dict(selector)},
                                    },
                                }
                            ]
                        }
                    },
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {"medium": "Memory"}}],
                },
            },
        },
    }
    service: Object = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "selector": dict(selector),
            "ports": [
                {"name": "grpc-xds", "port": GRPC_PORT, "targetPort": GRPC_PORT},
                {"name": "https-webhook", "port": 443, "targetPort": WEBHOOK_PORT},
                {"name": "http-monitoring", "port": MONITORING_PORT, "targetPort": MONITORING_PORT},
            ],
        },
    }
    budget: Object = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta,
        "spec": {"minAvailable": 1, "selector": {"matchLabels": dict(selector)}},
    }
    configuration = webhook_configuration(
        ca_bundle=None,
        target=WebhookTarget(service=name, namespace=ns, port=443),
        revision=revision,
    )
    alias = istiod_alias(install, own, selector)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": labels},
            "rules": cluster_rules,
        },
        binding("ClusterRoleBinding"),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": namespace_rules,
        },
        binding("RoleBinding"),
        service,
        *([alias] if alias is not None else []),
        deployment,
        budget,
        configuration,
    ]


def _gateway_rules() -> list[Object]:
    """The gateway controller's: read the Gateway API, Ingress and TLS Secrets (certificates
    for the gateways' configs, as istiod reads them for its gateways), write their status, and
    provision each Gateway's proxy in its namespace."""
    read = ["get", "list", "watch"]
    status = ["get", "update", "patch"]
    write = [*read, "create", "update", "patch", "delete"]
    routes = ["httproutes", "grpcroutes", "tlsroutes", "tcproutes"]
    gateway_api = ["gatewayclasses", "gateways", *routes, "referencegrants"]
    return [
        {"apiGroups": ["gateway.networking.k8s.io"], "resources": gateway_api, "verbs": read},
        {
            "apiGroups": ["gateway.networking.k8s.io"],
            "resources": [f"{r}/status" for r in ("gatewayclasses", "gateways", *routes)],
            "verbs": status,
        },
        {
            "apiGroups": ["networking.k8s.io"],
            "resources": ["ingresses", "ingressclasses"],
            "verbs": read,
        },
        {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses/status"], "verbs": status},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": read},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": write},
        {"apiGroups": [""], "resources": ["services", "serviceaccounts"], "verbs": write},
    ]
