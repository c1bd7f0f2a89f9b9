"""``meshctl ztunnel``: help loads the plugin, the data plane stays hidden, certs are usable."""

from __future__ import annotations

from meshctl.core.pki import certs
from meshctl.core.pki.identity import SpiffeId, peer_identity
from tests.harness.cacerts import write_istio_cacerts
from tests.harness.cli import run_meshctl as meshctl


def test_ztunnel_help_lists_run_and_certs_and_the_data_plane_is_hidden():
    result = meshctl("ztunnel", "--help")
    assert result.returncode == 0, result.stderr
    assert "run" in result.stdout
    assert "certs" in result.stdout
    assert meshctl("ztunnel", "run", "--help").returncode == 0
    assert meshctl("ztunnel-dataplane", "--help").returncode == 0  # loads, so imports work
    assert "ztunnel-dataplane" not in meshctl("--help").stdout


def test_the_fork_server_by_hand_is_a_usage_error_with_a_hint():
    for args in ((), ("--control-fd", "x", "ztunnel-dataplane"), ("--control-fd", "999")):
        result = meshctl("fork-server", *args)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("Error: fork-server: "), result.stderr
        assert "Hint: this command is started by a supervisor" in result.stderr
        assert "Traceback" not in result.stderr
    closed = meshctl("fork-server", "--control-fd", "999", "ztunnel-dataplane")
    assert closed.returncode == 2, closed.stderr
    assert "--control-fd 999" in closed.stderr


def test_certs_mints_a_ca_once_and_a_workload_cert_chaining_to_it(tmp_path):
    first = meshctl("ztunnel", "certs", "--out", str(tmp_path / "a"), "--workload", "ns1/a/sa1")
    assert first.returncode == 0, first.stderr
    second = meshctl("ztunnel", "certs", "--out", str(tmp_path / "b"), "--workload", "ns1/b/sa2")
    assert second.returncode == 0, second.stderr
    roots_a = (tmp_path / "a" / certs.ROOT_CERT_FILE).read_bytes()
    assert roots_a == (tmp_path / "b" / certs.ROOT_CERT_FILE).read_bytes()  # the same CA
    assert (tmp_path / "a" / certs.KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "ca" / certs.CA_KEY_FILE).stat().st_mode & 0o777 == 0o600
    chain = (tmp_path / "a" / certs.CERT_CHAIN_FILE).read_bytes()
    leaf = certs.describe(chain)[0]
    assert peer_identity(leaf.uri_sans, trust_domain="cluster.local") == SpiffeId(
        "cluster.local", "ns1", "sa1"
    )
    assert certs.key_matches(chain, (tmp_path / "a" / certs.KEY_FILE).read_bytes())


def test_run_without_a_workload_is_a_usage_error_with_a_hint(tmp_path):
    env = dict.fromkeys(("PROXY_WORKLOAD_INFO", "POD_NAME", "POD_NAMESPACE"), "")
    result = meshctl("ztunnel", "run", "--cert-dir", str(tmp_path), env=env)
    assert result.returncode == 2
    assert "Error: sidecar mode needs the workload it serves" in result.stderr
    assert "Hint: pass --workload" in result.stderr


def test_run_with_missing_certificates_says_how_to_make_them(tmp_path):
    result = meshctl("ztunnel", "run", "--workload", "a/b/c", "--cert-dir", str(tmp_path / "none"))
    assert result.returncode == 2
    assert "cannot read workload certificates" in result.stderr
    assert "meshctl ztunnel certs" in result.stderr


def test_run_rejects_an_unknown_local_config_field_with_its_path(tmp_path):
    meshctl("ztunnel", "certs", "--out", str(tmp_path / "c"), "--workload", "a/b/c")
    config = tmp_path / "local.yaml"
    config.write_text(
        "workloads:\n"
        "  - {uid: x, name: b, namespace: a, workloadIps: [], services: {}, workloadIP: []}\n"
    )
    result = meshctl(
        "ztunnel", "run", "--workload", "a/b/c", "--cert-dir", str(tmp_path / "c"),
        "--local-config", str(config),
    )  # fmt: skip
    assert result.returncode == 2
    assert "workloads[0].workloadIP: unknown field" in result.stderr


