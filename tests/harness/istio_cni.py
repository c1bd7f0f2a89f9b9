"""Istio's CNI node agent (``install-cni`` of the istio-cni chart) on the test node.

Owns the agent as Kubernetes objects, as the chart renders them with ``ambient.enabled=true``
(its ConfigMap's settings inlined as env, the chart's capabilities, hostPaths and RBAC; repair
off: it serves sidecars, which this agent is not run for), and its image: the binaries
tests/kube/build.sh --istio-cni built from the pinned Istio module, put into an image by
packaging/image/build.py and imported into the node. Invariants: the DaemonSet is named
``istio-cni-node`` in the namespace it runs in, so the agent, when that DaemonSet is deleted,
knows it is an uninstall and removes its plugin, kubeconfig and host rules; nothing here
renders meshctl objects.

One difference from the chart: it mounts the node's /proc at /host/proc, where the agent reads
the node's netns (pid 1's) and finds the netns of pods that ran before it started. This
machine's pid 1 (its sandbox's supervisor) lets no one read /proc/1/ns/net, not even root on
the host, and the agent stops on that; so the image's /host/proc is the container's own /proc
(packaging/image/build.py), whose pid 1 is the agent itself, in the node's netns. Pods added
through the plugin (here all of them: they start after the agent) are entered by the netns path
the runtime gives, mounted under /host as the chart does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from pyroute2 import IPSet

from . import istio
from .kube import REPO_ROOT

NAME = "istio-cni"
DAEMONSET = f"{NAME}-node"  # the agent looks itself up by this name when it stops
ZDS_DIR = "/var/run/ztunnel"  # ZTUNNEL_UDS_ADDRESS's default folder (ztunnel.sock in it)
AGENT_RUN_DIR = "/var/run/istio-cni"  # the plugin's event socket and log socket (hostPath)
# The chart's default ambient.enablementSelectors: a pod labelled ambient, or any pod not
# labelled none in a namespace labelled ambient.
ENABLEMENT_SELECTORS = [
    {"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}},
    {
        "podSelector": {
            "matchExpressions": [
                {"key": "istio.io/dataplane-mode", "operator": "NotIn", "values": ["none"]}
            ]
        },
        "namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}},
    },
]


HOST_CHAIN = "ISTIO_POSTRT"  # the agent's one chain in the node's nat table (probe SNAT)
HOST_IPSETS = ("istio-inpod-probes-v4", "istio-inpod-probes-v6")


def remove_host_rules() -> list[str]:
    """Removes what the agent leaves on the node when it dies without its cleanup (a crash, a
    kill): its nat chain and the jump to it, its probe ipsets. Returns what was there."""
    removed = []
    for tool in ("iptables-legacy", "iptables-nft", "ip6tables-legacy", "ip6tables-nft"):
        listed = subprocess.run(
            [tool, "-t", "nat", "-S", HOST_CHAIN], capture_output=True, text=True, check=False
        )
        if listed.returncode != 0:
            continue
        removed.append(f"{tool} nat/{HOST_CHAIN}")
        for args in (
            ["-D", "POSTROUTING", "-j", HOST_CHAIN],
            ["-F", HOST_CHAIN],
            ["-X", HOST_CHAIN],
        ):
            subprocess.run([tool, "-t", "nat", *args], capture_output=True, check=False)
    with IPSet() as ipset:
        present = {m.get_attr("IPSET_ATTR_SETNAME") for m in ipset.list()}
        for name in HOST_IPSETS:
            if name in present:
                ipset.destroy(name)
                removed.append(f"ipset {name}")
    return removed


def image_archive(out: Path) -> tuple[Path, str]:
    """The agent's image tarball under ``out`` and its reference (the binaries built first
    when missing; the tarball is cached by its inputs, so a warm run only copies it)."""
    istio.istio_cni_binaries()
    built = subprocess.run(
        [sys.executable, str(REPO_ROOT / "packaging" / "image" / "build.py"),
         "--out", str(out), "istio-cni"],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    if built.returncode != 0:
        raise RuntimeError(f"packaging/image/build.py istio-cni: {built.stderr.strip()}")
    written = json.loads((out / "images.json").read_text())["istio-cni"]
    return out / written["file"], str(written["ref"])


def objects(namespace: str, image: str, netns_dir: str) -> list[dict[str, Any]]:
    """ServiceAccount, RBAC and the DaemonSet, in apply order. ``netns_dir`` is where the node's
    runtime pins pod netns (the chart's ``cniNetnsDir``), seen by the agent under /host."""
    labels = {"app.kubernetes.io/name": NAME, "k8s-app": DAEMONSET}
    meta = {"name": NAME, "namespace": namespace, "labels": labels}
    role_name = f"{NAME}-{namespace}"
    rules = [
        {"apiGroups": [""], "resources": ["pods", "nodes", "namespaces"],
         "verbs": ["get", "list", "watch"]},
        # The enrolment annotation (ambient.istio.io/redirection) goes on pods/status.
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch", "update"]},
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": [DAEMONSET],
         "verbs": ["get"]},
    ]  # fmt: skip
    settings = {
        "AMBIENT_ENABLED": "true",
        "AMBIENT_ENABLEMENT_SELECTOR": yaml.safe_dump(ENABLEMENT_SELECTORS),
        "AMBIENT_DNS_CAPTURE": "true",
        # The chart's default is true; the test node has no IPv6 pod network, and with it on the
        # agent's ip6tables probes load the node's IPv6 nat tables, which outlive it.
        "AMBIENT_IPV6": "false",
        "AMBIENT_RECONCILE_POD_RULES_ON_STARTUP": "true",
        "CHAINED_CNI_PLUGIN": "true",
        "ISTIO_OWNED_CNI_CONFIG": "false",
        "EXCLUDE_NAMESPACES": "kube-system",
        "REPAIR_ENABLED": "false",
        "NATIVE_NFTABLES": "false",
        "ALLOW_SWITCH_TO_HOST_NS": "true",
        "SYSTEM_NAMESPACE": namespace,
    }
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in settings.items()]
    env += [
        {"name": n, "valueFrom": {"fieldRef": {"fieldPath": f}}}
        for n, f in (
            ("NODE_NAME", "spec.nodeName"),
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
        )
    ]
    host_paths = [
        ("cni-bin-dir", "/opt/cni/bin", "/host/opt/cni/bin", None),
        ("cni-net-dir", "/etc/cni/net.d", "/host/etc/cni/net.d", None),
        ("cni-socket-dir", AGENT_RUN_DIR, AGENT_RUN_DIR, "DirectoryOrCreate"),
        ("cni-netns-dir", netns_dir, f"/host{netns_dir}", "DirectoryOrCreate"),
        ("cni-ztunnel-sock-dir", ZDS_DIR, ZDS_DIR, "DirectoryOrCreate"),
    ]
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    for name, host, inside, kind in host_paths:
        mount: dict[str, Any] = {"name": name, "mountPath": inside}
        if name == "cni-netns-dir":
            mount["mountPropagation"] = "HostToContainer"  # netns pinned after the agent started
        mounts.append(mount)
        volumes.append(
            {"name": name, "hostPath": {"path": host, **({"type": kind} if kind else {})}}
        )
    container = {
        "name": "install-cni",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["install-cni"],
        "args": ["--log_output_level=info"],
        "env": env,
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8000}, "periodSeconds": 2},
        "securityContext": {
            "privileged": False,
            "runAsUser": 0,
            "runAsGroup": 0,
            "runAsNonRoot": False,
            "capabilities": {
                "drop": ["ALL"],
                "add": ["NET_ADMIN", "NET_RAW", "SYS_PTRACE", "SYS_ADMIN", "DAC_OVERRIDE"],
            },
        },
        "volumeMounts": mounts,
    }
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {**meta, "name": DAEMONSET},
        "spec": {
            "selector": {"matchLabels": {"k8s-app": DAEMONSET}},
            "template": {
                "metadata": {
                    "labels": {
                        **labels,
                        "sidecar.istio.io/inject": "false",
                        "istio.io/dataplane-mode": "none",
                    },
                },
                "spec": {
                    "hostNetwork": True,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "serviceAccountName": NAME,
                    "terminationGracePeriodSeconds": 30,  # the chart's: time for its cleanup
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }
    role_meta = {"name": role_name, "labels": labels}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": role_meta, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": role_meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": role_name},
         "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}]},
        daemonset,
    ]  # fmt: skip
