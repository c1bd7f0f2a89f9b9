"""The demo's node: a network namespace with a bridge, and pods attached to it by a CNI chain.

Owns playing the container runtime for the demo: one netns per pod, then the network config list
run as libcni runs it (the CNI spec 1.0 "Chained plugins": each plugin exec'd with ``CNI_*`` and
the config on stdin, the list's name and version injected, the previous result as
``prevResult``; DEL in reverse order with the cached result, each plugin found on ``CNI_PATH``).
The reference plugins (``bridge`` with ``host-local`` IPAM, ``loopback``) come from the system
(Debian's containernetworking-plugins in /usr/lib/cni); in ambient mode the list is the one
``meshctl cni install`` merged its own plugin into, read from the node's conf dir as a runtime
reads it. Invariants: the plugins run inside the node namespace (their "host"), so the
bridge and every veth end live there and nothing touches the real host; host-local keeps its
leases under the state directory; DEL runs for whatever ADD started, even after a failure.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from meshctl.core.k8s import layout
from meshctl.errors import MeshctlError, NetError
from meshctl.net import netns

if TYPE_CHECKING:
    from meshctl.core.k8s.cni.messages import Result
    from meshctl.core.k8s.cni.netconf import NetworkConfig

CNI_VERSION = "1.0.0"
NETWORK = "meshctl-demo"
BRIDGE = "mdbr0"
CNI_DIRS = ("/usr/lib/cni", layout.HOST_CNI_BIN_DIR)


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod sandbox: its namespace, the address IPAM gave it, and the node-side veth."""

    name: str  # the demo's short name: client, server, legacy
    namespace: str  # the Kubernetes-style namespace its identity lives in
    sandbox: str  # its /run/netns name
    ip: str
    host_veth: str
    result: Result

    @property
    def ref(self) -> netns.NetnsRef:
        return netns.NetnsRef(self.sandbox, f"{netns.RUN_DIR}/{self.sandbox}")


def cni_dir() -> Path:
    """Where the reference plugins live, or a one-line error naming the package."""
    chosen = os.environ.get("MESHCTL_DEMO_CNI_PATH")
    for folder in (chosen,) if chosen else CNI_DIRS:
        if (Path(folder) / "bridge").is_file():
            return Path(folder)
    raise MeshctlError(
        "the CNI reference plugins (bridge, host-local, loopback) are not installed",
        hint="apt-get install containernetworking-plugins (or set MESHCTL_DEMO_CNI_PATH)",
    )


def conflist(subnet: ipaddress.IPv4Network, ipam_dir: Path) -> NetworkConfig:
    """The node's network: a bridge with host-local addresses from ``subnet``."""
    return {
        "cniVersion": CNI_VERSION,
        "name": NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,  # nothing leaves the node namespace: no NAT to the host
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": str(subnet)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            }
        ],
    }


_LOOPBACK = {"cniVersion": CNI_VERSION, "name": "cni-loopback", "type": "loopback"}


class Runtime:
    """Runs a network config list for pods of one node, the way a container runtime does."""

    def __init__(self, node_netns: str, network: NetworkConfig, cni_path: str) -> None:
        """``cni_path``: the plugin directories, ``:``-separated (``CNI_PATH``), first wins."""
        self.node = netns.NetnsRef(node_netns, f"{netns.RUN_DIR}/{node_netns}")
        self.network = network
        self.cni_path = cni_path

    def _binary(self, plugin: str) -> Path:
        folders = [Path(f) for f in self.cni_path.split(":") if f]
        found = next((f / plugin for f in folders if (f / plugin).is_file()), None)
        if found is None:
            raise NetError(
                f"CNI plugin {plugin!r} not found in {self.cni_path}",
                hint="run 'meshctl demo down' and try again",
            )
        return found

    def _exec(
        self,
        command: str,
        conf: Mapping[str, object],
        sandbox: str,
        ifname: str,
        pod: Mapping[str, str] | None = None,
    ) -> Result:
        """One plugin run; ``pod``: its ``K8S_POD_*`` CNI_ARGS (name, namespace, uid), as
        containerd passes them."""
        binary = self._binary(str(conf["type"]))
        args = "IgnoreUnknown=1"
        if pod:
            args += f";K8S_POD_NAMESPACE={pod['namespace']};K8S_POD_NAME={pod['name']}"
            args += f";K8S_POD_INFRA_CONTAINER_ID={sandbox};K8S_POD_UID={pod['uid']}"
        env = {
            "CNI_ARGS": args,
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": sandbox,
            "CNI_NETNS": f"{netns.RUN_DIR}/{sandbox}",
            "CNI_IFNAME": ifname,
            "CNI_PATH": self.cni_path,
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        }
        with netns.entered(self.node):  # the child is forked from this thread: node netns
            done = subprocess.run(
                [str(binary)],
                input=json.dumps(conf),
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        if done.returncode != 0:
            try:
                msg = json.loads(done.stdout).get("msg", done.stdout)
            except ValueError:
                msg = done.stdout or done.stderr
            raise NetError(
                f"CNI {command} of plugin {conf['type']} failed: {str(msg)[:300]}",
                hint="run 'meshctl demo down' and try again",
            )
        out = done.stdout.strip()
        return cast("Result", dict(json.loads(out))) if out else {}

    def add(self, name: str, namespace: str, sandbox: str, uid: str) -> Pod:
        """Create the pod's netns and run ADD through the chain; its address comes back."""
        netns.add(sandbox)
        self._exec("ADD", _LOOPBACK, sandbox, "lo")
        pod = {"name": name, "namespace": namespace, "uid": uid}
        result: Result | None = None
        for plugin in self.network["plugins"]:
            conf: dict[str, object] = {
                **plugin,
                "name": self.network["name"],
                "cniVersion": CNI_VERSION,
            }
            if result is not None:
                conf["prevResult"] = result
            result = self._exec("ADD", conf, sandbox, "eth0", pod)
        if not result or not result.get("ips"):
            raise NetError(f"the CNI chain gave pod {name} no address", hint=str(result)[:200])
        ip = str(ipaddress.ip_interface(result["ips"][0]["address"]).ip)
        return Pod(name, namespace, sandbox, ip, _host_veth(result), result)

    def delete(
        self, sandbox: str, result: Result | None, pod: Mapping[str, str] | None = None
    ) -> list[str]:
        """DEL through the chain in reverse (with the ADD's result), then remove the netns."""
        errors = []
        for plugin in reversed(self.network["plugins"]):
            conf: dict[str, object] = {
                **plugin,
                "name": self.network["name"],
                "cniVersion": CNI_VERSION,
            }
            if result:
                conf["prevResult"] = dict(result)
            try:
                self._exec("DEL", conf, sandbox, "eth0", pod)
            except (NetError, subprocess.TimeoutExpired) as exc:
                errors.append(str(exc))  # keep going: the rest must still be released
        try:
            netns.delete(sandbox)
        except NetError as exc:
            errors.append(exc.message)
        return errors


def _host_veth(result: Result) -> str:
    """The node-side veth in a bridge result: the interface that is neither bridge nor pod's."""
    for iface in result.get("interfaces", []):
        if iface.get("name") != BRIDGE and "sandbox" not in iface:
            return str(iface["name"])
    return ""
