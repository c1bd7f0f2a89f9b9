"""The demo's scenario: build the mesh, then show (and with ``--check`` assert) what it does.

Owns the order of the steps and what each proves, from outside the proxies (requests made inside
the pods, a raw capture on the node's link, the proxies' own metrics):
1. pods up through the CNI chain, each with its address (ambient, the default: the chain the node
   agent merged meshctl's plugin into, which hands each enrolled pod to the node agent);
2. identities issued and the proxies ready with them: ambient, ONE node proxy holding each
   enrolled pod's certificate (from the CA by impersonation) and the agent's enrollment of each
   pod; sidecar, one proxy per meshed pod with its own certificate;
3. client -> server through the proxies (HBONE on 15008), the answer byte for byte;
4. mTLS on the wire: a capture on the server's node-side veth holds no plaintext of a request
   carrying a fresh marker, only TLS records to 15008 (counted);
5. an L4 DENY policy applied mid-run refuses client -> server (HTTP 401 on the HBONE CONNECT,
   the proxies' DENY metric), then removed and traffic flows again;
6. the server's proxy (ambient: the node proxy) killed (SIGKILL) and restarted: requests fail,
   then recover;
7. the unmeshed "legacy" pod reaches the meshed server in plaintext through its inbound 15006.
Invariants: every step records a ``Step`` (name, ok, detail) whatever happens; a failed step does
not stop later ones that can still run; everything started is in the state record first.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from meshctl.core.pki import certs
from meshctl.core.wire import pcap, ztunnel_dump
from meshctl.errors import MeshctlError
from meshctl.net import netns, packets
from meshctl.process import self_command

from . import ambient, mesh
from .node import Pod, Runtime, cni_dir, conflist
from .state import LOGS, Record, Sandbox

if TYPE_CHECKING:
    from meshctl.core.wire.dump import CertificateSummary

PODS = (("client", "default", True), ("server", "prod", True), ("legacy", "legacy", False))


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    ok: bool
    detail: str
    elapsed: float  # seconds since the run started


@dataclass(slots=True)
class Demo:
    """One run: the record, the pods, the processes it started."""

    record: Record
    say: Callable[[str], None]
    mode: str = "ambient"
    pods: dict[str, Pod] = field(default_factory=dict)
    sidecars: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    node_proxy: subprocess.Popen[bytes] | None = None  # ambient
    agent: subprocess.Popen[bytes] | None = None  # ambient: the node agent (meshctl cni install)
    enrollment: dict[str, str] = field(default_factory=dict)  # pod -> what the agent says
    # Each pod's uid, as the API server would have given it (the inventory and CNI_ARGS).
    uids: dict[str, str] = field(
        default_factory=lambda: {name: str(uuid.uuid4()) for name, _, _ in PODS}
    )
    apps: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    first_encrypted: float | None = None
    last_traffic: tuple[float, float, float] = (0.0, 0.0, 0.0)  # time, bytes, connections
    marker: str = ""  # the path of the latest captured request
    subnet: str = ""
    tokens: dict[str, Path] = field(default_factory=dict)
    ca: subprocess.Popen[bytes] | None = None

    @property
    def folder(self) -> Path:
        return self.record.folder

    @property
    def node_ref(self) -> netns.NetnsRef:
        return netns.NetnsRef(self.record.node, f"{netns.RUN_DIR}/{self.record.node}")

    @property
    def workloads_file(self) -> Path:
        return self.folder / "workloads.yaml"

    def log(self, name: str) -> Path:
        (self.folder / LOGS).mkdir(parents=True, exist_ok=True)
        return self.folder / LOGS / f"{name}.log"

    def meshed(self) -> list[Pod]:
        return [self.pods[n] for n, _, m in PODS if m and n in self.pods]

    def unmeshed(self) -> list[Pod]:
        return [self.pods[n] for n, _, m in PODS if not m and n in self.pods]

    def record_step(self, name: str, ok: bool, detail: str) -> bool:
        elapsed = time.monotonic() - self.started
        self.steps.append(Step(name, ok, detail, elapsed))
        self.say(f"{'PASS' if ok else 'FAIL'}  {name}: {detail} [+{elapsed:.1f}s]")
        return ok

    # -- building the mesh ---------------------------------------------------------------------

    @property
    def ambient(self) -> bool:
        return self.mode == "ambient"

    def proxy_of(self, pod: Pod) -> mesh.Where:
        """Where the proxy serving ``pod`` answers (admin, metrics): the node's namespace in
        ambient mode, the pod's own with a sidecar."""
        return self.node_ref if self.ambient else pod

    def proxies(self) -> list[mesh.Where]:
        return [self.node_ref] if self.ambient else list(self.meshed())

    def build(self) -> None:
        plugins = cni_dir()
        if self.ambient:
            ambient.check_socket_paths(self.cni_folder, self.zds_socket)  # before anything
        subnet = ipaddress.IPv4Network(f"10.248.{secrets.randbelow(256)}.0/24")
        self.subnet = str(subnet)
        rec = self.record
        rec.node = rec.netns_name("node")
        rec.network = conflist(subnet, self.folder / "ipam")
        rec.cni_dir = str(plugins)
        rec.save()
        netns.add(rec.node)
        if self.ambient:
            self.start_node(plugins)
        runtime = Runtime(rec.node, rec.network, rec.cni_dir)
        for name, namespace, _ in PODS:
            sandbox = rec.netns_name(name)
            ids: Sandbox = {"name": name, "namespace": namespace, "uid": self.uids[name]}
            rec.pods[sandbox] = ids
            rec.save()
            pod = runtime.add(name, namespace, sandbox, self.uids[name])
            rec.pods[sandbox] = {**ids, "result": pod.result.copy()}
            rec.save()
            self.pods[name] = pod
        chain = " + ".join(str(p["type"]) for p in rec.network["plugins"])
        self.record_step(
            "pods",
            True,
            ", ".join(f"{p.name} {p.ip} ({p.namespace})" for p in self.pods.values())
            + f" on bridge {subnet} via the CNI chain {chain} ({plugins})",
        )
        if self.ambient:
            self.serve_ambient()
        else:
            self.start_sidecars()
        server = self.pods["server"]
        self.apps["server"] = mesh.start_in(
            server,
            self_command("demo-app", "server", "--port", str(mesh.APP_PORT), "--name", "server"),
            self.log("server-app"),
        )
        for pod in [] if self.ambient else self.meshed():
            mesh.wait_ready(pod, self.sidecars[pod.name], self.log(f"{pod.name}-proxy"))
        mesh.wait_app(server, mesh.APP_PORT)
        if self.ambient:
            self.step_enrolled()
            return
        issued = [self.issued_by_ca(p) for p in self.meshed()]
        self.record_step(
            "identities",
            all(issued),
            ", ".join(f"{p.name}={mesh.identity(p)}" for p in self.meshed())
            + f" issued by the control plane's CA at {self.ca_address} "
            "(meshctl controlplane ca); proxies ready (sidecar mode, capture rules from "
            "meshctl iptables)",
        )

    # -- sidecar mode --------------------------------------------------------------------------

    def start_sidecars(self) -> None:
        accounts = [(p.name, p.namespace, p.name) for p in self.meshed()]
        table, self.tokens = mesh.write_tokens(self.folder / "tokens", accounts)
        self.ca = mesh.start_ca(self.node_ref, self.gateway, self.ca_dir, table, self.log("ca"))
        mesh.write_workloads(
            self.workloads_file, mesh.workloads_doc(self.meshed(), self.unmeshed())
        )
        for pod in self.meshed():
            mesh.apply_capture(pod, self.log(f"{pod.name}-iptables"))
        mesh.wait_ca(self.node_ref, self.ca_host, self.ca, self.log("ca"))
        for pod in self.meshed():
            self.start_sidecar(pod)

    # -- ambient mode --------------------------------------------------------------------------

    @property
    def cni_folder(self) -> Path:
        return self.folder / "cni"

    @property
    def zds_socket(self) -> Path:
        # Short: a unix socket path has room for 107 bytes.
        return self.cni_folder / "zds.sock"

    @property
    def inventory_file(self) -> Path:
        return self.folder / "inventory.yaml"

    def start_node(self, plugins: Path) -> None:
        """Before any pod: the CA (the node proxy's account trusted to impersonate), the node
        agent with this node's inventory (its plugin merged into the node's network list, which
        the runtime then reads), the node proxy connected to the agent over ZDS."""
        rec = self.record
        account = "/".join(ambient.NODE_ACCOUNT)
        table, self.tokens = mesh.write_tokens(
            self.folder / "tokens", [("node-proxy", *ambient.NODE_ACCOUNT)]
        )
        self.ca = mesh.start_ca(
            self.node_ref,
            self.ca_host,
            self.ca_dir,
            table,
            self.log("ca"),
            node_accounts=[account],
        )
        ambient.write_inventory(self.inventory_file, ambient.inventory_doc(PODS, self.uids))
        ambient.write_node_conflist(self.cni_folder / "net.d", rec.network)
        mesh.write_workloads(self.workloads_file, mesh.workloads_doc([], []))
        self.agent = ambient.start_agent(
            self.node_ref, self.cni_folder, self.inventory_file, self.zds_socket, self.log("agent")
        )
        ambient.wait_agent(self.node_ref, self.agent, self.log("agent"))
        rec.network = ambient.read_node_conflist(self.cni_folder / "net.d")
        rec.cni_dir = f"{self.cni_folder / 'bin'}:{plugins}"
        rec.save()
        mesh.wait_ca(self.node_ref, self.ca_host, self.ca, self.log("ca"))
        proxy = self.start_node_proxy()
        mesh.wait_ready(self.node_ref, proxy, self.log("node-proxy"), what="the node proxy")

    def start_node_proxy(self) -> subprocess.Popen[bytes]:
        ca = (self.ca_address, self.ca_dir / "ca-cert.pem", self.tokens["node-proxy"])
        self.node_proxy = proxy = ambient.start_node_proxy(
            self.node_ref,
            ca,
            self.zds_socket,
            self.folder / "certs" / "node-proxy",
            self.workloads_file,
            self.log("node-proxy"),
        )
        return proxy

    def serve_ambient(self) -> None:
        """The pods' addresses into the node proxy's workloads (known once IPAM gave them)."""
        mesh.write_workloads(
            self.workloads_file, mesh.workloads_doc(self.meshed(), self.unmeshed())
        )
        want = len(self.pods)
        end = time.monotonic() + 10
        while len(mesh.config_dump(self.node_ref).get("workloads", [])) != want:
            if time.monotonic() > end:
                raise MeshctlError("the node proxy did not take up the workloads within 10s")
            time.sleep(0.05)

    def refresh_enrollment(self) -> None:
        """Each pod's enrollment as the node agent reports it (``/status``)."""
        if not self.ambient:
            return
        view = ambient.enrollment(self.node_ref)
        for pod in self.pods.values():
            entry = view.get((pod.namespace, pod.name))
            if entry is None:
                self.enrollment[pod.name] = "unknown to the agent" if view else "agent down"
            elif entry.get("captured") and entry.get("served"):
                redirection = entry.get("redirection") or "-"
                self.enrollment[pod.name] = f"ambient ({redirection}, ZDS acked)"
            elif entry.get("captured"):
                self.enrollment[pod.name] = "captured, waiting for the node proxy"
            else:
                self.enrollment[pod.name] = "not enrolled"

    def pod_certificates(self) -> dict[str, CertificateSummary]:
        """The node proxy's certificate per enrolled pod's identity (its ``workloadState``)."""
        state = mesh.config_dump(self.node_ref).get("workloadState") or {}
        out: dict[str, CertificateSummary] = {}
        for entry in state.values() if isinstance(state, dict) else ():
            if isinstance(entry, dict) and isinstance(entry.get("certificate"), dict):
                out[str(entry.get("identity"))] = entry["certificate"]
        return out

    def step_enrolled(self) -> bool:
        """Ambient's identities step: the agent enrolled exactly the meshed pods, and the one
        node proxy holds a certificate for each pod's identity, chained to the CA's root."""
        root = certs.describe((self.ca_dir / "ca-cert.pem").read_bytes())[0].serial
        root = ztunnel_dump.decimal_serial(root)  # the dump's (ztunnel's) decimal form
        want = {str(mesh.identity(p)) for p in self.meshed()}
        ok_certs: set[str] = set()
        end = time.monotonic() + 15
        while time.monotonic() < end:
            for name, cert in self.pod_certificates().items():
                roots = cert.get("rootCerts") or []
                chain = cert.get("certChain") or []
                if (
                    cert.get("state") == "Available"
                    and isinstance(roots, list)
                    and isinstance(chain, list)
                    and any(isinstance(r, dict) and r.get("serialNumber") == root for r in roots)
                    and chain
                    and isinstance(chain[0], dict)
                    and chain[0].get("uriSans") == [name]
                ):
                    ok_certs.add(name)
            if want <= ok_certs:
                break
            time.sleep(0.1)
        self.refresh_enrollment()
        enrolled = {n for n, e in self.enrollment.items() if e.startswith("ambient")}
        meshed = {p.name for p in self.meshed()}
        ok = want <= ok_certs and enrolled == meshed
        legacy = ", ".join(f"{p.name}: {self.enrollment.get(p.name)}" for p in self.unmeshed())
        return self.record_step(
            "identities",
            ok,
            ", ".join(f"{p.name}={mesh.identity(p)}" for p in self.meshed())
            + f": {len(want & ok_certs)}/{len(want)} held by the one node proxy, issued by the "
            f"control plane's CA at {self.ca_address} to its account "
            f"{'/'.join(ambient.NODE_ACCOUNT)} by impersonation; the node agent enrolled "
            f"{', '.join(sorted(enrolled)) or 'nothing'} (namespaces labelled "
            f"istio.io/dataplane-mode=ambient; {legacy})",
        )

    def issued_by_ca(self, pod: Pod) -> bool:
        """Whether the proxy's certificate for the pod's identity came from the CA."""
        for cert in mesh.config_dump(pod).get("certificates", []):
            if isinstance(cert, dict) and cert.get("identity") == str(mesh.identity(pod)):
                return bool(cert.get("source", {}).get("kind") == "ca")
        return False

    @property
    def ca_dir(self) -> Path:
        return self.folder / "ca"

    @property
    def gateway(self) -> str:
        """The bridge's address in the node namespace (the CNI bridge plugin's gateway)."""
        return str(ipaddress.IPv4Network(self.subnet).network_address + 1)

    @property
    def ca_host(self) -> str:
        """Where the CA listens: the bridge's address, for sidecars in the pods; the node's
        loopback in ambient mode (only the node proxy, in the node namespace, calls it, and
        it starts before the first pod brings the bridge up)."""
        return "127.0.0.1" if self.ambient else self.gateway

    @property
    def ca_address(self) -> str:
        return f"{self.ca_host}:{mesh.CA_PORT}"

    def start_sidecar(self, pod: Pod) -> None:
        ca = (self.ca_address, self.ca_dir / "ca-cert.pem", self.tokens[pod.name])
        self.sidecars[pod.name] = mesh.start_sidecar(
            pod,
            ca,
            self.folder / "certs" / pod.name,
            self.workloads_file,
            self.log(f"{pod.name}-proxy"),
        )

    def start_client(self) -> None:
        url = f"http://{self.pods['server'].ip}:{mesh.APP_PORT}/load"
        self.apps["client"] = mesh.start_in(
            self.pods["client"],
            self_command("demo-app", "client", "--url", url, "--stats", str(self.stats_file)),
            self.log("client-app"),
        )

    @property
    def stats_file(self) -> Path:
        return self.folder / "client-stats.json"

    # -- the steps -----------------------------------------------------------------------------

    def request(self, src: str, path: str) -> tuple[int | None, str]:
        return mesh.http(self.pods[src], self.pods["server"].ip, mesh.APP_PORT, path)

    def step_traffic(self) -> bool:
        status, body = self.request("client", "/hello")
        if status == 200 and self.first_encrypted is None:
            # Its bytes crossed the node over the proxies' mTLS (the next step proves it).
            self.first_encrypted = time.monotonic() - self.started
        want = "hello from server: you asked /hello\n"
        opened = 0.0
        end = time.monotonic() + 3  # the proxy counts a connection as its stream completes
        while time.monotonic() < end and opened < 1:
            counts = mesh.metrics(self.proxy_of(self.pods["server"]))
            opened = counts.get("istio_tcp_connections_opened_total[mutual_tls]", 0)
            time.sleep(0.05)
        ok = status == 200 and body == want and opened >= 1
        proxies = "the node proxy" if self.ambient else "both proxies"
        return self.record_step(
            "client -> server",
            ok,
            f"HTTP {status} {body.strip()!r} through {proxies}; the server's proxy counts "
            f"{opened:.0f} connection(s) as mutual_tls",
        )

    def captured_request(self, src: str, link: Pod) -> tuple[int | None, str, list[pcap.Segment]]:
        """A request from ``src`` whose path is a fresh marker, with a raw capture on ``link``'s
        node-side veth around it: status, body and the TCP segments (the marker: ``marker``)."""
        marker = f"meshctl-demo-marker-{secrets.token_hex(8)}"
        capture = packets.Capture(self.node_ref, link.host_veth)
        try:
            status, body = self.request(src, f"/{marker}")
        finally:
            frames = capture.stop()
        segs = pcap.segments(frames)
        self.marker = marker
        return status, body, segs

    def step_mtls(self) -> bool:
        server = self.pods["server"]
        status, _, segs = self.captured_request("client", server)
        leaked = any(self.marker.encode() in s.payload for s in segs)
        flows = pcap.streams(segs)
        client_ip = self.pods["client"].ip
        to_hbone = {f: d for f, d in flows.items() if 15008 in (f[0][1], f[1][1])}
        plain = [
            f for f in flows if client_ip in (f[0][0], f[1][0]) and 15008 not in (f[0][1], f[1][1])
        ]
        records = [pcap.tls_records(d) for d in to_hbone.values()]
        total = sum(r.total for r in records)
        app_data = sum(r.counts.get("application_data", 0) for r in records)
        ok = (
            status == 200
            and not leaked
            and not plain
            and total > 0
            and all(r.whole for r in records)
        )
        return self.record_step(
            "mTLS on the wire",
            ok,
            f"{len(segs)} TCP segments on {server.host_veth}: request marker "
            f"{'FOUND in plaintext' if leaked else 'absent'}, {total} TLS records "
            f"({app_data} application data) on {len(to_hbone)} flow(s) to :15008, "
            f"{len(plain)} non-15008 flow(s) from the client",
        )

    def set_policies(self, policies: list[dict[str, object]]) -> None:
        doc = mesh.workloads_doc(self.meshed(), self.unmeshed(), policies)
        mesh.write_workloads(self.workloads_file, doc)
        want = len(policies)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            dumps = [mesh.config_dump(p) for p in self.proxies()]
            if all(len(d.get("policies", [])) == want for d in dumps if d):
                return
            time.sleep(0.1)
        raise MeshctlError("the proxies did not take up the policy change within 10s")

    def step_policy(self) -> bool:
        client, server = self.pods["client"], self.pods["server"]
        # One node proxy reports both ends in ambient mode: told apart by ``reporter``.
        inbound = "istio_tcp_connections_failed_total{DENY}/destination"
        outbound = "istio_tcp_connections_failed_total{DENY}/source"
        deny_before = mesh.metrics(self.proxy_of(server)).get(inbound, 0)
        client_before = mesh.metrics(self.proxy_of(client)).get(outbound, 0)
        self.set_policies([mesh.deny_policy(client, server)])
        status, why = self.request("client", "/denied")
        deny = mesh.metrics(self.proxy_of(server)).get(inbound, 0) - deny_before
        seen = mesh.metrics(self.proxy_of(client)).get(outbound, 0) - client_before
        self.set_policies([])
        after, _ = self.request("client", "/allowed-again")
        ok = status is None and deny >= 1 and seen >= 1 and after == 200
        return self.record_step(
            "L4 policy",
            ok,
            f"DENY {mesh.identity(client)} -> {server.name}:{mesh.APP_PORT} applied: request "
            f"{'refused (' + why + ')' if status is None else f'answered {status}'}; the server's "
            f"proxy answered the CONNECT with HTTP 401 (DENY +{deny:.0f} as destination, "
            f"{'the node' if self.ambient else 'client'} proxy DENY +{seen:.0f} as source); "
            f"policy removed: HTTP {after}",
        )

    def step_restart(self) -> bool:
        server = self.pods["server"]
        if self.ambient:
            assert self.node_proxy is not None  # noqa: S101 -- build() started it
            mesh.kill_tree(self.node_proxy)
            down, _ = self.request("client", "/while-down")
            proxy = self.start_node_proxy()
            t0 = time.monotonic()
            mesh.wait_ready(self.node_ref, proxy, self.log("node-proxy"), what="the node proxy")
        else:
            mesh.kill_tree(self.sidecars["server"])
            down, _ = self.request("client", "/while-down")
            self.start_sidecar(server)
            t0 = time.monotonic()
            mesh.wait_ready(server, self.sidecars["server"], self.log("server-proxy"))
        status = None
        while time.monotonic() - t0 < 10:
            status, _ = self.request("client", "/after-restart")
            if status == 200:
                break
            time.sleep(0.1)
        took = time.monotonic() - t0
        ok = down != 200 and status == 200
        whose = "the node proxy" if self.ambient else "server's proxy"
        return self.record_step(
            "proxy restart",
            ok,
            f"{whose} killed (SIGKILL): request "
            f"{'failed' if down != 200 else 'still answered'}; "
            f"restarted: HTTP {status} again after {took:.1f}s",
        )

    def step_unmeshed(self) -> bool:
        legacy, server = self.pods["legacy"], self.pods["server"]
        key = "istio_tcp_connections_opened_total[unknown]"  # not mutual_tls: plaintext inbound
        before = mesh.metrics(self.proxy_of(server)).get(key, 0.0)
        status, body, segs = self.captured_request("legacy", legacy)
        visible = any(self.marker.encode() in s.payload for s in segs)
        handled = 0.0
        end = time.monotonic() + 3  # counted as the connection completes
        while time.monotonic() < end and handled < 1:
            handled = mesh.metrics(self.proxy_of(server)).get(key, 0.0) - before
            time.sleep(0.05)
        ok = status == 200 and self.marker in body and visible and handled >= 1
        return self.record_step(
            "unmeshed pod",
            ok,
            f"legacy {legacy.ip} (no proxy) -> server: HTTP {status} through the server's "
            f"inbound 15006 in plaintext (the server's proxy counts {handled:.0f} connection(s) "
            f"without mTLS; marker {'visible' if visible else 'NOT seen'} on the legacy link)",
        )

    def traffic(self) -> str:
        """One line of what flows now: the server proxy's counters and the client app's tally."""
        counts = mesh.metrics(self.proxy_of(self.pods["server"]))
        self.refresh_enrollment()
        try:
            tally = json.loads(self.stats_file.read_text())
        except (OSError, ValueError):
            tally = {}
        now = time.monotonic()
        conns = counts.get("istio_tcp_connections_opened_total", 0.0)
        mtls = counts.get("istio_tcp_connections_opened_total[mutual_tls]", 0.0)
        moved = counts.get("istio_tcp_received_bytes_total", 0.0)
        moved += counts.get("istio_tcp_sent_bytes_total", 0.0)
        then, before, conns_before = self.last_traffic
        span = now - then if then else 0.0
        self.last_traffic = (now, moved, conns)
        rate = "measuring"
        if span > 0:
            rate = f"{(moved - before) / span:.0f} B/s, {(conns - conns_before) / span:.1f} conn/s"
        return (
            f"traffic: {'node' if self.ambient else 'server'} proxy {rate}; "
            f"{conns:.0f} connections "
            f"({mtls:.0f} mutual_tls), {moved:.0f} bytes; client app {tally.get('ok', 0)} ok, "
            f"{tally.get('failed', 0)} failed"
        )

    def run_checks(self) -> None:
        for step in (
            self.step_traffic,
            self.step_mtls,
            self.step_policy,
            self.step_restart,
            self.step_unmeshed,
        ):
            try:
                step()
            except MeshctlError as exc:
                self.record_step(step.__name__.removeprefix("step_"), False, exc.message)
