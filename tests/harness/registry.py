"""A real OCI registry for the tests: Debian's ``docker-registry`` (the CNCF distribution server).

``start_registry`` runs one on 127.0.0.1 with a temp config and storage, in one of three shapes:
plain HTTP without auth (what the test node's containerd pulls from), TLS with htpasswd basic
auth, and TLS with token auth (a token server in this process: it checks basic credentials and
signs ES256 JWTs whose ``x5c`` names a certificate in the registry's ``rootcertbundle``; a user
may be given pull-only access). The process dies with the test run, and its storage with the
temp dir. Nothing listens anywhere but loopback.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import http.server
import json
import secrets
import shutil
import threading
import time
import urllib.parse
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from tests.harness.kube import CertificateAuthority, _Child, free_port

REGISTRY_BINARY = "docker-registry"
SERVICE = "meshctl-test-registry"
ISSUER = "meshctl-test-token-issuer"
Auth = Literal["none", "htpasswd", "token"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Registry:
    host: str  # 127.0.0.1:<port>: the registry part of image references
    tls: bool
    ca_file: Path | None
    users: Mapping[str, str] = field(default_factory=dict)  # user -> password
    log: Path

    @property
    def base(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}"


def registry_binary() -> str:
    """The registry's path; skips (fails under CI) when Debian's package is not installed."""
    found = shutil.which(REGISTRY_BINARY)
    if found is None:
        pytest.skip("no docker-registry on PATH: apt-get install docker-registry (.ci/run does)")
    return found


def _bcrypt(password: str) -> str:
    # The registry's htpasswd reader takes bcrypt only; glibc's crypt(3) (libxcrypt) makes it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # deprecated in 3.11, still there; the test venv has no bcrypt package

        # bcrypt is what the registry asks for (S324 means crypt's weak methods, not this one).
        # The cheapest cost (2^4): the registry checks it on every request of the test.
        return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))  # noqa: S324


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenIssuer:
    """Signs registry tokens (distribution's token auth): ES256, the signer in ``x5c``."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def token(self, subject: str, access: list[dict[str, Any]]) -> str:
        der = self.cert.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "ES256", "x5c": [base64.b64encode(der).decode()]}
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "sub": subject,
            "aud": SERVICE,
            "exp": now + 600,
            "nbf": now - 30,
            "iat": now,
            "jti": secrets.token_hex(8),
            "access": access,
        }
        signing_input = (
            f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        )
        r, s = decode_dss_signature(
            self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
        )
        return f"{signing_input}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def _token_handler(
    issuer: TokenIssuer, users: Mapping[str, str], pull_only: frozenset[str], requests: list[str]
) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query)
            requests.append(self.path)
            header = self.headers.get("Authorization", "")
            user = ""
            if header.startswith("Basic "):
                name, _, password = base64.b64decode(header[6:]).decode().partition(":")
                if users.get(name) != password:
                    self._answer(
                        401, {"errors": [{"code": "UNAUTHORIZED", "message": "bad credentials"}]}
                    )
                    return
                user = name
            access = []
            for scope in query.get("scope", []):
                kind, _, rest = scope.partition(":")
                repository, _, actions = rest.rpartition(":")
                granted = [
                    a for a in actions.split(",") if user and (a == "pull" or user not in pull_only)
                ]
                access.append({"type": kind, "name": repository, "actions": granted})
            self._answer(200, {"token": issuer.token(user or "anonymous", access)})

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    return Handler


