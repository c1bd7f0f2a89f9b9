"""Both reporters name the Service a connection was for; inbound lines carry the HBONE authority.

ztunnel's rules, checked on the wire's results: the source names the Service whose VIP the client
dialled and tells the destination in the CONNECT's ``forwarded: ...;host=``; the destination names
that Service if its workload backs it, else (a pod dialled directly, plaintext) the first Service
targeting the port, else ``unknown``. The server here backs two Services on one target port, the
one that is not dialled listed first, so only the client proxy's claim can name the right one.
Over HBONE both sides log ``dst.addr`` (the TCP connection's, :15008) and ``dst.hbone_addr`` (the
CONNECT authority); a plaintext inbound line has no ``dst.hbone_addr``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from meshctl.core.pki.identity import SpiffeId
from tests.harness.wait import eventually
from tests.netns.ambient_harness import ambient_node
from tests.netns.ztunnel_harness import (
    EchoServer,
    Sidecar,
    capture,
    echo_roundtrip,
    workload,
    write_local_config,
)
from tests.netns.ztunnel_topology import APP_PORT, SVC_HOST, SVC_PORT, two_pod_mesh

pytestmark = pytest.mark.netns

ADMIN_HOST = "admin.prod.svc.cluster.local"
ADMIN_PORT = 81
ECHO = (SVC_HOST, "echo", "prod")
ADMIN = (ADMIN_HOST, "admin", "prod")
UNKNOWN = ("unknown", "unknown", "unknown")
OPENED = "istio_tcp_connections_opened_total"
SERVICE_LABELS = (
    "destination_service",
    "destination_service_name",
    "destination_service_namespace",
)
OTHER_PORT = 9090  # a port of the server no Service targets


def two_services(path: Path, workloads: list[dict], server_ip: str, vips: tuple[str, str]) -> None:
    """The local config with server (at ``server_ip``) backing admin (listed first) and echo."""
    echo_vip, admin_vip = vips
    server = workload(
        "server",
        "prod",
        server_ip,
        services={
            f"prod/{ADMIN_HOST}": {ADMIN_PORT: APP_PORT},
            f"prod/{SVC_HOST}": {SVC_PORT: APP_PORT},
        },
    )
    others = [w for w in workloads if w["name"] != "server"]
    write_local_config(
        path,
        workloads=[*others, server],
        services=[
            _service("echo", SVC_HOST, echo_vip, SVC_PORT),
            _service("admin", ADMIN_HOST, admin_vip, ADMIN_PORT),
        ],
        policies=[],
    )


def _service(name: str, host: str, vip: str, port: int) -> dict:
    return {
        "name": name,
        "namespace": "prod",
        "hostname": host,
        "vips": [f"/{vip}"],
        "ports": {port: APP_PORT},
    }


def knows_admin(proxy: Sidecar) -> bool:
    return any(s["hostname"] == ADMIN_HOST for s in proxy.config_dump()["services"])


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def opened(text: str, reporter: str) -> dict[tuple[str, ...], float]:
    """Connections opened per (source_workload, connection_security_policy, service labels),
    the label values read exactly (none of these holds an escape)."""
    out: dict[tuple[str, ...], float] = {}
    for line in text.splitlines():
        if not line.startswith(OPENED + "{"):
            continue
        head, _, value = line.rpartition(" ")
        labels = dict(_LABEL.findall(head))
        if labels["reporter"] != reporter:
            continue
        key = (
            labels["source_workload"],
            labels["connection_security_policy"],
            *(labels[k] for k in SERVICE_LABELS),
        )
        out[key] = out.get(key, 0) + float(value)
    return out


_FIELD = re.compile(r'([\w.]+)=("[^"]*"|\S+)')


def access_lines(log: str, direction: str) -> list[dict[str, str]]:
    """The access-log lines of ``direction`` as field -> value, in the order written."""
    out = []
    for line in log.splitlines():
        _, found, fields = line.partition("connection complete ")
        if found:
            parsed = dict(_FIELD.findall(fields))
            if parsed.get("direction") == direction:
                out.append(parsed)
    return out


def hops(lines: list[dict[str, str]]) -> list[tuple[str, ...]]:
    """(src.workload, dst.addr, dst.hbone_addr, dst.service) of each line, "-" for a field
    the line does not have, sorted."""
    return sorted(
        tuple(f.get(k, "-") for k in ("src.workload", "dst.addr", "dst.hbone_addr", "dst.service"))
        for f in lines
    )


def test_sidecars_name_the_dialled_service_on_both_sides_and_log_the_connect_authority(
    tmp_path,
):
    with two_pod_mesh(tmp_path) as m:
        admin_vip = str(m.node.subnet.network_address + 201)
        client = workload("client", "default", m.a.ip)
        two_services(m.config, [client], m.b.ip, (m.vip, admin_vip))
        eventually("both sidecars know the admin Service", lambda: all(
            knows_admin(car) for car in (m.car_a, m.car_b)
        ), 10)  # fmt: skip
        for addr in ((m.vip, SVC_PORT), (admin_vip, ADMIN_PORT), (m.b.ip, APP_PORT)):
            assert echo_roundtrip(m.a.ns, addr, b"which")[32:] == b"which"
        eventually("six access lines", lambda: (
            m.car_a.log_text(None).count("connection complete") == 3
            and m.car_b.log_text(None).count("connection complete") == 3
        ))  # fmt: skip
        mtls = ("client", "mutual_tls")
        assert opened(m.car_a.metrics(), "source") == {
            (*mtls, *ECHO): 1,
            (*mtls, *ADMIN): 1,
            (*mtls, *UNKNOWN): 1,  # the pod dialled directly: no Service (ztunnel's too)
        }
        # The destination names what the client dialled; for the pod dialled directly it takes
        # the first Service targeting the port, as ztunnel's guess_inbound_service does.
        assert opened(m.car_b.metrics(), "destination") == {(*mtls, *ECHO): 1, (*mtls, *ADMIN): 2}
        hop = (f"{m.b.ip}:15008", f"{m.b.ip}:{APP_PORT}")
        assert hops(access_lines(m.car_b.log_text(None), "inbound")) == [
            ("client", *hop, ADMIN_HOST),
            ("client", *hop, ADMIN_HOST),
            ("client", *hop, SVC_HOST),
        ]
        assert hops(access_lines(m.car_a.log_text(None), "outbound")) == [
            ("client", *hop, "-"),
            ("client", *hop, ADMIN_HOST),
            ("client", *hop, SVC_HOST),
        ]


def test_the_node_proxy_names_the_dialled_service_for_ambient_sidecar_and_plaintext_clients(
    tmp_path,
):
    with ambient_node(tmp_path, pods=4, enroll=(0, 1)) as m:
        side, outsider = m.pods[2], m.pods[3]  # a sidecar pod; an unmeshed one (no rules)
        admin_vip = str(m.node.subnet.network_address + 201)
        records = [m.records[0], workload("side", "default", side.ip), m.records[3]]
        two_services(m.config, records, m.server.ip, (m.vip, admin_vip))
        capture(side.ns)
        cert = m.ca.issue("side", SpiffeId("cluster.local", "default", "side"))
        car = Sidecar(side.ns, "default/side/side", cert, m.config, log_path=tmp_path / "side.log")
        other = EchoServer(m.server.ns, m.server.ip, OTHER_PORT)
        try:
            car.start()
            eventually("both proxies know the admin Service", lambda: all(
                knows_admin(p) for p in (m.proxy, car)
            ), 10)  # fmt: skip
            for ns, addr in (
                (m.client.ns, (m.vip, SVC_PORT)),  # ambient -> ambient, by each VIP
                (m.client.ns, (admin_vip, ADMIN_PORT)),
                (side.ns, (m.vip, SVC_PORT)),  # sidecar -> ambient
                (outsider.ns, (m.server.ip, APP_PORT)),  # plaintext to a targeted port
                (outsider.ns, (m.server.ip, OTHER_PORT)),  # plaintext to a port none targets
            ):
                assert echo_roundtrip(ns, addr, b"which")[32:] == b"which"
            eventually("seven access lines", lambda: (
                m.proxy.log_text(None).count("connection complete") == 7
                and car.log_text(None).count("connection complete") == 1
            ))  # fmt: skip
            text = m.proxy.metrics()
            assert opened(text, "source") == {
                ("client", "mutual_tls", *ECHO): 1,
                ("client", "mutual_tls", *ADMIN): 1,
            }
            assert opened(car.metrics(), "source") == {("side", "mutual_tls", *ECHO): 1}
            # Plaintext: no client proxy claims a Service, so ztunnel's guess by target port
            # names the first one targeting 8080, and none for 9090 (ztunnel's "unknown" too).
            assert opened(text, "destination") == {
                ("client", "mutual_tls", *ECHO): 1,
                ("client", "mutual_tls", *ADMIN): 1,
                ("side", "mutual_tls", *ECHO): 1,
                ("pod3", "unknown", *ADMIN): 1,
                ("pod3", "unknown", *UNKNOWN): 1,
            }
            hop = (f"{m.server.ip}:15008", f"{m.server.ip}:{APP_PORT}")
            assert hops(access_lines(m.proxy.log_text(None), "inbound")) == [
                ("client", *hop, ADMIN_HOST),
                ("client", *hop, SVC_HOST),
                ("pod3", f"{m.server.ip}:{APP_PORT}", "-", ADMIN_HOST),
                ("pod3", f"{m.server.ip}:{OTHER_PORT}", "-", "-"),
                ("side", *hop, SVC_HOST),
            ]
        finally:
            car.stop()
            other.close()
