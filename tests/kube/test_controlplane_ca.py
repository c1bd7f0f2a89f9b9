"""The CA of ``meshctl controlplane run`` against the real kube-apiserver, over gRPC with TLS.

Real TokenRequest tokens (bound to pods as the kubelet projects them) are checked by a real
TokenReview; issued chains are checked with ``openssl verify``; refusals are the gRPC status
Istio uses and are counted in ``/metrics``; bad peers never stop the process.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from kubernetes import client as k8s

from tests.harness import controlplane as cp
from tests.harness.kube import (
    KubeCluster,
    create_namespace,
    delete_namespace,
    ensure_service_account,
    request_token,
)

pytestmark = pytest.mark.kube


@pytest.fixture(scope="module")
def plane(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[cp.ControlPlaneProcess]:
    namespace = f"cp-{secrets.token_hex(3)}"
    with kube_cluster.api_client() as api:
        create_namespace(api, namespace)
        workdir = tmp_path_factory.mktemp("controlplane")
        try:
            with cp.running(
                kube_cluster,
                namespace,
                workdir,
                "--trusted-node-accounts",
                f"{namespace}/meshctl-ztunnel",
            ) as process:
                yield process
        finally:
            delete_namespace(api, namespace)


@pytest.fixture(scope="module")
def root(plane: cp.ControlPlaneProcess, kube_api: k8s.ApiClient) -> bytes:
    return cp.root_pem(kube_api, plane.namespace)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def openssl_verify(tmp_path: Path, root: bytes, chain: list[str]) -> str:
    (tmp_path / "root.pem").write_bytes(root)
    (tmp_path / "leaf.pem").write_text(chain[0])
    (tmp_path / "chain.pem").write_text("".join(chain[1:]))
    result = subprocess.run(
        [
            *("openssl", "verify", "-CAfile", str(tmp_path / "root.pem")),
            *("-untrusted", str(tmp_path / "chain.pem"), "-purpose", "sslserver"),
            str(tmp_path / "leaf.pem"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return (result.stdout + result.stderr).strip()


def spiffe(namespace: str, account: str) -> str:
    return f"spiffe://cluster.local/ns/{namespace}/sa/{account}"


def ask(plane: cp.ControlPlaneProcess, root: bytes, token: str, csr_pem: str, **kw: Any) -> Any:
    async def call() -> Any:
        async with plane.channel(root, token) as channel:
            return await cp.status_of(channel, csr_pem, **kw)

    return run(call())


def issue(
    plane: cp.ControlPlaneProcess, root: bytes, token: str, csr_pem: str, **kw: Any
) -> list[str]:
    async def call() -> list[str]:
        async with plane.channel(root, token) as channel:
            return await cp.create_certificate(channel, csr_pem, **kw)

    result: list[str] = run(call())
    return result


@pytest.mark.parametrize("audience", ["istio-ca", "meshctl-ca"])
def test_a_pod_token_gets_its_spiffe_certificate_which_openssl_verifies(
    plane: cp.ControlPlaneProcess,
    root: bytes,
    kube_cluster: KubeCluster,
    kube_namespace: str,
    tmp_path: Path,
    audience: str,
) -> None:
    token = cp.pod_token(kube_cluster, kube_namespace, "cart", "cart-1", audience=audience)
    identity = spiffe(kube_namespace, "cart")
    csr_pem, _key = cp.csr(identity)
    before = plane.metric("meshctl_ca_requests_total", result="issued")
    chain = issue(plane, root, token, csr_pem, ttl=3600)
    assert len(chain) == 2  # leaf, root (self-signed CA: no intermediates)
    assert chain[-1].encode() == root
    assert openssl_verify(tmp_path, root, chain).endswith("OK")
    leaf = x509.load_pem_x509_certificate(chain[0].encode())
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(n.value) for n in san] == [identity]
    lifetime = leaf.not_valid_after_utc - leaf.not_valid_before_utc
    assert 3600 <= lifetime.total_seconds() <= 3600 + 120  # one minute of backdating
    assert plane.metric("meshctl_ca_requests_total", result="issued") == before + 1


def test_a_requested_lifetime_beyond_the_maximum_is_refused_as_istiod_refuses_it(
    plane: cp.ControlPlaneProcess, root: bytes, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    token = request_token(kube_cluster, kube_namespace, "long", "istio-ca")
    csr_pem, _ = cp.csr(spiffe(kube_namespace, "long"))
    code, message = ask(plane, root, token, csr_pem, ttl=2400 * 3600)
    assert code == "INVALID_ARGUMENT"
    assert message == (
        "CSR signing error (requested TTL 2400h0m0s is greater than the max allowed TTL 2160h0m0s)"
    )
    chain = issue(plane, root, token, csr_pem, ttl=90 * 86400)  # exactly the maximum: signed
    leaf = x509.load_pem_x509_certificate(chain[0].encode())
    days = (leaf.not_valid_after_utc - leaf.not_valid_before_utc).total_seconds() / 86400
    assert 90 <= days <= 90.01


def test_refused_tokens_are_unauthenticated_and_counted(
    plane: cp.ControlPlaneProcess,
    root: bytes,
    kube_cluster: KubeCluster,
    kube_api: k8s.ApiClient,
    kube_namespace: str,
) -> None:
    csr_pem, _ = cp.csr(spiffe(kube_namespace, "web"))
    before = plane.metric("meshctl_ca_requests_total", result="unauthenticated")
    wrong_audience = request_token(kube_cluster, kube_namespace, "web", "some-other-audience")
    expired = cp.expired_token(kube_cluster, kube_namespace, "web")
    gone = request_token(kube_cluster, kube_namespace, "temp", "istio-ca")
    k8s.CoreV1Api(kube_api).delete_namespaced_service_account("temp", kube_namespace)
    temp_csr, _ = cp.csr(spiffe(kube_namespace, "temp"))

    code, message = ask(plane, root, wrong_audience, csr_pem)
    assert code == "UNAUTHENTICATED"
    assert message.startswith("request authenticate failure: ")  # istiod's words, then why
    assert "TokenReview" in message
    code, message = ask(plane, root, expired, csr_pem)
    assert (code, "expired" in message) == ("UNAUTHENTICATED", True), message
    code, message = ask(plane, root, gone, temp_csr)
    assert code == "UNAUTHENTICATED", message
    code, message = ask(plane, root, "not-a-token", csr_pem)
    assert code == "UNAUTHENTICATED"

    async def without_token() -> tuple[str, str]:
        async with plane.channel(root) as channel:
            return await cp.status_of(channel, csr_pem)

    code, message = run(without_token())
    assert (code, "authorization" in message) == ("UNAUTHENTICATED", True)
    assert plane.metric("meshctl_ca_requests_total", result="unauthenticated") == before + 5


def test_a_csr_for_another_identity_is_permission_denied(
    plane: cp.ControlPlaneProcess, root: bytes, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    token = request_token(kube_cluster, kube_namespace, "web", "istio-ca")
    before = plane.metric("meshctl_ca_requests_total", result="permission_denied")
    for other in (spiffe(kube_namespace, "admin"), spiffe("kube-system", "web")):
        csr_pem, _ = cp.csr(other)
        code, message = ask(plane, root, token, csr_pem)
        assert code == "PERMISSION_DENIED"
        assert "may only ask for its own identity" in message
    assert plane.metric("meshctl_ca_requests_total", result="permission_denied") == before + 2
    # Impersonation metadata from a workload that is not a trusted node proxy: istiod's answer.
    csr_pem, _ = cp.csr(spiffe(kube_namespace, "admin"))
    code, message = ask(plane, root, token, csr_pem, impersonate=spiffe(kube_namespace, "admin"))
    assert code == "UNAUTHENTICATED"
    assert message.startswith("request impersonation authentication failure: ")


def test_a_node_proxy_may_impersonate_only_workloads_on_its_own_node(
    plane: cp.ControlPlaneProcess,
    root: bytes,
    kube_cluster: KubeCluster,
    kube_namespace: str,
    tmp_path: Path,
) -> None:
    # The node proxy runs on node-a; "web" has a pod there, "db" only on node-b.
    with kube_cluster.api_client() as api:
        ensure_service_account(api, plane.namespace, "meshctl-ztunnel")
    zt_pod = f"ztunnel-{secrets.token_hex(3)}"
    node_token = cp.pod_token(kube_cluster, plane.namespace, "meshctl-ztunnel", zt_pod)
    cp.pod_token(kube_cluster, kube_namespace, "web", "web-1", node="node-a")
    cp.pod_token(kube_cluster, kube_namespace, "db", "db-1", node="node-b")
    web, db = spiffe(kube_namespace, "web"), spiffe(kube_namespace, "db")

    web_csr, _ = cp.csr(web)
    chain = issue(plane, root, node_token, web_csr, impersonate=web)
    assert openssl_verify(tmp_path, root, chain).endswith("OK")

    db_csr, _ = cp.csr(db)
    code, message = ask(plane, root, node_token, db_csr, impersonate=db)
    assert code == "UNAUTHENTICATED"  # istiod's code and opening words, then why
    assert message.startswith("request impersonation authentication failure: ")
    assert "no pod of service account" in message
    assert "node-a" in message
    code, message = ask(plane, root, node_token, web_csr)  # no ImpersonatedIdentity
    assert (code, "ImpersonatedIdentity" in message) == ("PERMISSION_DENIED", True)
    code, message = ask(plane, root, node_token, web_csr, impersonate=db)  # CSR != metadata
    assert code == "INVALID_ARGUMENT"

    # Not bound to a pod: the node cannot be known.
    unbound = request_token(kube_cluster, plane.namespace, "meshctl-ztunnel", "istio-ca")
    code, message = ask(plane, root, unbound, web_csr, impersonate=web)
    assert (code, "not bound to a pod" in message) == ("UNAUTHENTICATED", True)


def test_bad_csrs_are_invalid_argument(
    plane: cp.ControlPlaneProcess, root: bytes, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    token = request_token(kube_cluster, kube_namespace, "web", "istio-ca")
    me = spiffe(kube_namespace, "web")
    two, _ = cp.csr(
        me,
        sans=[
            x509.UniformResourceIdentifier(me),
            x509.UniformResourceIdentifier(spiffe(kube_namespace, "other")),
        ],
    )
    before = plane.metric("meshctl_ca_requests_total", result="invalid_argument")
    for bad, reason in (
        ("this is not a CSR", "not a PEM PKCS#10"),
        (two, "exactly one SAN"),
        (cp.csr(me, sans=[x509.DNSName("web.example")])[0], "exactly one SAN"),
    ):
        code, message = ask(plane, root, token, bad)
        assert code == "INVALID_ARGUMENT"
        assert reason in message
    assert plane.metric("meshctl_ca_requests_total", result="invalid_argument") == before + 3


def test_bad_peers_get_protocol_errors_and_the_process_keeps_serving(
    plane: cp.ControlPlaneProcess, root: bytes, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    token = request_token(kube_cluster, kube_namespace, "web", "istio-ca")
    me = spiffe(kube_namespace, "web")

    # A request over the message limit (4 MiB): RESOURCE_EXHAUSTED before any handler runs.
    huge = "x" * (5 * 1024 * 1024)
    code, _ = ask(plane, root, token, huge)
    assert code == "RESOURCE_EXHAUSTED"

    # An unknown method on the same server: UNIMPLEMENTED.
    async def unknown() -> str:
        async with plane.channel(root, token) as channel:
            method = channel.unary_unary("/istio.v1.auth.IstioCertificateService/Nope")
            try:
                await method(b"", timeout=5)
            except grpc.aio.AioRpcError as exc:
                return exc.code().name
            return "OK"

    assert run(unknown()) == "UNIMPLEMENTED"

    # Plaintext HTTP/2 and HTTP/1 on the TLS port: the handshake fails, nothing is served.
    async def plaintext() -> str:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{plane.grpc_port}") as channel:
            return (await cp.status_of(channel, cp.csr(me)[0], timeout=3))[0]

    assert run(plaintext()) == "UNAVAILABLE"
    with socket.create_connection(("127.0.0.1", plane.grpc_port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(5)
        try:
            answer = sock.recv(100)
        except (ConnectionResetError, TimeoutError):
            answer = b""
        assert b"HTTP/1.1 200" not in answer
    # A TLS client that does not trust our root: its own handshake fails.
    context = ssl.create_default_context()
    with (
        socket.create_connection(("127.0.0.1", plane.grpc_port), timeout=5) as sock,
        pytest.raises(ssl.SSLCertVerificationError),
        context.wrap_socket(sock, server_hostname=plane.server_name),
    ):
        pass

    # ... and the CA still signs.
    csr_pem, _ = cp.csr(me)
    assert len(issue(plane, root, token, csr_pem)) == 2
    assert plane.process.poll() is None


def test_token_reviews_are_cached_per_token(
    plane: cp.ControlPlaneProcess, root: bytes, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    token = request_token(kube_cluster, kube_namespace, "cached", "istio-ca")
    before = plane.metric("meshctl_ca_token_reviews_total", result="accepted")
    for _ in range(5):
        csr_pem, _ = cp.csr(spiffe(kube_namespace, "cached"))
        issue(plane, root, token, csr_pem)
    assert plane.metric("meshctl_ca_token_reviews_total", result="accepted") == before + 1


def test_metrics_and_readiness_ports_answer(plane: cp.ControlPlaneProcess) -> None:
    assert plane.get(plane.readiness_port, "/ready") == (200, "ready\n")
    assert plane.get(plane.readiness_port, "/other")[0] == 404
    text = plane.metrics()
    for name in (
        "meshctl_ca_requests_total",
        "meshctl_ca_request_duration_seconds_bucket",
        "citadel_server_root_cert_expiry_timestamp",
        "pilot_xds",
    ):
        assert name in text
    assert plane.metric("citadel_server_root_cert_expiry_timestamp") > time.time() + 9 * 365 * 86400


def test_one_listening_and_one_ready_line_at_the_default_level(
    kube_cluster: KubeCluster, tmp_path: Path
) -> None:
    namespace = f"cp-{secrets.token_hex(3)}"
    with kube_cluster.api_client() as api:
        create_namespace(api, namespace)
        try:
            with cp.running(kube_cluster, namespace, tmp_path, log_level=None) as plane:
                deadline = time.monotonic() + 10
                while "control plane ready" not in plane.log.read_text():
                    assert time.monotonic() < deadline, plane.log_tail()
                    time.sleep(0.1)
                lines = plane.log.read_text().splitlines()
        finally:
            delete_namespace(api, namespace)
    listening = [line for line in lines if "control plane listening on" in line]
    ready = [line for line in lines if "control plane ready" in line]
    assert len(listening) == 1, lines
    assert len(ready) == 1, lines
    for port in (plane.grpc_port, plane.webhook_port, plane.metrics_port, plane.readiness_port):
        assert f"127.0.0.1:{port}" in listening[0]
    assert lines.index(listening[0]) < lines.index(ready[0])