def test_run_refuses_a_handshake_timeout_that_is_not_a_positive_duration(tmp_path):
    for value in ("0s", "soon"):
        result = meshctl(
            "ztunnel", "run", "--workload", "a/b/c", "--cert-dir", str(tmp_path),
            "--handshake-timeout", value,
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert "Error: Invalid value for '--handshake-timeout'" in result.stderr
        assert "Hint:" in result.stderr
    result = meshctl(
        "ztunnel", "run", "--workload", "a/b/c", "--cert-dir", str(tmp_path),
        env={"MESHCTL_HANDSHAKE_TIMEOUT": "0s"},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "env MESHCTL_HANDSHAKE_TIMEOUT: invalid value '0s'" in result.stderr
    assert "(more than 0s, at most 5m)" in result.stderr


def _mutual_tls(dir_a, dir_b) -> tuple[str, str]:
    """A TLS 1.3 mutual handshake between two cert dirs (memory BIOs): each side's peer URI SAN."""
    import ssl

    def context(side, folder):
        ctx = ssl.SSLContext(side)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_cert_chain(folder / certs.CERT_CHAIN_FILE, folder / certs.KEY_FILE)
        ctx.load_verify_locations(folder / certs.ROOT_CERT_FILE)
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.check_hostname = False
        return ctx

    bios = [(ssl.MemoryBIO(), ssl.MemoryBIO()) for _ in range(2)]
    client = context(ssl.PROTOCOL_TLS_CLIENT, dir_a).wrap_bio(*bios[0], server_side=False)
    server = context(ssl.PROTOCOL_TLS_SERVER, dir_b).wrap_bio(*bios[1], server_side=True)
    done = set()
    for _ in range(20):
        for name, end in (("client", client), ("server", server)):
            try:
                end.do_handshake()
                done.add(name)
            except ssl.SSLWantReadError:
                pass
        bios[1][0].write(bios[0][1].read())  # client -> server
        bios[0][0].write(bios[1][1].read())  # server -> client
        if done == {"client", "server"}:
            break
    sans = [dict(e.getpeercert()["subjectAltName"])["URI"] for e in (client, server)]
    return sans[0], sans[1]


def test_certs_signs_with_an_istio_rsa_ca_and_the_workloads_trust_each_other(tmp_path):
    ca_dir = write_istio_cacerts(tmp_path / "cacerts")  # RSA root + RSA intermediate
    for name in ("a", "b"):
        done = meshctl(
            "ztunnel", "certs", "--out", str(tmp_path / name), "--workload", f"ns1/{name}/{name}",
            "--ca-dir", str(ca_dir),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "minted" not in done.stderr  # the given CA signed, none was made
    chain = (tmp_path / "a" / certs.CERT_CHAIN_FILE).read_bytes()
    assert len(certs.describe(chain)) == 3  # leaf, intermediate, root: Istio's cert-chain.pem
    assert (tmp_path / "a" / certs.ROOT_CERT_FILE).read_bytes() == (
        ca_dir / "root-cert.pem"
    ).read_bytes()
    seen_by_a, seen_by_b = _mutual_tls(tmp_path / "a", tmp_path / "b")
    assert (seen_by_a, seen_by_b) == (
        "spiffe://cluster.local/ns/ns1/sa/b",
        "spiffe://cluster.local/ns/ns1/sa/a",
    )


def test_certs_refuses_a_ca_it_cannot_sign_with_a_one_line_error(tmp_path):
    ca_dir = write_istio_cacerts(tmp_path / "cacerts")
    (ca_dir / "ca-key.pem").write_bytes(b"-----BEGIN PRIVATE KEY-----\nnope\n")
    done = meshctl(
        "ztunnel", "certs", "--out", str(tmp_path / "a"), "--workload", "a/b/c",
        "--ca-dir", str(ca_dir),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr  # bad input: a usage error
    assert f"Error: the CA in {ca_dir} cannot sign: ca-key.pem is not a PEM private key" in (
        done.stderr
    )
    assert "Hint:" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "a").exists()  # nothing half-written


def test_wait_returns_once_the_proxy_is_ready_and_fails_cleanly_when_it_never_is():
    import http.server
    import threading

    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/healthz/ready" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = str(server.server_address[1])
        assert meshctl("ztunnel", "wait", "--port", port, "--timeout", "5s").returncode == 0
    finally:
        server.shutdown()
        server.server_close()
    result = meshctl("ztunnel", "wait", "--port", port, "--timeout", "1s")
    assert result.returncode == 1
    assert result.stderr.startswith("Error: the proxy was not ready within 1s")


def test_run_refuses_bad_injected_env_before_starting(tmp_path):
    for name, value, message in (
        ("ISTIO_KUBE_APP_PROBERS", "{", "ISTIO_KUBE_APP_PROBERS is not JSON"),
        ("PROXY_CONFIG", '{"concurrency": -1}', "PROXY_CONFIG: concurrency"),
        ("ISTIO_PROMETHEUS_ANNOTATIONS", '{"port": "x"}', "is not a port number"),
    ):
        env = {"PROXY_WORKLOAD_INFO": "ns/a/sa", name: value}
        result = meshctl("ztunnel", "run", "--cert-dir", str(tmp_path), env=env)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr.splitlines()[0]


def test_node_mode_without_a_source_of_pod_certificates_is_a_usage_error(tmp_path):
    env = {"CA_ADDRESS": "", "CA_ADDR": "", "MESHCTL_CA_DIR": ""}
    result = meshctl("ztunnel", "run", "--mode", "node", env=env)
    assert result.returncode == 2
    assert "Error: node mode needs a source of pod certificates" in result.stderr
    assert "--ca-address" in result.stderr
    assert "--ca-dir" in result.stderr
    assert "Traceback" not in result.stderr


def test_node_mode_with_an_unreadable_ca_dir_names_the_directory(tmp_path):
    result = meshctl("ztunnel", "run", "--mode", "shared", "--ca-dir", str(tmp_path / "none"))
    assert result.returncode == 2
    assert f"cannot read the CA in {tmp_path / 'none'}" in result.stderr
    assert "meshctl ztunnel certs" in result.stderr


def test_node_proxy_manifest_is_a_daemonset_with_the_zds_dir_token_and_root():
    import json

    result = meshctl("ztunnel", "manifest", "-o", "json", "--image", "registry.example/m:1")
    assert result.returncode == 0, result.stderr
    items = json.loads(result.stdout)["items"]
    assert [i["kind"] for i in items] == ["Namespace", "ServiceAccount", "DaemonSet"]
    assert items[0]["metadata"]["name"] == "meshctl-system"
    spec = items[2]["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "meshctl-ztunnel"  # the CA's trusted node account
    container = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PROXY_MODE"] == "node"
    assert env["INPOD_UDS"] == "/var/run/ztunnel/ztunnel.sock"
    assert (
        env["CA_ADDRESS"] == env["XDS_ADDRESS"] == ("meshctl-controlplane.meshctl-system.svc:15012")
    )
    caps = container["securityContext"]["capabilities"]
    assert set(caps["add"]) == {"NET_ADMIN", "NET_RAW", "SYS_ADMIN"}
    assert container["securityContext"]["privileged"] is False
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["cni-ztunnel-sock-dir"]["hostPath"]["path"] == "/var/run/ztunnel"
    token = volumes["istio-token"]["projected"]["sources"][0]["serviceAccountToken"]
    assert token["audience"] == "meshctl-ca"
    assert volumes["istiod-ca-cert"]["configMap"]["name"] == "meshctl-ca-root-cert"


def test_unusable_certificate_files_are_named_in_words_not_library_text(tmp_path):
    meshctl("ztunnel", "certs", "--out", str(tmp_path / "w"), "--workload", "a/b/c")
    for name, data, reason in (
        ("key.pem", b"junk\n", "key.pem holds no PEM private key"),
        ("cert-chain.pem", b"junk\n", "cert-chain.pem holds no PEM certificate"),
        ("root-cert.pem", b"junk\n", "root-cert.pem holds no PEM certificate"),
        ("key.pem", b"\x00\xff\xfe", "a file there is not PEM text"),
    ):
        folder = tmp_path / f"bad-{name}-{len(data)}"
        folder.mkdir()
        for source in (tmp_path / "w").iterdir():
            (folder / source.name).write_bytes(source.read_bytes())
        (folder / name).write_bytes(data)
        done = meshctl("ztunnel", "run", "--workload", "a/b/c", "--cert-dir", str(folder))
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"Error: workload certificate in {folder} is unusable: ")
        assert reason in done.stderr
        for internal in ("cryptography.io", "MalformedFraming", "codec", "Traceback"):
            assert internal not in done.stderr
