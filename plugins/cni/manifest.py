"""The objects that run ``meshctl cni install`` on every node: RBAC and the DaemonSet, as data,
from the install's values and the component's own (``CniValues``: ``components.cni.*``).

Invariants: the agent runs as root with a read-only root filesystem and only the capabilities
to enter pod namespaces and write their rules (SYS_ADMIN for setns, NET_ADMIN and NET_RAW for
libiptc): the CNI plugin is a thin client and this agent serves its requests in every mode. It
mounts the three host paths it writes and the host's netns directory (the pods' namespaces);
the plugin's RBAC is read-only on pods (a CNI request only ever GETs the pod it is for).
With ``ambient`` (the ambient node agent runs too, like istio-cni's): the host network, the
host's ZDS socket directory and its xtables lock (the node's own rules), and RBAC to watch pods
and namespaces, annotate pods, record events and read DaemonSets (is its own going away?);
nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshctl.core.k8s import layout
from meshctl.core.k8s.ambient import AGENT_ENV
from meshctl.core.k8s.cni.spec import DEFAULT_RUN_DIR
from meshctl.core.k8s.install.components import InstallValues, Object
from meshctl.core.k8s.install.values import dns_label, value
from meshctl.core.k8s.podspec import node_daemonset, node_security_context
from meshctl.core.wire import zds

NAME = "meshctl-cni-node"
READINESS_PORT = 8000
XTABLES_LOCK = "/run/xtables.lock"
# Where the installer's container sees the host's CNI directories (whatever their host paths).
MOUNTED_BIN_DIR = layout.mounted(layout.HOST_CNI_BIN_DIR)
MOUNTED_CONF_DIR = layout.mounted(layout.HOST_CNI_CONF_DIR)


@dataclass(frozen=True, slots=True, kw_only=True)
class CniValues:
    """The CNI node agent's values (``components.cni.*``)."""

    cni_bin_dir: str = value(layout.HOST_CNI_BIN_DIR, help="the nodes' CNI plugin directory")
    cni_conf_dir: str = value(layout.HOST_CNI_CONF_DIR, help="the nodes' CNI config directory")
    exclude_namespaces: tuple[str, ...] = value(
        ("kube-system",),
        help="namespaces whose pods are never captured (the mesh's own is always added)",
        check=dns_label,
    )
    ambient: bool = value(
        False, help="also run the ambient node agent (enrolls pods for the node proxy)"
    )
    netns_dir: str = value(
        layout.HOST_NETNS_DIR,
        help="where the runtime pins pod network namespaces on the nodes",
    )


def objects(install: InstallValues, own: CniValues) -> list[Object]:
    """ServiceAccount, ClusterRole, ClusterRoleBinding and DaemonSet, in apply order (a
    stand-alone manifest puts the namespace first, so ``kubectl apply -f`` of it works on a new
    cluster). The mesh's own namespace is never captured."""
    namespace = install.namespace
    ambient = own.ambient
    run_dir, ztunnel_dir, netns_dir = DEFAULT_RUN_DIR, zds.DEFAULT_DIR, own.netns_dir
    excluded = tuple(dict.fromkeys([*own.exclude_namespaces, namespace]))
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "meshctl"}
    meta: Object = {"name": NAME, "namespace": namespace, "labels": labels}
    env: list[Object] = [
        {"name": "CNI_BIN_DIR", "value": MOUNTED_BIN_DIR},
        {"name": "MOUNTED_CNI_NET_DIR", "value": MOUNTED_CONF_DIR},
        {"name": "CNI_AGENT_RUN_DIR", "value": run_dir},
        {"name": "EXCLUDE_NAMESPACES", "value": ",".join(excluded)},
        {"name": "MESHCTL_CNI_READINESS_ADDRESS", "value": f":{READINESS_PORT}"},
        {"name": "MESHCTL_CNI_NETNS_DIR", "value": netns_dir},
    ]
    mounts = [
        ("cni-bin-dir", own.cni_bin_dir, MOUNTED_BIN_DIR),
        ("cni-net-dir", own.cni_conf_dir, MOUNTED_CONF_DIR),
        # Same path inside and out: the conflist entry names it for the plugin on the host, and
        # the plugin finds the agent's socket there.
        ("cni-run-dir", run_dir, run_dir),
        # The runtime's pinned netns files (containerd: /var/run/netns/cni-...), at the same
        # path: the plugin passes them as they are on the host, the agent enters them.
        ("cni-netns-dir", netns_dir, netns_dir),
    ]
    if ambient:
        env += [
            {"name": AGENT_ENV, "value": "true"},
            {"name": "ZTUNNEL_UDS_ADDRESS", "value": f"{ztunnel_dir}/ztunnel.sock"},
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            # Its own pod: on SIGTERM, a DaemonSet going away means uninstall (release pods).
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
        ]
        mounts += [("cni-ztunnel-sock-dir", ztunnel_dir, ztunnel_dir)]
        files = [
            # The node's xtables lock, as kube-proxy mounts it: legacy writes to the node's own
            # tables take it (the root filesystem is read-only, and the lock must be the node's
            # so kube-proxy's writes and ours never interleave).
            ("xtables-lock", XTABLES_LOCK, XTABLES_LOCK),
        ]
    else:
        files = []
    pull = install.image_pull_policy
    container: Object = {
        "name": "install-cni",
        "image": install.image,
        **({"imagePullPolicy": pull} if pull else {}),
        "command": ["meshctl"],
        "args": ["--log-level", "info", "--log-format", "json", "cni", "install"],
        "env": env,
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": READINESS_PORT},
            "periodSeconds": 5,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": READINESS_PORT},
            "periodSeconds": 10,
        },
        "resources": {"requests": {"cpu": "10m", "memory": "40Mi"}},
        # setns into pods (SYS_ADMIN), their rules (NET_ADMIN; libiptc's raw socket: NET_RAW)
        # and, ambient, the node's.
        "securityContext": node_security_context(["NET_ADMIN", "NET_RAW", "SYS_ADMIN"]),
        "volumeMounts": [
            *(_mount(n, inside) for n, _, inside in mounts + files),
            # The one writable place under the read-only root. Our image's one-dir tree needs
            # none, but an image built on the one-file binary unpacks itself into /tmp before
            # it runs (without it: "Could not create temporary directory!" and a crash loop, as
            # seen on the real test node).
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 -- the pod's own emptyDir
        ],
    }
    daemonset = node_daemonset(
        meta=meta,
        labels=labels,
        container=container,
        volumes=[
            *(
                {"name": n, "hostPath": {"path": host, "type": "DirectoryOrCreate"}}
                for n, host, _ in mounts
            ),
            *(
                {"name": n, "hostPath": {"path": host, "type": "FileOrCreate"}}
                for n, host, _ in files
            ),
            {"name": "tmp", "emptyDir": {}},
        ],
        # Ambient: an uninstall releases every pod before the agent exits.
        grace_seconds=30 if ambient else 10,
        host_network=ambient,
    )
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": NAME, "labels": labels},
            "rules": rules(ambient=ambient),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME, "labels": labels},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": NAME,
            },
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}],
        },
        daemonset,
    ]


def _mount(name: str, path: str) -> Object:
    if name == "cni-netns-dir":  # namespaces pinned after we started
        return {"name": name, "mountPath": path, "mountPropagation": "HostToContainer"}
    return {"name": name, "mountPath": path}


def rules(*, ambient: bool) -> list[Object]:
    """The plugin's and (ambient) the node agent's permissions."""
    if not ambient:
        return [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    return [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        # On exit: is its DaemonSet going away (uninstall) or staying (upgrade)?
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get"]},
    ]
