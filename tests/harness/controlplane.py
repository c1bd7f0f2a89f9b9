"""``meshctl controlplane run`` as a test subprocess against the real kube-apiserver.

Owns starting a replica on 127.0.0.1 ports (a revision of its own per test, so its Lease, Service
names and webhook configuration never meet another test's), waiting for ``/ready``, reading its
metrics, a CA client for it, and stopping it with SIGTERM. Also tokens as proxies hold them:
TokenRequest bound to a pod, and an expired one signed with the API server's own issuer key.
Invariants: listens on 127.0.0.1 only; every process started here is gone after ``stop`` or a
failed start (killed if the drain overruns), its log kept for the failure message.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import importlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from kubernetes import client as k8s

from meshctl import rpc
from meshctl.proto import citadel_pb2, citadel_pb2_grpc
from tests.harness.kube import SA_ISSUER, KubeCluster, ensure_service_account, free_port

SERVICE = "meshctl-controlplane"


@dataclass
class ControlPlaneProcess:
    """One running replica: its namespace, revision, ports and process."""

    namespace: str
    revision: str
    process: subprocess.Popen[bytes]
    log: Path
    grpc_port: int
    webhook_port: int
    metrics_port: int
    readiness_port: int
    argv: list[str] = field(default_factory=list)

    @property
    def server_name(self) -> str:
        """The DNS name a proxy checks in the serving certificate."""
        name = SERVICE if self.revision == "default" else f"{SERVICE}-{self.revision}"
        return f"{name}.{self.namespace}.svc"

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}/inject"

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def get(self, port: int, path: str) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            conn.close()

    def ready(self) -> bool:
        try:
            return self.get(self.readiness_port, "/ready")[0] == 200
        except OSError:
            return False

    def metrics(self) -> str:
        return self.get(self.metrics_port, "/metrics")[1]

    def metric(self, name: str, **labels: str) -> float:
        """The value of one series in ``/metrics`` (0 when absent)."""
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in self.metrics().splitlines():
            if line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            metric, _, rest = series.partition("{")
            got = ",".join(sorted(rest.rstrip("}").split(","))) if rest else ""
            if metric == name and got == wanted:
                return float(value)
        return 0.0

    def channel(self, root_pem: bytes, token: str | None = None, **kwargs: Any) -> Any:
        auth = rpc.CallAuth(token=token, cluster_id="Kubernetes") if token else None
        return rpc.connect(
            f"127.0.0.1:{self.grpc_port}",
            root_pem=root_pem,
            auth=auth,
            server_name=self.server_name,
            **kwargs,
        )

    def stop(self, grace: float = 20.0) -> int:
        """SIGTERM, wait up to ``grace`` seconds (then SIGKILL); returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=grace)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()


def install_crds(cluster: KubeCluster, timeout: float = 30.0) -> None:
    """The control plane's CRDs (``crds.objects()``), created once and Established."""
    # By name: the plugins install as meshctl_plugins, which the type checker of this harness
    # does not follow.
    crds = importlib.import_module("meshctl_plugins.controlplane.crds")
    with cluster.api_client() as api:
        ext = k8s.ApiextensionsV1Api(api)
        for body in crds.objects():
            name = body["metadata"]["name"]
            try:
                ext.create_custom_resource_definition(body)
            except k8s.exceptions.ApiException as exc:
                if exc.status != 409:
                    raise
            deadline = time.monotonic() + timeout
            while True:
                found = ext.read_custom_resource_definition(name)
                conditions = (found.status and found.status.conditions) or []
                if any(c.type == "Established" and c.status == "True" for c in conditions):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"CRD {name} not Established after {timeout}s")
                time.sleep(0.1)


def start(
    cluster: KubeCluster,
    namespace: str,
    workdir: Path,
    *extra: str,
    revision: str | None = None,
    env: dict[str, str] | None = None,
    wait_ready: bool = True,
    timeout: float = 60.0,
    grpc_port: int | None = None,
    kubeconfig: Path | None = None,
    log_level: str | None = "info",
) -> ControlPlaneProcess:
    """Start one replica serving for ``namespace`` (created by the caller); ``grpc_port``
    reuses a port (a restarted CA at the address its clients know); ``log_level`` None runs
    at the command's own default."""
    install_crds(cluster)  # discovery watches AuthorizationPolicies: not ready without them
    revision = revision or f"t{secrets.token_hex(3)}"
    ports = [grpc_port or free_port(), *(free_port() for _ in range(3))]
    log = workdir / f"controlplane-{revision}-{secrets.token_hex(2)}.log"
    argv = [
        *(sys.executable, "-c", "from meshctl.entry import run; run()"),
        *(("--log-level", log_level) if log_level else ()),
        *("--kubeconfig", str(kubeconfig or cluster.kubeconfig)),
        *("controlplane", "run", "--namespace", namespace, "--revision", revision),
        *("--grpc-address", f"127.0.0.1:{ports[0]}"),
        *("--webhook-address", f"127.0.0.1:{ports[1]}"),
        *("--monitoring-address", f"127.0.0.1:{ports[2]}"),
        *("--readiness-address", f"127.0.0.1:{ports[3]}"),
        *("--serving-names", "127.0.0.1"),
        *extra,
    ]
    child_env = {
        **os.environ,
        "MESHCTL_CONFIG": "",
        "KUBECONFIG": "",
        # Quick failover for tests (client-go's defaults are 15s / 10s / 2s).
        "MESHCTL_LEASE_DURATION": "3s",
        "MESHCTL_RENEW_DEADLINE": "2s",
        "MESHCTL_RETRY_PERIOD": "0.5s",
        **(env or {}),
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=child_env
        )
    plane = ControlPlaneProcess(
        namespace=namespace,
        revision=revision,
        process=process,
        log=log,
        grpc_port=ports[0],
        webhook_port=ports[1],
        metrics_port=ports[2],
        readiness_port=ports[3],
        argv=argv,
    )
    if wait_ready:
        try:
            wait_until_ready(plane, timeout)
        except BaseException:
            plane.stop(grace=5)
            raise
    return plane