@contextlib.contextmanager
def start_registry(
    workdir: Path,
    *,
    tls: bool = False,
    auth: Auth = "none",
    users: Mapping[str, str] | None = None,
    pull_only: frozenset[str] = frozenset(),
    token_requests: list[str] | None = None,
) -> Iterator[Registry]:
    """A registry on 127.0.0.1 until the block ends (``tls`` with a CA of its own)."""
    binary = registry_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    users = dict(users or {})
    port = free_port()
    config: dict[str, Any] = {
        "version": 0.1,
        "log": {"level": "info"},  # with the access log: which requests reached it
        "storage": {
            "filesystem": {"rootdirectory": str(workdir / "data")},
            "delete": {"enabled": True},
        },
        "http": {"addr": f"127.0.0.1:{port}", "secret": secrets.token_hex(16)},
    }
    ca_file = None
    with contextlib.ExitStack() as stack:
        if tls:
            ca = CertificateAuthority("meshctl-test-registry-ca")
            serving = ca.issue("127.0.0.1", ip_sans=["127.0.0.1"], server=True)
            cert, key = serving.write(workdir, "serving")
            ca_file = workdir / "ca.crt"
            ca_file.write_bytes(ca.cert_pem)
            config["http"]["tls"] = {"certificate": str(cert), "key": str(key)}
        if auth == "htpasswd":
            htpasswd = workdir / "htpasswd"
            htpasswd.write_text("".join(f"{u}:{_bcrypt(p)}\n" for u, p in users.items()))
            config["auth"] = {"htpasswd": {"realm": SERVICE, "path": str(htpasswd)}}
        elif auth == "token":
            issuer = TokenIssuer()
            bundle = workdir / "token-signer.crt"
            bundle.write_bytes(issuer.cert_pem)
            handler = _token_handler(
                issuer, users, pull_only, token_requests if token_requests is not None else []
            )
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
            thread = threading.Thread(target=server.serve_forever, daemon=True)
            thread.start()
            stack.callback(server.server_close)
            stack.callback(server.shutdown)
            config["auth"] = {
                "token": {
                    "realm": f"http://127.0.0.1:{server.server_address[1]}/token",
                    "service": SERVICE,
                    "issuer": ISSUER,
                    "rootcertbundle": str(bundle),
                }
            }
        config_file = workdir / "config.yml"
        config_file.write_text(json.dumps(config))  # YAML is a superset of JSON
        child = _Child(
            "docker-registry", [binary, "serve", str(config_file)], workdir / "registry.log"
        )
        stack.callback(child.stop, 2.0)
        registry = Registry(
            host=f"127.0.0.1:{port}", tls=tls, ca_file=ca_file, users=users, log=child.log
        )
        _wait_listening(child, port)
        yield registry


@contextlib.contextmanager
def node_pulls_from(registry: Registry, hosts_dir: Path) -> Iterator[None]:
    """The test node's containerd pulls ``registry``'s images over plain HTTP: a hosts.toml for
    it under containerd's registry ``config_path`` (read at each pull), removed afterwards."""
    if registry.tls:
        raise ValueError("the node's registry is the plain-HTTP one")
    directory = hosts_dir / registry.host
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "hosts.toml").write_text(
        f'server = "{registry.base}"\n\n'
        f'[host."{registry.base}"]\n'
        '  capabilities = ["pull", "resolve"]\n'
    )
    try:
        yield
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _wait_listening(child: _Child, port: int, timeout: float = 20.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        child.check_alive()
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"docker-registry did not listen on {port}:\n{child.log_tail()}")


def relabelled(archive: Path, out: Path, label: str) -> str:
    """A copy of the image tarball ``archive`` at ``out`` whose config carries one more label
    (``label``=true): the same layers under a new config and manifest, so a node that imported
    ``archive`` holds the layers but not this image. Returns the new manifest digest."""
    import hashlib
    import io
    import tarfile

    from meshctl.core.image.layout import (
        LAYOUT_DOCUMENT,
        MEDIA_CONFIG,
        MEDIA_MANIFEST,
        Blob,
        canonical,
        manifest_document,
        parse_index,
        parse_manifest,
    )

    def digest(data: bytes) -> str:
        return "sha256:" + hashlib.sha256(data).hexdigest()

    def member(name: str) -> bytes:
        found = source.extractfile(name)
        assert found is not None, name
        return found.read()

    with tarfile.open(archive) as source, tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as dest:
        index = json.loads(member("index.json"))
        manifest_blob, _names = parse_index(member("index.json"))
        config_blob, layers = parse_manifest(member(f"blobs/sha256/{manifest_blob.digest[7:]}"))
        config = json.loads(member(f"blobs/sha256/{config_blob.digest[7:]}"))
        config["config"].setdefault("Labels", {})[label] = "true"
        config_bytes = canonical(config)
        new_config = Blob(MEDIA_CONFIG, digest(config_bytes), len(config_bytes))
        manifest = manifest_document(new_config, layers)
        new_manifest = Blob(MEDIA_MANIFEST, digest(manifest), len(manifest))
        for entry in index["manifests"]:
            entry.update(digest=new_manifest.digest, size=new_manifest.size)

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            dest.addfile(info, io.BytesIO(data))

        for layer in layers:
            name = f"blobs/sha256/{layer.digest[7:]}"
            info = source.getmember(name)
            dest.addfile(info, source.extractfile(info))
        add(f"blobs/sha256/{new_config.digest[7:]}", config_bytes)
        add(f"blobs/sha256/{new_manifest.digest[7:]}", manifest)
        add("index.json", canonical(index))
        add("oci-layout", LAYOUT_DOCUMENT)
    return new_manifest.digest
