"""``meshctl inject`` as a user runs it: files and stdin, -O, --diff, flags, settings, bad input."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from meshctl.cli import main
from tests.harness.cli import run_meshctl as meshctl

DATA = Path(__file__).resolve().parents[1] / "testdata" / "inject"
DEPLOYMENT = DATA / "deployment.yaml"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args", [["inject"], ["inject", "webhook"], ["inject", "webhook-config"]])
def test_help_loads_each_command(args, capsys):
    code, out, _ = run(capsys, *args, "--help")
    assert code == 0
    assert "Usage: meshctl " + " ".join(args) in out


def test_stdin_to_stdout_through_the_console_script():
    result = meshctl("inject", "-f", "-", stdin=DEPLOYMENT.read_text())
    assert result.returncode == 0, result.stderr
    (deployment,) = yaml.safe_load_all(result.stdout)
    init = deployment["spec"]["template"]["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["istio-init", "istio-proxy"]
    assert result.stderr == ""


def test_output_file_is_written_and_round_trips(tmp_path, capsys):
    out_file = tmp_path / "injected.yaml"
    code, out, _ = run(capsys, "inject", "-f", str(DEPLOYMENT), "-O", str(out_file))
    assert code == 0
    assert out == ""
    code, restored, _ = run(capsys, "inject", "--uninject", "-f", str(out_file))
    assert code == 0
    assert yaml.safe_load(restored) == yaml.safe_load(DEPLOYMENT.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["injected.yaml"]  # no temp files left


def test_native_sidecar_flag_false_makes_a_classic_sidecar(capsys):
    code, out, _ = run(capsys, "inject", "-f", str(DEPLOYMENT), "--native-sidecar=false")
    assert code == 0
    spec = yaml.safe_load(out)["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["reviews", "istio-proxy"]


def test_flags_override_the_settings_file_section(tmp_path, capsys):
    settings = tmp_path / "config.yaml"
    settings.write_text("inject:\n  image: from-file:1\n  trust-domain: example.org\n")
    code, out, _ = run(capsys, "--config", str(settings), "inject", "-f", str(DEPLOYMENT))
    assert code == 0
    proxy = yaml.safe_load(out)["spec"]["template"]["spec"]["initContainers"][1]
    assert proxy["image"] == "from-file:1"
    assert {"name": "TRUST_DOMAIN", "value": "example.org"} in proxy["env"]
    code, out, _ = run(
        capsys, "--config", str(settings), "inject", "-f", str(DEPLOYMENT), "--image", "flag:2"
    )
    assert yaml.safe_load(out)["spec"]["template"]["spec"]["initContainers"][1]["image"] == "flag:2"


def test_mesh_wide_defaults_come_from_the_settings_file_and_env(tmp_path, capsys, monkeypatch):
    settings = tmp_path / "config.yaml"
    settings.write_text(
        "inject:\n  network: network1\n  image-pull-secrets: [regcred]\n"
        "  proxy-config:\n    proxyMetadata: {B: b}\n"
    )
    monkeypatch.setenv("MESHCTL_INJECT_INTERCEPTION_MODE", "TPROXY")
    code, out, _ = run(capsys, "--config", str(settings), "inject", "-f", str(DEPLOYMENT))
    assert code == 0
    spec = yaml.safe_load(out)["spec"]["template"]["spec"]
    init, proxy = spec["initContainers"][:2]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert {"name": "ISTIO_META_NETWORK", "value": "network1"} in proxy["env"]
    assert {"name": "B", "value": "b"} in proxy["env"]
    assert init["args"][init["args"].index("-m") + 1] == "TPROXY"


def test_a_bad_mesh_wide_default_names_the_setting(capsys, monkeypatch):
    monkeypatch.setenv("MESHCTL_INJECT_EXCLUDE_IP_RANGES", "bad")
    code, out, err = run(capsys, "inject", "-f", str(DEPLOYMENT))
    assert code == 2
    assert out == ""
    assert "Error: inject setting exclude-ip-ranges: invalid value 'bad'" in err


def test_an_unknown_settings_key_is_a_config_error(tmp_path, capsys):
    settings = tmp_path / "config.yaml"
    settings.write_text("inject:\n  imag: typo\n")
    code, out, err = run(capsys, "--config", str(settings), "inject", "-f", str(DEPLOYMENT))
    assert code == 2
    assert out == ""
    assert "unknown key(s) imag" in err


def test_diff_is_coloured_only_when_asked_or_on_a_terminal(capsys):
    code, plain, _ = run(capsys, "inject", "-f", str(DEPLOYMENT), "--diff")
    assert code == 0
    assert "\x1b[" not in plain  # captured stdout is not a terminal
    assert f"+++ {DEPLOYMENT} (injected)" in plain
    assert "+      - name: istio-proxy\n" in plain
    code, coloured, _ = run(capsys, "inject", "-f", str(DEPLOYMENT), "--diff", "--color=always")
    assert "\x1b[32m+      - name: istio-proxy\x1b[0m" in coloured


def test_diff_of_an_already_injected_file_is_empty(tmp_path, capsys):
    injected = tmp_path / "x.yaml"
    assert run(capsys, "inject", "-f", str(DEPLOYMENT), "-O", str(injected))[0] == 0
    code, out, _ = run(capsys, "inject", "-f", str(injected), "--diff")
    assert (code, out) == (0, "")


BAD_INPUTS = {
    "malformed": (
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n   labels: {}\n",
        r"bad\.yaml: invalid YAML at line 5, column 10: ",
    ),
    "not-a-mapping": ("- just\n- a list\n", r"bad\.yaml:1: expected a Kubernetes object"),
    "no-containers": (
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n"
            "spec:\n  template:\n    spec:\n      containers: []\n"
        ),
        r"bad\.yaml:1: Deployment d: the pod spec has no containers",
    ),
    "bad-annotation": (
        (
            "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n---\n"
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations:\n"
            "    traffic.sidecar.istio.io/excludeInboundPorts: x\n"
            "spec: {containers: [{name: a, image: a}]}\n"
        ),
        (
            r"bad\.yaml:5 \(document 2\): Pod p: invalid value 'x' for annotation "
            r"'traffic\.sidecar\.istio\.io/excludeInboundPorts'"
        ),
    ),
    "unquoted-bool": (
        (
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  labels:\n"
            "    sidecar.istio.io/inject: false\nspec: {containers: [{name: a}]}\n"
        ),
        r"label 'sidecar\.istio\.io/inject' has a bool value, not a string",
    ),
    # A status annotation copied onto a pod nobody injected: stripping would remove the app.
    "status-names-the-app": (
        (
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations:\n"
            '    sidecar.istio.io/status: \'{"containers": ["app"]}\'\n'
            "spec: {containers: [{name: app, image: a}]}\n"
        ),
        r"Pod p: annotation 'sidecar\.istio\.io/status' lists container 'app', which injection",
    ),
    "status-names-a-user-volume": (
        (
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations:\n"
            '    sidecar.istio.io/status: \'{"volumes": ["data"]}\'\n'
            "spec:\n  containers: [{name: app, volumeMounts: [{name: data, mountPath: /d}]}]\n"
            "  volumes: [{name: data, emptyDir: {}}]\n"
        ),
        r"lists volume 'data', which container 'app' mounts",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_1_and_writes_nothing(case, tmp_path):
    text, pattern = BAD_INPUTS[case]
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    target = tmp_path / "out.yaml"
    target.write_text("previous content\n")
    runs = [["-f", "bad.yaml"], ["-f", "bad.yaml", "-O", "out.yaml"]]
    if case.startswith("status-"):
        runs.append(["--uninject", "-f", "bad.yaml", "-O", "out.yaml"])
    for args in runs:
        result = subprocess.run(
            [sys.executable, "-c", "from meshctl.entry import run; run()", "inject", *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            check=False,
        )
        assert result.returncode == 2  # input the user gave cannot be used (docs/cli.md)
        assert result.stdout == ""
        lines = result.stderr.splitlines()
        assert len(lines) == 2, result.stderr
        assert lines[0].startswith("Error: ")
        assert lines[1].startswith("Hint: ")
        assert re.search(pattern, lines[0]), lines[0]
    assert target.read_text() == "previous content\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "out.yaml"]


def test_a_missing_file_is_a_clean_error(capsys):
    code, out, err = run(capsys, "inject", "-f", "/nonexistent/deploy.yaml")
    assert code == 2
    assert out == ""
    assert err.startswith("Error: cannot read /nonexistent/deploy.yaml: No such file")


def test_binary_input_is_a_clean_error(tmp_path, capsys):
    blob = tmp_path / "blob.yaml"
    blob.write_bytes(b"\xff\xfe\x00junk")
    code, out, err = run(capsys, "inject", "-f", str(blob))
    assert (code, out) == (2, "")
    assert "blob.yaml:1: not UTF-8 text" in err


def test_usage_errors_exit_2(capsys):
    assert run(capsys, "inject")[0] == 2
    assert run(capsys, "inject", "-f", str(DEPLOYMENT), "webhook-config")[0] == 2
    assert run(capsys, "inject", "-f", str(DEPLOYMENT), "--native-sidecar=maybe")[0] == 2
    assert run(capsys, "inject", "-f", str(DEPLOYMENT), "--revision", "Not_A_Label")[0] == 2


# --- webhook-config -----------------------------------------------------------------------------

CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"


def test_webhook_config_with_url_and_ca_bundle(tmp_path, capsys):
    ca = tmp_path / "ca.crt"
    ca.write_text(CA_PEM)
    code, out, _ = run(
        capsys,
        "inject",
        "webhook-config",
        "--url",
        "https://127.0.0.1:15017/inject",
        "--ca-bundle",
        str(ca),
        "--reinvocation-policy",
        "IfNeeded",
    )
    assert code == 0
    cfg = yaml.safe_load(out)
    assert cfg["kind"] == "MutatingWebhookConfiguration"
    hook = cfg["webhooks"][0]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]).decode() == CA_PEM
    assert hook["reinvocationPolicy"] == "IfNeeded"


def test_webhook_config_json_for_a_service_and_revision(tmp_path, capsys):
    ca = tmp_path / "ca.crt"
    ca.write_text(CA_PEM)
    code, out, _ = run(
        capsys,
        "inject",
        "webhook-config",
        "--service",
        "meshctl",
        "--ca-bundle",
        str(ca),
        "--revision",
        "canary",
        "-o",
        "json",
    )
    assert code == 0
    cfg = json.loads(out)
    assert cfg["metadata"]["name"] == "meshctl-sidecar-injector-canary"
    assert cfg["webhooks"][0]["clientConfig"]["service"]["name"] == "meshctl"


def test_webhook_config_needs_exactly_one_target(tmp_path, capsys):
    ca = tmp_path / "ca.crt"
    ca.write_text(CA_PEM)
    assert run(capsys, "inject", "webhook-config", "--ca-bundle", str(ca))[0] == 2
    both = ["--url", "https://x/inject", "--service", "s"]
    assert run(capsys, "inject", "webhook-config", "--ca-bundle", str(ca), *both)[0] == 2


def _tls_files(tmp_path):
    from datetime import UTC, datetime, timedelta

    from cryptography.hazmat.primitives import serialization

    from meshctl.core.pki import certs

    now = datetime.now(UTC)
    one = certs.mint_root(trust_domain="td", now=now, ttl=timedelta(days=1))
    two = certs.mint_root(trust_domain="td", now=now, ttl=timedelta(days=1))
    key = serialization.load_pem_private_key(one.key_pem, password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    files = {
        "cert": one.cert_pem,
        "key": one.key_pem,
        "other.key": two.key_pem,
        "encrypted.key": encrypted,
        "junk": b"not a certificate\n",
        "binary": bytes(range(256)),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path


@pytest.mark.parametrize(
    ("cert", "key", "message"),
    [
        ("junk", "key", "TLS certificate file {dir}/junk holds no PEM certificate"),
        ("binary", "key", "TLS certificate file {dir}/binary holds no PEM certificate"),
        ("cert", "junk", "TLS key file {dir}/junk holds no PEM private key"),
        ("cert", "binary", "TLS key file {dir}/binary holds no PEM private key"),
        (
            "cert",
            "encrypted.key",
            "TLS key file {dir}/encrypted.key holds an encrypted private key (give it unencrypted)",
        ),
        (
            "cert",
            "other.key",
            "TLS key file {dir}/other.key and certificate {dir}/cert: the key does not belong",
        ),
    ],
)
def test_webhook_names_the_tls_file_at_fault_in_words(tmp_path, capsys, cert, key, message):
    folder = _tls_files(tmp_path)
    code, _, err = run(
        capsys, "inject", "webhook", "--tls-cert", str(folder / cert), "--tls-key",
        str(folder / key), "--port", "1",
    )  # fmt: skip
    assert code == 2, err
    assert err.startswith("Error: " + message.format(dir=folder)), err
    for internal in ("_ssl.c", "PEM lib", "SSL]"):
        assert internal not in err


def test_webhook_refuses_missing_tls_files_while_parsing(capsys):
    code, _, err = run(
        capsys, "inject", "webhook", "--tls-cert", "/nope.crt", "--tls-key", "/nope.key"
    )
    assert code == 2
    assert "Error: Invalid value for '--tls-cert': '/nope.crt' does not exist" in err


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--port", "70000", "70000 is out of range for a port (1-65535)"),
        ("--reload-interval", "0", "0s is out of range (more than 0s)"),
        ("--drain-seconds", "-1", "-1s is out of range (0s to 1h)"),
        ("--address", "nothost", "'nothost' is not an IP address"),
    ],
)
def test_webhook_rejects_a_bad_listen_flag_before_loading_anything(
    tmp_path, capsys, flag, value, says
):
    garbage = tmp_path / "garbage.pem"  # never loaded: the flag is refused first
    garbage.write_text("not PEM")
    code, out, err = run(
        capsys, "inject", "webhook", "--tls-cert", str(garbage), "--tls-key", str(garbage),
        flag, value,
    )  # fmt: skip
    assert code == 2
    assert out == ""
    assert says in err
    assert flag in err
    assert "Traceback" not in err


def test_an_annotation_without_effect_is_a_warning_on_stderr(tmp_path, capsys):
    source = tmp_path / "p.yaml"
    source.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations:\n"
        "    sidecar.istio.io/bootstrapOverride: custom\n"
        "spec: {containers: [{name: a, image: a}]}\n"
    )
    code, out, err = run(capsys, "inject", "-f", str(source))
    assert code == 0
    assert "istio-proxy" in out
    assert err == (
        f"Warning: {source}:1: Pod p: annotation 'sidecar.istio.io/bootstrapOverride' is not "
        "supported by meshctl and has no effect\n"
    )
