"""``meshctl controlplane ca``: the CA without Kubernetes, callers from a static token file.

The real command on loopback, called with the proxies' own CA client (``CaClient``): a caller
gets its own SPIFFE identity signed by the root in ``--ca-dir`` (minted there once, reused on the
next start), never another's; unknown tokens and a bad token file get their documented errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography import x509

from meshctl import rpc
from meshctl.core.pki import certs
from meshctl.core.pki.identity import SpiffeId
from meshctl.proxy.ca_client import CaClient
from tests.harness.cli import run_meshctl as meshctl

TOKENS = (
    "tok-client,system:serviceaccount:default:client,u1\n# a comment\ntok-bad,alice,u2\n"
    "tok-node,system:serviceaccount:istio-system:ztunnel,u3\n"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp: Path, port: int, *extra: str) -> subprocess.Popen[str]:
    tokens = tmp / "tokens.csv"
    tokens.write_text(TOKENS)
    argv = [sys.executable, "-m", "meshctl", "controlplane", "ca", "--ca-dir", str(tmp / "ca")]
    argv += ["--tokens", str(tokens), "--grpc-address", f"127.0.0.1:{port}"]
    argv += ["--serving-names", "127.0.0.1", *extra]
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


def _ask(
    port: int, roots: bytes, token: str, identity: SpiffeId, *, impersonate: bool = False
) -> list[str]:
    async def call() -> list[str]:
        client = CaClient(f"127.0.0.1:{port}", auth=rpc.CallAuth(token=token))
        try:
            csr, _key = certs.new_csr(identity)
            return await client.create(
                csr, roots=roots, ttl_seconds=3600, impersonate=identity if impersonate else None
            )
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
        # istiod's opening words; then what judged the token: this CA has no API server.
        assert (
            "UNAUTHENTICATED: request authenticate failure: token refused by"
            in unknown.value.message
        )
        assert "the CA's token file (--tokens): no such token" in unknown.value.message
        assert "TokenReview" not in unknown.value.message
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


def _refusal(port: int, roots: bytes, token: str, identity: SpiffeId, **kw: bool) -> rpc.RpcError:
    with pytest.raises(rpc.RpcError) as refused:
        _ask(port, roots, token, identity, **kw)
    return refused.value


def _san(chain: list[str]) -> list[str]:
    leaf = x509.load_pem_x509_certificate(chain[0].encode())
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return list(san.get_values_for_type(x509.UniformResourceIdentifier))


def test_a_trusted_node_account_impersonates_any_workload_only_with_the_metadata(tmp_path):
    port = _free_port()
    proc = _start(tmp_path, port, "--trusted-node-accounts", "istio-system/ztunnel")
    try:
        roots = (tmp_path / "ca" / "ca-cert.pem").read_bytes()
        server = SpiffeId("cluster.local", "prod", "server")
        chain = _ask(port, roots, "tok-node", server, impersonate=True)
        assert _san(chain) == [str(server)]
        assert chain[-1].encode() == roots
        # Its own identity, as any caller.
        own = SpiffeId("cluster.local", "istio-system", "ztunnel")
        assert _san(_ask(port, roots, "tok-node", own)) == [str(own)]
        # Another identity without ImpersonatedIdentity: refused, saying what to send.
        bare = _refusal(port, roots, "tok-node", server)
        assert bare.code == "PERMISSION_DENIED"
        assert "ImpersonatedIdentity" in bare.message
        # A workload is still only itself, with or without the metadata; with it, the refusal
        # is istiod's (UNAUTHENTICATED, its opening words), then why.
        workload = _refusal(port, roots, "tok-client", server)
        assert workload.code == "PERMISSION_DENIED"
        workload = _refusal(port, roots, "tok-client", server, impersonate=True)
        assert workload.code == "UNAUTHENTICATED"
        assert "UNAUTHENTICATED: request impersonation authentication failure: " in workload.message
        elsewhere = SpiffeId("other.domain", "prod", "server")
        foreign = _refusal(port, roots, "tok-node", elsewhere, impersonate=True)
        assert foreign.code == "UNAUTHENTICATED"
        assert "trust domain" in foreign.message
    finally:
        proc.terminate()
        assert proc.wait(15) == 0


def test_without_the_option_no_account_may_impersonate(tmp_path):
    port = _free_port()
    proc = _start(tmp_path, port)  # not even run's default meshctl-system/meshctl-ztunnel
    try:
        roots = (tmp_path / "ca" / "ca-cert.pem").read_bytes()
        server = SpiffeId("cluster.local", "prod", "server")
        refused = _refusal(port, roots, "tok-node", server, impersonate=True)
        assert refused.code == "UNAUTHENTICATED"
        assert "--trusted-node-accounts" in refused.message
        # The token was good: the hint does not send the user to check it.
        assert refused.hint is not None
        assert "token" not in refused.hint
        own = SpiffeId("cluster.local", "istio-system", "ztunnel")
        self_claimed = _refusal(port, roots, "tok-node", own, impersonate=True)
        assert self_claimed.code == "UNAUTHENTICATED"
        assert "request impersonation authentication failure: " in self_claimed.message
    finally:
        proc.terminate()
        assert proc.wait(15) == 0


def test_a_malformed_trusted_node_account_is_a_usage_error(tmp_path):
    tokens = tmp_path / "tokens.csv"
    tokens.write_text(TOKENS)
    ca_dir = str(tmp_path / "ca")
    args = ("--ca-dir", ca_dir, "--tokens", str(tokens), "--trusted-node-accounts", "ztunnel")
    result = meshctl("controlplane", "ca", *args)
    assert result.returncode == 2
    assert "not NAMESPACE/SERVICE_ACCOUNT" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "ca").exists()


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
    assert not (tmp_path / "ca").exists()  # refused before a root was minted


def _start_plain(tmp: Path, address: str, port: int) -> subprocess.Popen[str]:
    """The CA as docs/controlplane.md's laptop flow starts it: no --serving-names."""
    tokens = tmp / "tokens.csv"
    tokens.write_text(TOKENS)
    argv = [sys.executable, "-m", "meshctl", "controlplane", "ca", "--ca-dir", str(tmp / "ca")]
    argv += ["--tokens", str(tokens), "--grpc-address", address]
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


