"""A real single-node Kubernetes for the test suite: the `kube_node` fixture.

Owns: finding the node binaries (tests/kube/build.sh), the per-component x509 identities and
kubeconfigs, the configs of containerd, kubelet and kube-proxy, starting etcd, kube-apiserver
(on the node bridge address, lease endpoint reconciler: pods reach `kubernetes.default`),
controller-manager, scheduler, containerd, kubelet and kube-proxy (nftables mode), importing the
node's images, and stopping all of it. Host state (bridge, guard, sysctls, host paths, cleanup of
a killed run) is tests/harness/nodehost.py's.
Invariants: one node per machine (a flock, held from a start to its stop); every start records the
host state before changing it, and every stop (or the next start after a killed run) restores it;
pods get addresses on the node bridge only, and nothing they send is forwarded off the machine.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.harness import clusterdns, nodehost
from tests.harness import workloads as wl
from tests.harness.kube import (
    BUILD_HINT,
    REPO_ROOT,
    CertificateAuthority,
    ControlPlaneOptions,
    KubeBinaries,
    KubeCluster,
    _Child,
    cache_root,
    client_kubeconfig,
    free_port,
    locate_binaries,
    pinned_version,
    running_cluster,
)

NODE_NAME = "meshctl-test-node"
# A test-only range: the bridge exists only while the node runs; pods, the node address and the
# service range never leave the machine (guard table, unreachable route).
NODE_NETWORK = ipaddress.IPv4Network("10.250.0.0/24")
NODE_IP = str(NODE_NETWORK.network_address + 1)
SERVICE_NETWORK = "10.250.128.0/24"
CONFLIST_NAME = "10-meshctl-test-node.conflist"
CNI_CONF_DIR = Path("/etc/cni/net.d")
CNI_BIN_DIR = Path("/opt/cni/bin")  # where a CNI DaemonSet installs its plugin (hostPath)
DEBIAN_CNI_DIR = Path("/usr/lib/cni")  # the reference plugins (bridge, host-local, loopback)
CONTAINERD_GO_MOD = REPO_ROOT / "tests" / "kube" / "containerd" / "go.mod"
K8S_NODE_BINARIES = (
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "kubectl",
)
CONTAINERD_BINARIES = ("containerd", "ctr", "containerd-shim-runc-v2")
KUBELET_PORT = 10250
LOCK_TIMEOUT_ENV = "MESHCTL_NODE_LOCK_TIMEOUT"


# ---------------------------------------------------------------------------------------------
# Binaries and preconditions


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeBinaries:
    """Everything the node runs, with the Kubernetes and containerd versions."""

    control_plane: KubeBinaries
    k8s_dir: Path
    containerd_version: str
    containerd_dir: Path
    runc: Path

    def k8s(self, name: str) -> Path:
        return self.k8s_dir / name

    def containerd(self, name: str) -> Path:
        return self.containerd_dir / name


def containerd_version(go_mod: Path = CONTAINERD_GO_MOD) -> str:
    for line in go_mod.read_text().splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "github.com/containerd/containerd/v2":
            return words[1]
    raise ValueError(f"{go_mod}: no github.com/containerd/containerd/v2 requirement")


def locate_node_binaries() -> NodeBinaries | str:
    """The binaries, or the reason (with the fix) why they are not there."""
    control_plane = locate_binaries()
    if isinstance(control_plane, str):
        return control_plane
    k8s_dir = cache_root() / "k8s" / pinned_version()
    version = containerd_version()
    containerd_dir = cache_root() / "containerd" / version
    for path in [
        *(k8s_dir / n for n in K8S_NODE_BINARIES),
        *(containerd_dir / n for n in CONTAINERD_BINARIES),
    ]:
        if not os.access(path, os.X_OK):
            return f"{path.name} not built ({path} missing): {BUILD_HINT}"
    runc = shutil.which("runc")
    if runc is None:
        return "no runc on PATH: apt-get install runc"
    return NodeBinaries(
        control_plane=control_plane,
        k8s_dir=k8s_dir,
        containerd_version=version,
        containerd_dir=containerd_dir,
        runc=Path(runc),
    )


def host_unfit_reason() -> str | None:
    """Why this machine's kernel or cgroups cannot run the node, or None when they can."""
    if os.geteuid() != 0:
        return "the test node needs root (cgroups, mounts, a host bridge, nft)"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlay file system (containerd's snapshotter needs it)"
    hierarchies = (
        {p.name for p in nodehost.CGROUP_FS.iterdir()} if nodehost.CGROUP_FS.is_dir() else set()
    )
    v2 = (nodehost.CGROUP_FS / "cgroup.controllers").exists()
    if not v2 and not {"cpu", "memory", "pids"} <= hierarchies:
        return (
            f"cgroups: neither cgroup2 nor the v1 cpu, memory and pids hierarchies under "
            f"{nodehost.CGROUP_FS} (found {sorted(hierarchies)})"
        )
    for tool in ("nft", "ip", "iptables-nft-save", "mount", "dnsmasq"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH (.ci/run installs it)"
    return None


# ---------------------------------------------------------------------------------------------
# Identities and configs


def node_conflist() -> dict[str, Any]:
    """The node's network: the seed's `dbnet` shape (bridge + host-local) on the node bridge.

    `isGateway: false`: the bridge already has the node address, and a gateway bridge would turn
    on forwarding by itself at every ADD (forwarding is on only behind the guard table).
    """
    return {
        "cniVersion": "1.0.0",
        "name": "meshctl-test-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": nodehost.BRIDGE,
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": True,  # a pod reaches itself through its own Service
                "ipam": {
                    "type": "host-local",
                    "subnet": str(NODE_NETWORK),
                    "gateway": NODE_IP,
                    "rangeStart": str(NODE_NETWORK.network_address + 16),
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(nodehost.WORKDIR / "cni-ipam"),
                },
            }
        ],
    }


