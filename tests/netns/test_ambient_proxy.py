"""The node proxy in ambient mode, driven over ZDS by an independent agent peer (zds_peer.py).

One node namespace holds the proxy; pods on its bridge carry only the in-pod rules (no sidecar);
the proxy opens its listeners inside each pod's namespace and tunnels pod-to-pod traffic as HBONE
with each pod's own identity.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import time

import pytest

from meshctl.core.pki.identity import SpiffeId
from meshctl.proto import zds_pb2
from tests.harness.wait import eventually
from tests.netns.ambient_harness import APP_PORT, SVC_PORT, ambient_node
from tests.netns.ztunnel_harness import (
    EchoServer,
    Sidecar,
    Sniffer,
    capture,
    echo_roundtrip,
    http_get,
    metric_sum,
    stream_bytes,
    workload,
    write_local_config,
)

pytestmark = pytest.mark.netns

CLIENT = "spiffe://cluster.local/ns/default/sa/client"
SERVER = "spiffe://cluster.local/ns/prod/sa/server"


def refused(ns, addr: tuple[str, int]) -> bool:
    """A connection that gets no answer: reset, or closed before a byte came back."""
    try:
        with ns.socket() as s:
            s.settimeout(5)
            s.connect(addr)
            s.sendall(b"E" + b"x" * 100)
            s.shutdown(socket.SHUT_WR)
            return not s.recv(100)
    except OSError:
        return True


def works(m, payload: bytes = b"again") -> bool:
    try:
        reply = echo_roundtrip(m.client.ns, (m.server.ip, APP_PORT), payload, timeout=2)
    except OSError:
        return False
    return reply[32:] == payload


def listening(pod, port: int) -> bool:
    out = pod.ns.run(["ss", "-Hltn", f"sport = :{port}"]).stdout
    return bool(out.strip())


def test_pods_talk_mtls_with_their_own_identities_through_one_node_proxy(tmp_path):
    with ambient_node(tmp_path) as m:
        canary = b"AMBIENT-CANARY-" + secrets.token_hex(8).encode()
        payload = canary * 20_000
        on_client = Sniffer(m.node.ns, m.client.host_veth)
        for addr in ((m.server.ip, APP_PORT), (m.vip, SVC_PORT)):
            reply = echo_roundtrip(m.client.ns, addr, payload)
            assert reply == hashlib.sha256(payload).digest() + payload
        segments = on_client.stop()
        # Everything the client pod sent went to the server pod's :15008, as TLS records.
        sent = {s.dst for s in segments if s.payload and s.src[0] == m.client.ip}
        assert sent == {(m.server.ip, 15008)}
        assert canary not in b"".join(s.payload for s in segments)
        up = stream_bytes(segments, None, 15008)
        assert up[:1] == b"\x16"
        assert b"\x17\x03\x03" in up
        # The server saw the client pod's own address (delivered transparently, in-pod).
        assert {peer[0] for peer in m.echo.peers} == {m.client.ip}
        text = m.proxy.metrics()
        labels = {"source_principal": CLIENT, "destination_principal": SERVER}
        for reporter in ("source", "destination"):
            opened = metric_sum(
                text, "istio_tcp_connections_opened_total", reporter=reporter, **labels
            )
            assert opened == 2
        via_svc = {"destination_service": "echo.prod.svc.cluster.local", "reporter": "source"}
        assert metric_sum(text, "istio_tcp_connections_opened_total", **via_svc) == 1
        log = m.proxy.log_text(None)
        assert f"src.identity={CLIENT}" in log
        assert f"dst.identity={SERVER}" in log
        dump = m.proxy.config_dump()
        state = dump["workloadState"]
        assert set(state) == {"uid-0", "uid-1"}
        assert state["uid-1"]["info"] == {
            "name": "server",
            "namespace": "prod",
            "serviceAccount": "server",
        }
        assert state["uid-1"]["state"] == "Up"
        assert state["uid-1"]["netns"].startswith("net:[")
        assert set(state["uid-1"]["listeners"]) == {"outbound", "inbound", "inbound_plaintext"}
        assert state["uid-1"]["certificate"]["certChain"][0]["uriSans"] == [SERVER]
        assert state["uid-0"]["certificate"]["certChain"][0]["uriSans"] == [CLIENT]
        assert dump["podsSynced"] is True


def test_listeners_live_in_each_pod_with_the_in_pod_mark(tmp_path):
    with ambient_node(tmp_path) as m:
        for pod in m.pods:
            out = pod.ns.run(["ss", "-Hltne"]).stdout
            for port in (15001, 15006, 15008):
                line = next(ln for ln in out.splitlines() if f":{port} " in ln)
                assert "fwmark:0x539" in line, line
        # Nothing on the node itself: the proxy ports exist only inside pods.
        node_out = m.node.ns.run(["ss", "-Hltn"]).stdout
        assert ":15001 " not in node_out


def test_an_unmeshed_client_reaches_an_ambient_pod_through_15006(tmp_path):
    with ambient_node(tmp_path, pods=3, enroll=(0, 1)) as m:
        outsider = m.pods[2]  # no rules, not enrolled: plain TCP to the server pod
        reply = echo_roundtrip(outsider.ns, (m.server.ip, APP_PORT), b"plain hello")
        assert reply[32:] == b"plain hello"
        assert {p[0] for p in m.echo.peers} == {outsider.ip}
        eventually(
            "the plaintext connection's access line",
            lambda: f"src.addr={outsider.ip}:" in m.proxy.log_text(None),
        )
        text = m.proxy.metrics()
        assert (
            metric_sum(
                text,
                "istio_tcp_connections_opened_total",
                reporter="destination",
                source_principal="unknown",
                destination_principal=SERVER,
            )
            == 1
        )


def test_an_l4_deny_policy_refuses_the_client(tmp_path):
    deny = {
        "name": "deny-client",
        "namespace": "prod",
        "scope": "Namespace",
        "action": "Deny",
        "rules": [[[{"principals": ["cluster.local/ns/default/sa/client"]}]]],
    }
    with ambient_node(tmp_path, policies=[deny]) as m:
        assert refused(m.client.ns, (m.server.ip, APP_PORT))
        assert m.echo.peers == []
        assert (
            metric_sum(
                m.proxy.metrics(), "istio_tcp_connections_failed_total", response_flags="DENY"
            )
            >= 1
        )


def test_sidecar_and_ambient_pods_talk_to_each_other(tmp_path):
    with ambient_node(tmp_path, pods=3, enroll=(0, 1)) as m:
        # Pod 2 gets a sidecar instead: sidecar rules, its own proxy with a certificate.
        side = m.pods[2]
        records = [*m.records[:2], workload("side", "default", side.ip)]
        write_local_config(m.config, workloads=records, services=[], policies=[])
        cert = m.ca.issue("side", SpiffeId("cluster.local", "default", "side"))
        capture(side.ns)
        car = Sidecar(side.ns, "default/side/side", cert, m.config, log_path=tmp_path / "side.log")
        side_echo = EchoServer(side.ns, side.ip, APP_PORT)
        try:
            car.start()
            eventually(
                "the node proxy knows the sidecar pod",
                lambda: any(w["name"] == "side" for w in m.proxy.config_dump()["workloads"]),
            )
            # ambient -> sidecar and sidecar -> ambient, both as HBONE between the proxies.
            assert echo_roundtrip(m.client.ns, (side.ip, APP_PORT), b"to-side")[32:] == b"to-side"
            assert echo_roundtrip(side.ns, (m.server.ip, APP_PORT), b"to-amb")[32:] == b"to-amb"
            side_metrics = car.metrics()
            assert (
                metric_sum(
                    side_metrics,
                    "istio_tcp_connections_opened_total",
                    reporter="destination",
                    source_principal=CLIENT,
                )
                == 1
            )
            assert (
                metric_sum(
                    m.proxy.metrics(),
                    "istio_tcp_connections_opened_total",
                    reporter="destination",
                    source_principal="spiffe://cluster.local/ns/default/sa/side",
                    destination_principal=SERVER,
                )
                == 1
            )
        finally:
            car.stop()
            side_echo.close()


def test_delete_closes_the_pods_listeners_and_capture_then_refuses_never_leaks(tmp_path):
    with ambient_node(tmp_path) as m:
        assert m.agent.delete("uid-1") == ""
        eventually("server pod listeners closed", lambda: not listening(m.server, 15008))
        assert not listening(m.server, 15006)
        assert listening(m.client, 15001)  # the other pod is untouched
        # The server pod's rules still redirect, to a port nobody listens on: refused, and the
        # app never sees the plaintext connection.
        before = len(m.echo.peers)
        assert refused(m.client.ns, (m.server.ip, APP_PORT))
        assert len(m.echo.peers) == before
        assert "uid-1" not in m.proxy.config_dump()["workloadState"]


def test_bad_requests_are_refused_and_other_pods_keep_working(tmp_path):
    with ambient_node(tmp_path, pods=3, enroll=(0, 1), capture=(0, 1, 2)) as m:
        # An fd that is not a network namespace: refused, the pod not served.
        with open(os.devnull, "rb") as null:  # noqa: PTH123
            info = zds_pb2.WorkloadInfo(name="pod2", namespace="default", service_account="pod2")
            add = zds_pb2.WorkloadRequest(add=zds_pb2.AddWorkload(uid="uid-2", workload_info=info))
            error = m.agent.request(add, (null.fileno(),))
        assert "not a network namespace" in error
        assert "failure to start proxy" in error
        assert not listening(m.pods[2], 15001)
        assert "not a network namespace" in m.proxy.log_text(None)
        # Garbage on the socket: refused, the connection dropped; the proxy comes back.
        assert m.agent.raw(b"\xff\xff\xff\xff") != ""
        m.agent.drop()
        m.agent.accept()  # it reconnects and says hello again
        assert m.agent.hello_version == 1
        m.enroll(0, 1)  # the snapshot again: nothing changes for the running pods
        assert echo_roundtrip(m.client.ns, (m.server.ip, APP_PORT), b"still")[32:] == b"still"


def test_add_without_workload_info_stops_the_manager_but_not_the_pods(tmp_path):
    with ambient_node(tmp_path) as m:
        fd = os.open(m.client.ns.path, os.O_RDONLY)
        try:
            bare = zds_pb2.WorkloadRequest(add=zds_pb2.AddWorkload(uid="uid-x"))
            error = m.agent.request(bare, (fd,))
        finally:
            os.close(fd)
        assert "workload_info" in error
        # ztunnel's ProtocolError: the in-pod manager stops (no reconnect), readiness fails.
        eventually("not ready", lambda: "protocol error" in _ready_body(m))
        assert echo_roundtrip(m.client.ns, (m.server.ip, APP_PORT), b"served")[32:] == b"served"


def _ready_body(m) -> str:
    return http_get(m.node.ns, 15021, "/healthz/ready")[1]


def test_a_pod_added_twice_keeps_its_proxy_and_a_new_netns_replaces_it(tmp_path):
    with ambient_node(tmp_path, pods=3, capture=(0, 1, 2)) as m:
        before = m.proxy.config_dump()["workloadState"]["uid-0"]["netns"]
        assert m.agent.add("uid-0", m.client.ns.path, "client", "default", "client") == ""
        assert m.proxy.config_dump()["workloadState"]["uid-0"]["netns"] == before
        # The sandbox was re-created: same uid, new netns (pod 2's, as a stand-in).
        assert m.agent.add("uid-0", m.pods[2].ns.path, "client", "default", "client") == ""
        assert m.proxy.config_dump()["workloadState"]["uid-0"]["netns"] != before
        eventually("old listeners closed", lambda: not listening(m.client, 15001))
        assert listening(m.pods[2], 15001)


def test_killed_proxy_keeps_pods_captured_and_serves_new_connections_after_restart(tmp_path):
    with ambient_node(tmp_path) as m:
        # A long transfer is in flight when the proxy dies.
        s = m.client.ns.socket()
        s.settimeout(10)
        s.connect((m.server.ip, APP_PORT))
        s.sendall(b"E" + b"x" * 10_000)
        m.proxy.kill()
        # Capture stays: nothing listens, the kernel refuses; the app sees nothing in plaintext.
        before = len(m.echo.peers)
        assert refused(m.client.ns, (m.server.ip, APP_PORT))
        assert len(m.echo.peers) == before
        s.close()
        started = m.restart_proxy()
        m.enroll(0, 1)  # the agent's snapshot, as soon as the new proxy said hello
        m.proxy.wait_ready()
        ready = time.monotonic()
        eventually("a new connection succeeds", lambda: works(m), timeout=10)
        took = time.monotonic() - ready
        print(f"restart: ready after {ready - started:.2f}s, first connection {took:.2f}s later")
        # No time limit beyond eventually()'s: a timed assertion flakes on a loaded machine; the
        # figure is printed (and the issue's 2 s target read from it), a hang still fails.


def _works(m) -> bool:
    try:
        return (
            echo_roundtrip(m.client.ns, (m.server.ip, APP_PORT), b"again", timeout=2)[32:]
            == b"again"
        )
    except OSError:
        return False


def test_a_crashed_data_plane_gets_every_pod_again(tmp_path):
    with ambient_node(tmp_path, extra=("--workers", "2")) as m:
        for pid in m.proxy.dataplane_pids(2):
            os.kill(pid, 9)
        eventually("ready again", lambda: _ready_body(m).startswith("ready"), timeout=20)
        for _ in range(4):  # either worker may take each connection
            assert echo_roundtrip(m.client.ns, (m.server.ip, APP_PORT), b"w")[32:] == b"w"
