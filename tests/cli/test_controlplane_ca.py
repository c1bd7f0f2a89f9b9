"""``meshctl controlplane ca``: the CA without Kubernetes, callers from a static token file.

The real command on loopback, called with the proxies' own CA client (``CaClient``): a caller
gets its own SPIFFE identity signed by the root in ``--ca-dir`` (minted there once, reused on the
next start), never another's; unknown tokens and a bad token file get their documented errors.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography import x509
from meshctl_plugins.ztunnel.caclient import CaClient

from meshctl import rpc
from meshctl.core import certs
from meshctl.core.identity import SpiffeId
from tests.harness.cli import run_meshctl as meshctl

TOKENS = "tok-client,system:serviceaccount:default:client,u1\n# a comment\ntok-bad,alice,u2\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp: Path, port: int) -> subprocess.Popen[str]:
    tokens = tmp / "tokens.csv"
    tokens.write_text(TOKENS)
    argv = [sys.executable, "-m", "meshctl", "controlplane", "ca", "--ca-dir", str(tmp / "ca")]
    argv += ["--tokens", str(tokens), "--grpc-address", f"127.0.0.1:{port}"]
    argv += ["--serving-names", "127.0.0.1"]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the CA did not listen")


def _ask(port: int, roots: bytes, token: str, identity: SpiffeId) -> list[str]:
    async def call() -> list[str]:
        client = CaClient(f"127.0.0.1:{port}", auth=rpc.CallAuth(token=token))
        try:
            csr, _key = certs.new_csr(identity)
            return await client.create(csr, roots=roots, ttl_seconds=3600)
        finally:
            await client.close()

    return asyncio.run(call())


def test_a_caller_gets_its_own_identity_from_the_root_in_the_folder(tmp_path):
    port = _free_port()
    proc = _start(tmp_path, port)
    try:
        roots = (tmp_path / "ca" / "ca-cert.pem").read_bytes()
        me = SpiffeId("cluster.local", "default", "client")
        chain = _ask(port, roots, "tok-client", me)
        leaf = x509.load_pem_x509_certificate(chain[0].encode())
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.UniformResourceIdentifier) == [str(me)]
        assert chain[-1].encode() == roots
        with pytest.raises(rpc.RpcError) as other:
            _ask(port, roots, "tok-client", SpiffeId("cluster.local", "prod", "server"))
        assert other.value.code == "PERMISSION_DENIED"
        with pytest.raises(rpc.RpcError) as unknown:
            _ask(port, roots, "nope", me)
        assert unknown.value.code == "UNAUTHENTICATED"
        assert "token file" in unknown.value.message
        with pytest.raises(rpc.RpcError) as not_sa:
            _ask(port, roots, "tok-bad", me)
        assert not_sa.value.code == "UNAUTHENTICATED"
    finally:
        proc.terminate()
        assert proc.wait(15) == 0
    # The next start signs with the same root (minted once, create-only).
    proc = _start(tmp_path, port)
    try:
        chain = _ask(port, roots, "tok-client", SpiffeId("cluster.local", "default", "client"))
        assert chain[-1].encode() == roots
    finally:
        proc.terminate()
        proc.wait(15)


def test_a_bad_token_file_is_refused_with_its_line(tmp_path):
    tokens = tmp_path / "tokens.csv"
    tokens.write_text("ok,system:serviceaccount:a:b,u\nonly-a-token\n")
    result = meshctl(
        "controlplane",
        "ca",
        "--ca-dir",
        str(tmp_path / "ca"),
        "--tokens",
        str(tokens),
        "--grpc-address",
        f"127.0.0.1:{_free_port()}",
    )
    assert result.returncode == 2
    assert result.stderr.startswith(f"Error: {tokens}:2: expected token,user,uid")
    assert "Traceback" not in result.stderr