def _ask_at(dial: str, roots: bytes, identity: SpiffeId) -> list[str]:
    async def call() -> list[str]:
        client = CaClient(dial, auth=rpc.CallAuth(token="tok-client"))
        try:
            csr, _key = certs.new_csr(identity)
            return await client.create(csr, roots=roots, ttl_seconds=3600)
        finally:
            await client.close()

    return asyncio.run(call())


@pytest.mark.parametrize("listen", ["127.0.0.1", ""])  # one address, and every address
def test_the_ca_serves_the_names_it_listens_on_so_the_laptop_flow_verifies(tmp_path, listen):
    port = _free_port()
    proc = _start_plain(tmp_path, f"{listen}:{port}", port)
    try:
        roots = (tmp_path / "ca" / "ca-cert.pem").read_bytes()
        me = SpiffeId("cluster.local", "default", "client")
        for dial in (f"127.0.0.1:{port}", f"localhost:{port}"):
            assert _san(_ask_at(dial, roots, me)) == [str(me)], dial
    finally:
        proc.terminate()
        assert proc.wait(15) == 0
        _, err = proc.communicate()
    # Like every daemon at its default level: one line once listening, one once ready.
    listening = [line for line in err.splitlines() if "CA listening on" in line]
    ready = [line for line in err.splitlines() if "CA ready" in line]
    assert len(listening) == 1, err
    assert f"gRPC (CA) {listen or '0.0.0.0'}:{port}" in listening[0]  # noqa: S104
    assert len(ready) == 1, err
    assert " INFO " in ready[0]
    assert "127.0.0.1" in ready[0]
    assert "localhost" in ready[0]


def test_a_client_that_can_never_verify_the_ca_says_why_once_with_a_hint(tmp_path, caplog):
    import logging

    from meshctl.proxy.ca_client import CaFeed

    port = _free_port()
    proc = _start_plain(tmp_path, f"127.0.0.1:{port}", port)
    token = tmp_path / "token"
    token.write_text("tok-client")
    me = SpiffeId("cluster.local", "default", "client")

    async def scenario() -> CaFeed:
        client = CaClient(
            f"127.0.0.1:{port}", auth=rpc.CallAuth(token_file=token), server_name="ca.example"
        )
        feed = CaFeed(
            client=client,
            identity=me,
            root_file=tmp_path / "ca" / "ca-cert.pem",
            ttl_seconds=3600,
            local_config=None,
        )
        runner = asyncio.ensure_future(feed.run())
        await asyncio.sleep(4)  # several retries (0.5 s doubling)
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        return feed

    try:
        with caplog.at_level(logging.DEBUG, logger="meshctl.proxy.ca_client"):
            feed = asyncio.run(scenario())
    finally:
        proc.terminate()
        proc.wait(15)
    told = [r for r in caplog.records if "hostname verification" in r.getMessage()]
    assert len(told) == 1, [r.getMessage() for r in caplog.records]
    assert told[0].levelname == "ERROR"
    text = told[0].getMessage()
    assert "does not name 'ca.example'" in text
    assert "--serving-names ca.example" in text  # the hint: what to change
    assert "Custom verification check" not in text  # grpc's words are replaced, not repeated
    assert feed.status.last_error.endswith("(hostname verification)")
