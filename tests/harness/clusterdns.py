"""Cluster DNS for the test node: Service names resolve in pods, as CoreDNS makes them resolve.

Owns a dnsmasq (Debian's ``dnsmasq-base``) on the node address, port 53, authoritative for the
cluster domain only, and a thread that keeps its hosts directory equal to the cluster's Services
(``<svc>.<ns>.svc.<domain>`` -> ClusterIP, the A records of CoreDNS's kubernetes plugin for
ClusterIP Services). Why not CoreDNS: building it needs a few hundred Go modules; the records a
mesh needs (the control plane's Service name) are these. Invariants: no upstream servers (a name
outside the cluster domain gets no answer from elsewhere: nothing is sent off the machine); no
negative caching (a Service created a moment ago resolves at once); the file is replaced
atomically and only when the records change.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

DOMAIN = "cluster.local"
POLL_SECONDS = 0.3


def records(services: Iterable[Mapping[str, Any]], domain: str = DOMAIN) -> str:
    """hosts(5) lines for every Service with a cluster IP, sorted (same Services, same text)."""
    lines = []
    for service in services:
        meta = service.get("metadata") or {}
        spec = service.get("spec") or {}
        ips = [
            ip for ip in spec.get("clusterIPs") or [spec.get("clusterIP")] if ip and ip != "None"
        ]
        name = f"{meta.get('name')}.{meta.get('namespace')}.svc.{domain}"
        lines += [f"{ip} {name}" for ip in ips]
    return "".join(f"{line}\n" for line in sorted(lines))


def dnsmasq_argv(binary: str, address: str, hosts_dir: Path, domain: str = DOMAIN) -> list[str]:
    return [
        binary,
        "--keep-in-foreground",
        "--conf-file=/dev/null",
        "--no-resolv",  # no upstream: only the cluster's names are answered
        "--no-hosts",
        "--no-poll",
        f"--listen-address={address}",
        "--bind-interfaces",
        "--port=53",
        f"--hostsdir={hosts_dir}",  # re-read on change (inotify)
        f"--local=/{domain}/",  # authoritative: unknown names there are NXDOMAIN
        "--no-negcache",
        "--cache-size=0",
        "--pid-file=",
        "--log-facility=-",
    ]


class ServiceRecords:
    """Keeps ``hosts_dir/services`` equal to the cluster's Services until ``stop``."""

    def __init__(self, api_client: Callable[[], k8s.ApiClient], hosts_dir: Path) -> None:
        self._api_client = api_client
        self.path = hosts_dir / "services"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cluster-dns", daemon=True)
        self._written: str | None = None

    def start(self) -> ServiceRecords:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.refresh()
        self._thread.start()
        return self

    def refresh(self) -> None:
        with self._api_client() as api:
            listed = k8s.CoreV1Api(api).list_service_for_all_namespaces()
            items = api.sanitize_for_serialization(listed).get("items") or []
        text = records(items)
        if text != self._written:
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_text(text)
            tmp.chmod(0o644)
            tmp.replace(self.path)
            self._written = text

    def _loop(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            with contextlib.suppress(Exception):  # the apiserver stopping first: the next try
                self.refresh()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


def query_a(server: str, name: str, timeout: float = 1.0) -> list[str]:
    """The A records ``server`` gives for ``name`` (RFC 1035 over UDP), [] for none."""
    qid = int.from_bytes(os.urandom(2), "big")
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split(".")) + b"\0"
    packet = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + qname + struct.pack("!HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.sendto(packet, (server, 53))
        data, _ = sock.recvfrom(4096)
    rid, _flags, _qd, answers, _ns, _ar = struct.unpack("!HHHHHH", data[:12])
    if rid != qid:
        return []
    pos = 12 + len(qname) + 4
    found = []
    for _ in range(answers):
        if data[pos] & 0xC0 == 0xC0:  # a compressed name pointer
            pos += 2
        else:
            while data[pos]:
                pos += data[pos] + 1
            pos += 1
        rtype, _cls, _ttl, length = struct.unpack("!HHIH", data[pos : pos + 10])
        pos += 10
        if rtype == 1 and length == 4:
            found.append(socket.inet_ntoa(data[pos : pos + 4]))
        pos += length
    return found