def registry_hosts_dir(workdir: Path) -> Path:
    """containerd's registry ``config_path``: one ``<host:port>/hosts.toml`` per registry."""
    return workdir / "containerd" / "certs.d"


def containerd_config(workdir: Path, runc: Path, sandbox_image: str) -> str:
    """containerd 2.x (config version 3): private root/state/sockets, the node's CNI paths."""
    cd = workdir / "containerd"
    cri_runtime = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""\
version = 3
root = '{cd / "root"}'
state = '{cd / "state"}'
# Hooks and sockets that would land in host-global places, or that nothing here uses.
disabled_plugins = [
  'io.containerd.nri.v1.nri',
  'io.containerd.tracing.processor.v1.otlp',
  'io.containerd.internal.v1.tracing',
]

[grpc]
  address = '{cd / "containerd.sock"}'
[ttrpc]
  address = '{cd / "containerd.sock.ttrpc"}'
[debug]
  address = ''
  level = 'info'

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = '{cd / "opt"}'
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    # Per-registry host configs (hosts.toml), read at each pull: a test registry on loopback
    # adds its directory here (tests/harness/registry.py, node_pulls_from).
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '{registry_hosts_dir(workdir)}'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{sandbox_image}'
  [{cri_runtime}]
    # root here lacks CAP_SYS_RESOURCE: runc must not try to lower oom_score_adj.
    restrict_oom_score_adj = true
    # Pod netns files under our state dir, not /run/netns (other tests' namespaces live there).
    netns_mounts_under_state_dir = true
    enable_unprivileged_ports = true
    enable_unprivileged_icmp = true
    cdi_spec_dirs = []
    [{cri_runtime}.containerd]
      default_runtime_name = 'runc'
      [{cri_runtime}.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [{cri_runtime}.containerd.runtimes.runc.options]
          BinaryName = '{runc}'
          Root = '{cd / "runc"}'
          SystemdCgroup = false
    [{cri_runtime}.cni]
      # A CNI DaemonSet installs into /opt/cni/bin; the reference plugins come from Debian.
      bin_dirs = ['{CNI_BIN_DIR}', '{DEBIAN_CNI_DIR}']
      conf_dir = '{CNI_CONF_DIR}'
      max_conf_num = 1
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
"""


def kubelet_config(pki: Path, socket: Path, healthz_port: int, workdir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # These machines run cgroup v1 (hybrid); kubelet refuses it unless told otherwise.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{nodehost.CGROUP_ROOT}",
        "failSwapOn": False,
        "address": NODE_IP,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(pki / "client-ca.crt")},
        },
        # Only client-cert holders of our CA (the apiserver) get past authentication.
        "authorization": {"mode": "AlwaysAllow"},
        "tlsCertFile": str(pki / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(pki / "kubelet-serving.key"),
        "containerRuntimeEndpoint": f"unix://{socket}",
        "imageServiceEndpoint": f"unix://{socket}",
        "clusterDomain": clusterdns.DOMAIN,
        # Pods resolve Service names through the node's DNS (tests/harness/clusterdns.py).
        "clusterDNS": [NODE_IP],
        "podLogsDir": str(workdir / "pod-logs"),
        "resolvConf": str(workdir / "resolv.conf"),
        # A shared CI disk must not make kubelet evict pods or collect our imported images.
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "syncFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
        "shutdownGracePeriod": "0s",
        "staticPodPath": "",
        "makeIPTablesUtilChains": False,
        "enableControllerAttachDetach": True,
    }


def kube_proxy_config(kubeconfig: Path, metrics_port: int, healthz_port: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "bindAddress": NODE_IP,
        "clusterCIDR": str(NODE_NETWORK),
        "nodePortAddresses": [f"{NODE_IP}/32"],
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        # 0 everywhere: leave the host's conntrack sysctls alone.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
            "udpTimeout": "0s",
            "udpStreamTimeout": "0s",
        },
    }


# ---------------------------------------------------------------------------------------------
# The running node


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeCluster:
    """A running single-node cluster: the control plane, the node's name/IP, its image tags."""

    control_plane: KubeCluster
    node_name: str
    node_ip: str
    pod_network: str
    service_network: str
    containerd_socket: Path
    kubectl: Path
    ctr: Path
    images: Mapping[str, str]  # role -> tag (pause, busybox/testapp, meshctl when built)
    workdir: Path
    start_seconds: float

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    def api_client(self) -> k8s.ApiClient:
        """A new admin ApiClient; the caller closes it."""
        return self.control_plane.api_client()

    def kubectl_run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """kubectl against the node (debugging, benchmark comparisons; helpers never use it)."""
        return subprocess.run(
            [str(self.kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def import_image(self, archive: Path) -> None:
        """Imports a docker-save/OCI tarball into the node's containerd (namespace k8s.io)."""
        proc = subprocess.run(
            [
                str(self.ctr),
                "--address",
                str(self.containerd_socket),
                "-n",
                "k8s.io",
                "images",
                "import",
                str(archive),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"ctr images import {archive} failed: {proc.stderr.strip()}")


class NodeStartError(RuntimeError):
    """A component did not come up; the message carries the failing component's last log lines."""


def _failure(what: str, children: list[_Child], culprit: str | None = None) -> NodeStartError:
    dead = [c for c in children if c.proc.poll() is not None]
    shown = dead or [c for c in children if c.name == culprit] or children[-2:]
    tails = "\n".join(
        f"--- {c.name} (last log lines, {c.log}) ---\n{c.log_tail(30)}" for c in shown
    )
    return NodeStartError(f"test node failed to start: {what}\n{tails}")


def _wait(
    what: str, ok: Any, timeout: float, children: list[_Child], culprit: str, interval: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for child in children:
            if child.proc.poll() is not None:
                raise _failure(
                    f"{child.name} exited with {child.proc.returncode} while waiting for {what}",
                    children,
                )
        try:
            if ok():
                return
        except (OSError, ApiException):
            pass
        if time.monotonic() > deadline:
            raise _failure(f"timed out after {timeout:.0f}s waiting for {what}", children, culprit)
        time.sleep(interval)


class _Start:
    """One start of the node: everything it started, in order, for the matching stop."""

    def __init__(self, binaries: NodeBinaries) -> None:
        self.binaries = binaries
        self.children: list[_Child] = []
        self.stack = contextlib.ExitStack()
        self.server_ca: CertificateAuthority | None = None
        self.client_ca: CertificateAuthority | None = None
        self.pki = Path()
        self.kubeconfigs: Mapping[str, Path] = {}

    def child(self, name: str, argv: list[str]) -> _Child:
        logs = nodehost.WORKDIR / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        proc = _Child(name, argv, logs / f"{name}.log")
        self.children.append(proc)
        return proc

    def run(self, image_archives: Mapping[str, Path]) -> NodeCluster:
        started = time.monotonic()
        workdir = nodehost.WORKDIR
        self._prepare_host(workdir)
        pki = workdir / "pki"
        pki.mkdir()
        server_ca = CertificateAuthority("meshctl-test-node-server-ca")
        client_ca = CertificateAuthority("meshctl-test-node-client-ca")
        cluster = self._control_plane(workdir, pki, server_ca, client_ca)
        kubeconfigs = {
            name: self._kubeconfig(cluster, client_ca, pki, name, user, orgs)
            for name, user, orgs in (
                ("controller-manager", "system:kube-controller-manager", ()),
                ("scheduler", "system:kube-scheduler", ()),
                ("kubelet", f"system:node:{NODE_NAME}", ("system:nodes",)),
                ("kube-proxy", "system:kube-proxy", ()),
            )
        }
        server_ca.issue(NODE_NAME, server=True, ip_sans=[NODE_IP], dns_sans=[NODE_NAME]).write(
            pki, "kubelet-serving"
        )
        # A second node (tests/harness/node2.py) gets its identities from the same CAs.
        self.server_ca, self.client_ca, self.pki = server_ca, client_ca, pki
        self.kubeconfigs = kubeconfigs
        self._cluster_dns(cluster, workdir)
        # containerd first: the images must be there before kubelet asks for the sandbox.
        socket, tags = self._containerd(workdir, image_archives)
        self._controllers(workdir, pki, kubeconfigs)
        kubelet_yaml = workdir / "kubelet.yaml"
        kubelet_yaml.write_text(yaml.safe_dump(kubelet_config(pki, socket, free_port(), workdir)))
        kubelet = self.child(
            "kubelet",
            [
                str(self.binaries.k8s("kubelet")),
                f"--config={kubelet_yaml}",
                f"--kubeconfig={kubeconfigs['kubelet']}",
                f"--root-dir={workdir / 'kubelet'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
                "--v=1",
            ],
        )
        proxy_yaml = workdir / "kube-proxy.yaml"
        proxy_healthz = free_port()
        proxy_yaml.write_text(
            yaml.safe_dump(kube_proxy_config(kubeconfigs["kube-proxy"], free_port(), proxy_healthz))
        )
        proxy = self.child(
            "kube-proxy", [str(self.binaries.k8s("kube-proxy")), f"--config={proxy_yaml}"]
        )
        with cluster.api_client() as api:
            core = k8s.CoreV1Api(api)
            _wait(
                "the node to be Ready", lambda: _node_ready(core), 120, self.children, kubelet.name
            )
            _wait(
                "the default ServiceAccount",
                lambda: wl.service_account_exists(api, "default", "default"),
                60,
                self.children,
                "kube-controller-manager",
            )
            _wait(
                "kube-proxy healthz", lambda: _healthz(proxy_healthz), 60, self.children, proxy.name
            )
        return NodeCluster(
            control_plane=cluster,
            node_name=NODE_NAME,
            node_ip=NODE_IP,
            pod_network=str(NODE_NETWORK),
            service_network=SERVICE_NETWORK,
            containerd_socket=socket,
            kubectl=self.binaries.k8s("kubectl"),
            ctr=self.binaries.containerd("ctr"),
            images=tags,
            workdir=workdir,
            start_seconds=time.monotonic() - started,
        )

    def _cluster_dns(self, cluster: KubeCluster, workdir: Path) -> None:
        """Service names for pods: dnsmasq on the node address, fed the cluster's Services."""
        hosts = workdir / "dns"
        feed = clusterdns.ServiceRecords(cluster.api_client, hosts).start()
        self.stack.callback(feed.stop)
        dns = self.child(
            "dnsmasq", clusterdns.dnsmasq_argv(str(shutil.which("dnsmasq")), NODE_IP, hosts)
        )
        name = f"kubernetes.default.svc.{clusterdns.DOMAIN}"
        _wait(
            f"the cluster DNS to answer {name}",
            lambda: bool(clusterdns.query_a(NODE_IP, name)),
            30,
            self.children,
            dns.name,
        )

    def _prepare_host(self, workdir: Path) -> None:
        workdir.mkdir(parents=True)
        # A real node's / is a shared mount (systemd makes it so); this machine's may be private,
        # and a pod's HostToContainer mount (the ambient agent's netns dir) needs a shared or
        # slave source. So the node's tree is its own shared mount (undone by nodehost.cleanup,
        # which unmounts everything under it).
        for argv in (["mount", "--bind", str(workdir), str(workdir)],
                     ["mount", "--make-rshared", str(workdir)]):  # fmt: skip
            subprocess.run(argv, check=True, capture_output=True, timeout=30)
        # The host's resolvers stay out of pods: names outside the cluster are not resolved.
        (workdir / "resolv.conf").write_text("")
        for hierarchy in nodehost.hierarchies():
            (hierarchy / nodehost.CGROUP_ROOT).mkdir(exist_ok=True)
        nodehost.setup_network(
            nodehost.BRIDGE, f"{NODE_IP}/{NODE_NETWORK.prefixlen}", SERVICE_NETWORK
        )
        CNI_CONF_DIR.mkdir(parents=True, exist_ok=True)
        CNI_BIN_DIR.mkdir(parents=True, exist_ok=True)
        (CNI_CONF_DIR / CONFLIST_NAME).write_text(json.dumps(node_conflist(), indent=2) + "\n")

    def _control_plane(
        self,
        workdir: Path,
        pki: Path,
        server_ca: CertificateAuthority,
        client_ca: CertificateAuthority,
    ) -> KubeCluster:
        # The apiserver's identity towards kubelets (exec, logs, port-forward).
        apiserver_client = client_ca.issue(
            "kube-apiserver-kubelet-client", organizations=["system:masters"], client=True
        )
        ak_crt, ak_key = apiserver_client.write(pki, "apiserver-kubelet-client")
        (pki / "server-ca.crt").write_bytes(server_ca.cert_pem)
        (pki / "client-ca.crt").write_bytes(client_ca.cert_pem)
        options = ControlPlaneOptions(
            address=NODE_IP,
            service_cluster_ip_range=SERVICE_NETWORK,
            endpoint_reconciler="lease",
            server_ca=server_ca,
            client_ca=client_ca,
            extra_apiserver_args=(
                f"--kubelet-client-certificate={ak_crt}",
                f"--kubelet-client-key={ak_key}",
                f"--kubelet-certificate-authority={pki / 'server-ca.crt'}",
                "--kubelet-preferred-address-types=InternalIP",
            ),
        )
        control_plane_dir = workdir / "control-plane"
        control_plane_dir.mkdir()
        try:
            return self.stack.enter_context(
                running_cluster(
                    self.binaries.control_plane, options=options, workdir=control_plane_dir
                )
            )
        except RuntimeError as exc:
            raise NodeStartError(f"test node failed to start: {exc}") from exc

    @staticmethod
    def _kubeconfig(
        cluster: KubeCluster,
        client_ca: CertificateAuthority,
        pki: Path,
        name: str,
        user: str,
        orgs: tuple[str, ...],
    ) -> Path:
        identity = client_ca.issue(user, organizations=orgs, client=True)
        path = pki / f"{name}.kubeconfig"
        path.touch(mode=0o600)
        path.write_text(
            yaml.safe_dump(client_kubeconfig(cluster.server, cluster.ca_pem, identity, user))
        )
        return path

    def _containerd(
        self, workdir: Path, image_archives: Mapping[str, Path]
    ) -> tuple[Path, dict[str, str]]:
        socket = workdir / "containerd" / "containerd.sock"
        config = workdir / "containerd" / "config.toml"
        config.parent.mkdir()
        sandbox = _archive_tags(image_archives["pause"])[0]
        config.write_text(containerd_config(workdir, self.binaries.runc, sandbox))
        containerd = self.child(
            "containerd", [str(self.binaries.containerd("containerd")), "--config", str(config)]
        )
        ctr = [str(self.binaries.containerd("ctr")), "--address", str(socket)]

        def serving() -> bool:
            probe = subprocess.run([*ctr, "version"], capture_output=True, timeout=10, check=False)
            return probe.returncode == 0

        _wait("containerd to serve its socket", serving, 60, self.children, containerd.name)
        tags: dict[str, str] = {}
        imported: set[Path] = set()
        for role, archive in image_archives.items():
            tags[role] = _archive_tags(archive)[0]
            if archive in imported:  # two roles, one image
                continue
            imported.add(archive)
            proc = subprocess.run(
                [*ctr, "-n", "k8s.io", "images", "import", str(archive)],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if proc.returncode != 0:
                raise _failure(
                    f"ctr images import {archive}: {proc.stderr.strip()}",
                    self.children,
                    containerd.name,
                )
        return socket, tags

    def _controllers(self, workdir: Path, pki: Path, kubeconfigs: Mapping[str, Path]) -> None:
        kcm, sched = kubeconfigs["controller-manager"], kubeconfigs["scheduler"]
        self.child(
            "kube-controller-manager",
            [
                str(self.binaries.k8s("kube-controller-manager")),
                f"--kubeconfig={kcm}",
                f"--authentication-kubeconfig={kcm}",
                f"--authorization-kubeconfig={kcm}",
                f"--service-account-private-key-file={workdir / 'control-plane/pki/sa.key'}",
                f"--root-ca-file={pki / 'server-ca.crt'}",
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_NETWORK}",
                "--cluster-name=meshctl-test",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--flex-volume-plugin-dir={workdir / 'flex'}",
                # No cloud, no node IPAM (host-local hands out pod addresses).
                "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller",
            ],
        )
        self.child(
            "kube-scheduler",
            [
                str(self.binaries.k8s("kube-scheduler")),
                f"--kubeconfig={sched}",
                f"--authentication-kubeconfig={sched}",
                f"--authorization-kubeconfig={sched}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
            ],
        )

    def stop(self) -> None:
        # Kill node processes outright (grace periods of pod deletion take up to a minute; the
        # pods are throwaway), then the control plane; nodehost.cleanup does the rest.
        for child in reversed(self.children):
            child.stop(grace=2.0)
        self.stack.close()


def _archive_tags(archive: Path) -> list[str]:
    import tarfile

    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        tags: list[str] = json.load(member)[0]["RepoTags"]
        return tags


def _node_ready(core: k8s.CoreV1Api) -> bool:
    node = core.read_node(NODE_NAME)
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def _healthz(port: int) -> bool:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    finally:
        conn.close()


# Node roles -> images of packaging/image/build.py (docs/packaging.md). "busybox" is the test
# workload image: busybox-static's applets (sh, nc, httpd, wget...) and meshtest.
IMAGE_OF_ROLE = {
    "pause": "pause",
    "busybox": "testapp",
    "testapp": "testapp",
    "meshctl": "meshctl",
    "echo-basic": "echo-basic",
    "coredns": "coredns",
}
# Imported when a test first asks for them, not at every start: only the Gateway API conformance
# suite runs them (tests/harness/gateway_conformance.py), and CoreDNS alone is 73 MiB.
ON_DEMAND_ROLES = frozenset({"echo-basic", "coredns"})


def node_images() -> tuple[dict[str, Path], dict[str, str]]:
    """The archives to import (role -> tarball) and, per missing image, why it is missing.

    ``MESHCTL_IMAGE_DIR`` (set by .ci/run after it built them) holds the tarballs and their
    images.json; otherwise packaging/image/build.py writes them into the test cache (each image
    cached by its inputs, so a warm run only copies).
    """
    configured = os.environ.get("MESHCTL_IMAGE_DIR")
    out = Path(configured) if configured else cache_root() / "images"
    reasons: dict[str, str] = {}
    if not configured:
        tree = os.environ.get("MESHCTL_FROZEN_TREE") or str(REPO_ROOT / "dist" / "meshctl-tree")
        for name in sorted(set(IMAGE_OF_ROLE.values())):
            built = subprocess.run(
                [sys.executable, str(REPO_ROOT / "packaging" / "image" / "build.py"),
                 "--out", str(out), "--tree", tree, name],
                capture_output=True, text=True, timeout=900, check=False,
            )  # fmt: skip
            if built.returncode != 0:
                reasons[name] = built.stderr.strip() or f"build.py exited {built.returncode}"
    try:
        index = json.loads((out / "images.json").read_text())
    except (OSError, ValueError):
        index = {}
    archives: dict[str, Path] = {}
    missing: dict[str, str] = {}
    for role, name in IMAGE_OF_ROLE.items():
        if name in reasons:
            missing[role] = reasons[name]
        elif name in index and (out / index[name]["file"]).is_file():
            archives[role] = out / index[name]["file"]
        else:
            missing[role] = f"{name} is not in {out / 'images.json'}: run packaging/image/build.py"
    return archives, missing


class TestNode:
    """The session's node: started on first use, stoppable and restartable (hygiene tests).

    Holds the machine lock from a start to its stop. A start first cleans up what a killed run
    left (its state file), then records the host state, then starts the components.
    """

    __test__ = False  # not a test class, despite the name

    def __init__(self, binaries: NodeBinaries, lock_timeout: float) -> None:
        self.binaries = binaries
        self.lock_timeout = lock_timeout
        self._cluster: NodeCluster | None = None
        self._start: _Start | None = None
        self._lock: contextlib.ExitStack | None = None
        self.missing_images: dict[str, str] = {}
        self.archives: dict[str, Path] = {}
        self._on_demand: dict[str, str] = {}  # role -> tag, imported into the running node
        self.cleaned_dead_run = False
        # Stopped before this node stops (a second node: tests/harness/node2.py).
        self.before_stop: list[Callable[[], None]] = []

    @property
    def started(self) -> _Start:
        """The running start (its CAs and kubeconfigs), starting the node if it is not."""
        self.cluster  # noqa: B018 -- starts it
        assert self._start is not None
        return self._start

    @property
    def cluster(self) -> NodeCluster:
        """The running node (started now if it is not)."""
        if self._cluster is None:
            self.start()
        assert self._cluster is not None
        return self._cluster

    @property
    def running(self) -> bool:
        return self._cluster is not None

    def image(self, role: str) -> str:
        """The tag of a node image; skips (fails under CI) when it could not be built.

        An on-demand image is imported into the running node on its first request.
        """
        if role in self.missing_images:
            pytest.skip(f"node image {role!r} missing: {self.missing_images[role]}")
        cluster = self.cluster
        if role not in ON_DEMAND_ROLES:
            return cluster.images[role]
        if role not in self._on_demand:
            archive = self.archives[role]
            cluster.import_image(archive)
            self._on_demand[role] = _archive_tags(archive)[0]
        return self._on_demand[role]

    def start(self) -> NodeCluster:
        if self._cluster is not None:
            return self._cluster
        self.archives, self.missing_images = node_images()
        for role in ("pause", "busybox"):
            if role in self.missing_images:
                raise NodeStartError(f"test node image {role}: {self.missing_images[role]}")
        lock = contextlib.ExitStack()
        lock.enter_context(nodehost.machine_lock(self.lock_timeout))
        try:
            state = nodehost.read_state()
            self.cleaned_dead_run = state is not None
            if state is not None:
                nodehost.cleanup(state)
            nodehost.write_state(
                {
                    "pid": os.getpid(),
                    "workdir": str(nodehost.WORKDIR),
                    "bridge": nodehost.BRIDGE,
                    "service_cidr": SERVICE_NETWORK,
                    "started": datetime.datetime.now(datetime.UTC).isoformat(),
                    "before": nodehost.HostSnapshot.take().to_json(),
                }
            )
            start = _Start(self.binaries)
            self._on_demand = {}
            at_start = {r: a for r, a in self.archives.items() if r not in ON_DEMAND_ROLES}
            try:
                self._cluster = start.run(at_start)
            except BaseException:
                start.stop()
                self._cleanup()
                raise
            self._start = start
        except BaseException:
            lock.close()
            raise
        self._lock = lock
        return self._cluster

    def _cleanup(self) -> None:
        state = nodehost.read_state()
        if state is not None:
            nodehost.cleanup(state)

    def stop(self) -> None:
        """Stops every component and restores the host (checked: anything left of the run's
        rules, tables, links or files fails the stop); releases the machine lock. Without the
        lock (never started, or stopped already: the session's finalizer after the last node
        test stopped it) it does nothing: the state on the host is then another session's node,
        which cleaning up would tear down under it."""
        if self._lock is None:
            return
        try:
            while self.before_stop:
                self.before_stop.pop()()
            if self._start is not None:
                self._start.stop()
            state = nodehost.read_state()
            self._cleanup()
            if state is not None:
                left = nodehost.leftovers(nodehost.HostSnapshot.from_json(state["before"]))
                if left:
                    raise AssertionError(
                        "the test node left these on the host after its cleanup:\n"
                        + "\n".join(left)
                    )
        finally:
            self._start = None
            self._cluster = None
            if self._lock is not None:
                self._lock.close()
                self._lock = None


# ---------------------------------------------------------------------------------------------
# pytest: fixture, marker gate, failure reports


def node_unavailable_reason() -> str | None:
    reason = host_unfit_reason()
    if reason:
        return reason
    binaries = locate_node_binaries()
    return binaries if isinstance(binaries, str) else None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("node"):
        reason = node_unavailable_reason()
        if reason:
            pytest.skip(reason)


@pytest.fixture(scope="session")
def kube_node(request: pytest.FixtureRequest) -> Iterator[TestNode]:
    """The session's single-node cluster (one per machine); skips with the reason when unfit."""
    reason = host_unfit_reason()
    if reason:
        pytest.skip(reason)
    binaries = locate_node_binaries()
    if isinstance(binaries, str):
        pytest.skip(binaries)
    node = TestNode(binaries, float(os.environ.get(LOCK_TIMEOUT_ENV, "1200")))
    request.config.stash[_SESSION_NODE] = node
    try:
        yield node
    finally:
        node.stop()


_SESSION_NODE = pytest.StashKey[TestNode]()
_LAST_NODE_TEST = pytest.StashKey[str]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    users = [i for i in items if "kube_node" in getattr(i, "fixturenames", ())]
    if users:
        config.stash[_LAST_NODE_TEST] = users[-1].nodeid


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # After the last test that uses it, the node goes: the rest of the session (unit tests, say)
    # runs on an untouched host, without the node's memory and CPU.
    if item.nodeid == item.config.stash.get(_LAST_NODE_TEST, None):
        node = item.config.stash.get(_SESSION_NODE, None)
        if node is not None:
            node.stop()


@pytest.fixture
def node_namespace(kube_node: TestNode, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace on the node (its default ServiceAccount awaited), deleted afterwards.

    On failure the pytest report gets its pods' container logs and its events.
    """
    from tests.harness.kube import _dns_label

    name = f"n-{_dns_label(request.node.name, 40)}-{os.urandom(3).hex()}"
    with kube_node.cluster.api_client() as api:
        k8s.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
        request.node.stash.setdefault(_REPORT_NAMESPACES, []).append(name)
        try:
            wl.wait_service_account(api, name)
            yield name
        finally:
            # Not awaited: its pods are gone in seconds, and the namespace name is never reused.
            wl.delete_namespace_now(api, name, wait=False)


_REPORT_NAMESPACES = pytest.StashKey[list[str]]()


def report_namespace(item: pytest.Item, namespace: str) -> None:
    """Adds ``namespace`` to what a failure of ``item`` reports (logs, events)."""
    item.stash.setdefault(_REPORT_NAMESPACES, []).append(namespace)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    namespaces = item.stash.get(_REPORT_NAMESPACES, [])
    node = item.funcargs.get("kube_node") if hasattr(item, "funcargs") else None
    if not namespaces or not isinstance(node, TestNode) or not node.running:
        return
    try:
        with node.cluster.api_client() as api:
            for ns in namespaces:
                report.sections.append((f"node: namespace {ns}", wl.describe_namespace(api, ns)))
    except Exception as exc:  # noqa: BLE001 -- a report must never hide the test's own failure
        report.sections.append(("node: diagnostics", f"could not collect: {exc!r}"))


# ---------------------------------------------------------------------------------------------
# `python -m tests.harness.node --start-then-wait`: a node run for the killed-run test


def _main(argv: list[str]) -> int:
    return start_then_wait(argv, "tests.harness.node", lock_timeout=60)


def start_then_wait(
    argv: list[str],
    module: str,
    *,
    lock_timeout: float,
    more: Callable[[TestNode], object] | None = None,
    pod_spec: Mapping[str, Any] | None = None,
) -> int:
    """``python -m MODULE --start-then-wait``: start the node (and ``more`` of it), run a pod
    (with ``pod_spec``'s fields), say ``ready`` and wait for SIGKILL (the killed-run tests)."""
    if argv != ["--start-then-wait"]:
        print(f"usage: python -m {module} --start-then-wait", file=sys.stderr)
        return 2
    binaries = locate_node_binaries()
    if isinstance(binaries, str):
        print(binaries, file=sys.stderr)
        return 1
    node = TestNode(binaries, lock_timeout=lock_timeout)
    cluster = node.start()
    if more is not None:
        more(node)
    with cluster.api_client() as api:
        pod = wl.busybox_pod(
            "leftover", cluster.images["busybox"], ["sleep", "3600"], **(pod_spec or {})
        )
        k8s.CoreV1Api(api).create_namespaced_pod("default", pod)
        wl.wait_pod_ready(api, "default", "leftover", timeout=120)
    print("ready", flush=True)
    # Nothing stops this run but SIGKILL: what it leaves is the next start's to clean up.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