def wait_until_ready(plane: ControlPlaneProcess, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not plane.ready():
        if plane.process.poll() is not None:
            raise RuntimeError(
                f"controlplane exited {plane.process.returncode}:\n{plane.log_tail()}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"controlplane not ready after {timeout}s:\n{plane.log_tail()}")
        time.sleep(0.1)


@contextlib.contextmanager
def running(
    cluster: KubeCluster, namespace: str, workdir: Path, *extra: str, **kwargs: Any
) -> Iterator[ControlPlaneProcess]:
    plane = start(cluster, namespace, workdir, *extra, **kwargs)
    try:
        yield plane
    finally:
        plane.stop()


def root_pem(api: k8s.ApiClient, namespace: str) -> bytes:
    """The root the control plane minted into ``meshctl-ca-secret``."""
    secret = k8s.CoreV1Api(api).read_namespaced_secret("meshctl-ca-secret", namespace)
    return base64.b64decode(secret.data["ca-cert.pem"])


def remove_published_roots(api: k8s.ApiClient) -> None:
    """The root ConfigMaps a control plane published in every namespace, deleted once it is
    gone (a later control plane on the same cluster mints a root of its own)."""
    core = k8s.CoreV1Api(api)
    for cm in core.list_config_map_for_all_namespaces(
        field_selector="metadata.name=meshctl-ca-root-cert",
        label_selector="app.kubernetes.io/managed-by=meshctl",
    ).items:
        with contextlib.suppress(k8s.ApiException):
            core.delete_namespaced_config_map(cm.metadata.name, cm.metadata.namespace)


# ---------------------------------------------------------------------------------------------
# What a proxy sends


def csr(identity: str, *, sans: Sequence[x509.GeneralName] | None = None) -> tuple[str, bytes]:
    """A ztunnel-style CSR (fresh P-256 key, empty subject, only a URI SAN) and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    names = list(sans) if sans is not None else [x509.UniformResourceIdentifier(identity)]
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=True)
    request = builder.sign(key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return request.public_bytes(serialization.Encoding.PEM).decode(), key_pem


async def create_certificate(
    channel: Any,
    csr_pem: str,
    *,
    ttl: int = 3600,
    impersonate: str | None = None,
    timeout: float = 10.0,
) -> list[str]:
    request = citadel_pb2.IstioCertificateRequest(csr=csr_pem, validity_duration=ttl)
    if impersonate is not None:
        request.metadata.update({"ImpersonatedIdentity": impersonate})
    stub = citadel_pb2_grpc.IstioCertificateServiceStub(channel)
    response = await stub.CreateCertificate(request, timeout=timeout)
    return list(response.cert_chain)


async def status_of(channel: Any, csr_pem: str, **kwargs: Any) -> tuple[str, str]:
    """The gRPC status name and message a refused request ends with ("OK", "" otherwise)."""
    try:
        await create_certificate(channel, csr_pem, **kwargs)
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, exc.details() or ""
    return "OK", ""


def pod_token(
    cluster: KubeCluster,
    namespace: str,
    service_account: str,
    pod: str,
    *,
    audience: str = "istio-ca",
    node: str = "node-a",
    expiration_seconds: int = 3600,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> str:
    """Creates Pod ``pod`` (bound to ``node``, as a scheduler would) running as the account,
    and returns a TokenRequest token bound to it, as the kubelet projects into the pod."""
    with cluster.api_client() as api:
        ensure_service_account(api, namespace, service_account)
        core = k8s.CoreV1Api(api)
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "labels": labels or {}, "annotations": annotations or {}},
            "spec": {
                "serviceAccountName": service_account,
                "nodeName": node,
                "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
            },
        }
        created = core.create_namespaced_pod(namespace, body)
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience],
                "expirationSeconds": expiration_seconds,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod,
                    "uid": created.metadata.uid,
                },
            },
        }
        answer = core.create_namespaced_service_account_token(service_account, namespace, request)
        token: str = answer.status.token
        return token


def expired_token(
    cluster: KubeCluster, namespace: str, service_account: str, audience: str = "istio-ca"
) -> str:
    """A service-account token signed with the API server's issuer key whose ``exp`` passed
    ten minutes ago (TokenRequest cannot mint one: its shortest lifetime is ten minutes)."""
    with cluster.api_client() as api:
        ensure_service_account(api, namespace, service_account)
        account = k8s.CoreV1Api(api).read_namespaced_service_account(service_account, namespace)
    key = serialization.load_pem_private_key(
        (cluster.workdir / "pki" / "sa.key").read_bytes(), None
    )
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    now = int(time.time())
    claims = {
        "aud": [audience],
        "exp": now - 600,
        "iat": now - 4200,
        "nbf": now - 4200,
        "iss": SA_ISSUER,
        "sub": f"system:serviceaccount:{namespace}:{service_account}",
        "kubernetes.io": {
            "namespace": namespace,
            "serviceaccount": {"name": service_account, "uid": account.metadata.uid},
        },
    }

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    public = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    # The API server's key id: base64url(sha256(DER public key)), as kube-apiserver derives it.
    digest = hashes.Hash(hashes.SHA256())
    digest.update(public)
    header = {"alg": "ES256", "kid": b64(digest.finalize())}
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    return f"{signing_input}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"
