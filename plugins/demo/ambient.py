"""The demo's ambient node: the node agent, the node proxy and the inventory they enroll from.

Owns starting, in the node namespace, what a node runs in ambient mode: ``meshctl cni install
--ambient`` (the node agent, which merges meshctl's CNI plugin into the node's network config
list and enrolls pods), reading the Pods and Namespaces of this laptop "cluster" from a local
inventory the demo writes (there is no API server), and ONE ``meshctl ztunnel run --mode node``
(the node proxy), which takes the pods over ZDS and gets each one's certificate from the CA by
impersonation with its own token. Invariants: only product commands with the options users
give them; every path under the state directory; the agent's readiness and status answer on
the node namespace's loopback only; the inventory is replaced atomically (the agent and the
plugin re-read it).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from meshctl.core.k8s.cni.spec import PLUGIN_EVENT_SOCKET_NAME
from meshctl.core.k8s.layout import MESH_NAMESPACE
from meshctl.errors import UserError
from meshctl.net import netns
from meshctl.process import self_command

from .mesh import http, proxy_command, start_in, wait_ok

if TYPE_CHECKING:
    from meshctl.core.k8s.cni.netconf import NetworkConfig
    from meshctl.core.k8s.schema import Namespace, Pod

NODE_NAME = "demo-node"
# The node proxy's service account: the one 'meshctl install' gives the ztunnel DaemonSet.
NODE_ACCOUNT = (MESH_NAMESPACE, "meshctl-ztunnel")
AGENT_ADDRESS = ("127.0.0.1", 8000)  # istio-cni's readiness port, on the node's loopback
CONFLIST = "10-meshctl-demo.conflist"
AMBIENT_LABEL = {"istio.io/dataplane-mode": "ambient"}


def inventory_doc(
    pods: Sequence[tuple[str, str, bool]], uids: Mapping[str, str]
) -> dict[str, object]:
    """A ``v1 List`` of the demo's namespaces (labelled for ambient where a meshed pod lives)
    and pods ``(name, namespace, meshed)`` on this node (``uids``: name -> uid), each running
    as its own account."""
    meshed_ns = {ns for _, ns, meshed in pods if meshed}
    names = list(dict.fromkeys(ns for _, ns, _ in pods))
    namespaces: list[Namespace] = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": AMBIENT_LABEL} if ns in meshed_ns else {"name": ns},
        }
        for ns in names
    ]
    objects: list[Pod] = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": uids[name], "labels": {"app": name}},
            "spec": {
                "nodeName": NODE_NAME,
                "serviceAccountName": name,
                "containers": [{"name": name, "image": "meshctl demo-app"}],
            },
        }
        for name, ns, _ in pods
    ]
    return {"apiVersion": "v1", "kind": "List", "items": [*namespaces, *objects]}


def write_inventory(path: Path, doc: Mapping[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.replace(path)


def write_node_conflist(conf_dir: Path, network: NetworkConfig) -> None:
    """The node's network as its runtime finds it before the agent merges into it."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / CONFLIST).write_text(json.dumps(network, indent=2) + "\n")


def read_node_conflist(conf_dir: Path) -> NetworkConfig:
    """What the runtime reads now (the agent's entry merged in)."""
    data: NetworkConfig = json.loads((conf_dir / CONFLIST).read_text())
    return data


# sun_path holds 108 bytes with its terminating NUL (unix(7)).
_SOCKET_PATH_MAX = 107


def check_socket_paths(folder: Path, socket: Path) -> None:
    """The agent's sockets fit in a unix socket address, or a one-line error saying why."""
    longest = max((socket, folder / "run" / PLUGIN_EVENT_SOCKET_NAME), key=lambda p: len(str(p)))
    if len(str(longest).encode()) > _SOCKET_PATH_MAX:
        raise UserError(
            f"the state directory's path is too long for the node agent's unix sockets "
            f"({longest}: {len(str(longest).encode())} bytes, at most {_SOCKET_PATH_MAX})",
            hint="set MESHCTL_DEMO_STATE_DIR (or --state-dir) to a shorter path",
        )


def start_agent(
    node: netns.NetnsRef, folder: Path, inventory: Path, socket: Path, log: Path
) -> subprocess.Popen[bytes]:
    """``meshctl cni install --ambient`` for this node: plugin into ``folder``/bin, its entry
    into ``folder``/net.d, its run dir ``folder``/run, ZDS on ``socket``."""
    check_socket_paths(folder, socket)
    argv = self_command(
        "--log-level",
        "info",
        "cni",
        "install",
        "--ambient",
        "--local-inventory",
        str(inventory),
        "--node-name",
        NODE_NAME,
        "--cni-bin-dir",
        str(folder / "bin"),
        "--cni-conf-dir",
        str(folder / "net.d"),
        "--run-dir",
        str(folder / "run"),
        "--ztunnel-socket",
        str(socket),
        "--readiness-address",
        ":".join(map(str, AGENT_ADDRESS)),
        "--poll-interval",
        "0.2",
    )
    (folder / "bin").mkdir(parents=True, exist_ok=True)
    return start_in(node, argv, log)


def wait_agent(node: netns.NetnsRef, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until the agent's ``/readyz`` answers 200 (its plugin chained, the inventory read)."""
    wait_ok(node, AGENT_ADDRESS, "/readyz", proc, log, what="the node agent")


def enrollment(node: netns.NetnsRef) -> dict[tuple[str, str], dict[str, object]]:
    """The agent's view of each pod, by (namespace, name); empty when it does not answer."""
    status, body = http(node, *AGENT_ADDRESS, "/status", timeout=2)
    if status != 200:
        return {}
    try:
        pods = json.loads(body).get("pods") or []
    except (ValueError, AttributeError):
        return {}
    return {(str(p.get("namespace")), str(p.get("name"))): p for p in pods if isinstance(p, dict)}


def start_node_proxy(
    node: netns.NetnsRef,
    ca: tuple[str, Path, Path],
    socket: Path,
    cert_dir: Path,
    workloads: Path,
    log: Path,
) -> subprocess.Popen[bytes]:
    """``meshctl ztunnel run --mode node`` in the node namespace; ``ca``: the CA's address, its
    root and the node proxy's own token (pods' certificates by impersonation)."""
    mode = ("--mode", "node", "--inpod-uds", str(socket))
    argv = proxy_command(mode, ca, cert_dir, workloads)
    return start_in(node, argv, log, env={"MESHCTL_RELOAD_INTERVAL": "200ms"})
