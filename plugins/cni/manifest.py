"""The objects that run ``meshctl cni install`` on every node: RBAC and the DaemonSet, as data.

Invariants: the installer runs unprivileged (root only to write the host's CNI dirs, every
capability dropped, read-only root filesystem); it mounts exactly the three host paths it writes;
the plugin's RBAC is read-only on pods (the CNI plugin only ever GETs the pod it is called for).
With ``ambient`` (the node agent runs too, like istio-cni's): the host network, the capabilities
to enter pod namespaces and change their rules and the node's (NET_ADMIN, SYS_ADMIN), the host's
netns and ZDS socket directories and its xtables lock, and RBAC to watch pods and namespaces,
annotate pods, record events and read DaemonSets (is its own going away?); nothing more.
"""

from __future__ import annotations

from typing import Any

from meshctl.core.k8s.ambient import AGENT_ENV
from meshctl.core.k8s.cni.spec import DEFAULT_RUN_DIR
from meshctl.core.k8s.image import default_image
from meshctl.core.k8s.install.manifest import namespace_object
from meshctl.core.k8s.podspec import node_security_context

NAME = "meshctl-cni-node"
READINESS_PORT = 8000
XTABLES_LOCK = "/run/xtables.lock"


def objects(
    *,
    namespace: str = "meshctl-system",
    image: str | None = None,
    cni_bin_dir: str = "/opt/cni/bin",
    cni_conf_dir: str = "/etc/cni/net.d",
    run_dir: str = DEFAULT_RUN_DIR,
    exclude_namespaces: tuple[str, ...] = ("kube-system", "meshctl-system"),
    image_pull_policy: str | None = None,
    ambient: bool = False,
    ztunnel_dir: str = "/var/run/ztunnel",
    netns_dir: str = "/var/run/netns",
) -> list[dict[str, Any]]:
    """Namespace, ServiceAccount, ClusterRole, ClusterRoleBinding and DaemonSet, in apply
    order (the namespace first, so ``kubectl apply -f`` of the output works on a new cluster)."""
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "meshctl"}
    meta = {"name": NAME, "namespace": namespace, "labels": labels}
    env: list[dict[str, Any]] = [
        {"name": "CNI_BIN_DIR", "value": "/host/opt/cni/bin"},
        {"name": "MOUNTED_CNI_NET_DIR", "value": "/host/etc/cni/net.d"},
        {"name": "CNI_AGENT_RUN_DIR", "value": run_dir},
        {"name": "EXCLUDE_NAMESPACES", "value": ",".join(exclude_namespaces)},
        {"name": "MESHCTL_CNI_READINESS_ADDRESS", "value": f":{READINESS_PORT}"},
    ]
    mounts = [
        ("cni-bin-dir", cni_bin_dir, "/host/opt/cni/bin"),
        ("cni-net-dir", cni_conf_dir, "/host/etc/cni/net.d"),
        # Same path inside and out: the conflist entry names it for the plugin on the host.
        ("cni-run-dir", run_dir, run_dir),
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
            {"name": "MESHCTL_CNI_NETNS_DIR", "value": netns_dir},
        ]
        mounts += [
            # The runtime's pinned netns files (containerd: /var/run/netns/cni-...), at the same
            # path: the plugin reports them as it sees them on the host.
            ("cni-netns-dir", netns_dir, netns_dir),
            ("cni-ztunnel-sock-dir", ztunnel_dir, ztunnel_dir),
        ]
        files = [
            # The node's xtables lock, as kube-proxy mounts it: legacy writes to the node's own
            # tables take it (the root filesystem is read-only, and the lock must be the node's
            # so kube-proxy's writes and ours never interleave).
            ("xtables-lock", XTABLES_LOCK, XTABLES_LOCK),
        ]
    else:
        files = []
    container = {
        "name": "install-cni",
        "image": image or default_image(),
        **({"imagePullPolicy": image_pull_policy} if image_pull_policy else {}),
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
        # Ambient: setns into pods (SYS_ADMIN), their rules and the node's (NET_ADMIN, RAW).
        "securityContext": node_security_context(
            ["NET_ADMIN", "NET_RAW", "SYS_ADMIN"] if ambient else ()
        ),
        "volumeMounts": [
            *(_mount(n, inside) for n, _, inside in mounts + files),
            # The one writable place under the read-only root. Our image's one-dir tree needs
            # none, but an image built on the one-file binary unpacks itself into /tmp before
            # it runs (without it: "Could not create temporary directory!" and a crash loop, as
            # seen on the real test node).
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 -- the pod's own emptyDir
        ],
    }
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": labels, "annotations": {"sidecar.istio.io/inject": "false"}},
                "spec": {
                    **(
                        {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}
                        if ambient
                        else {}
                    ),
                    "serviceAccountName": NAME,
                    # Pods cannot start on a node without the mesh's CNI plugin in place.
                    "priorityClassName": "system-node-critical",
                    "tolerations": [{"operator": "Exists"}],
                    # Ambient: an uninstall releases every pod before the agent exits.
                    "terminationGracePeriodSeconds": 30 if ambient else 10,
                    "nodeSelector": {"kubernetes.io/os": "linux"},
                    "containers": [container],
                    "volumes": [
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
                },
            },
        },
    }
    return [
        namespace_object(namespace),
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


_HOST_NETWORK = {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}


def _mount(name: str, path: str) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": name, "mountPath": path}
    if name == "cni-netns-dir":
        mount["mountPropagation"] = "HostToContainer"  # namespaces pinned after we started
    return mount


def rules(*, ambient: bool) -> list[dict[str, Any]]:
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
