"""The inconsistencies a new user met (issue #16), one test each, as the user ran them.

Each reproduces the reported behaviour first (they all failed before the shared conventions of
docs/cli.md); the rule behind each is held for every command by test_conventions.py. Shell
completion and ``--version`` are in test_completion.py.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from meshctl.config import GlobalSettings
from tests.harness.cli import MESHCTL, run_meshctl
from tests.harness.inject_webhook import start_webhook, stop_webhook

DATA = Path(__file__).resolve().parents[1] / "testdata" / "inject"
DEPLOYMENT = DATA / "deployment.yaml"
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"


def meshctl(*args: str, cwd: Path | None = None, **kw) -> subprocess.CompletedProcess[str]:
    if cwd is None:
        return run_meshctl(*args, **kw)
    return subprocess.run(
        [*MESHCTL, *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False
    )


def one_error(result: subprocess.CompletedProcess[str]) -> str:
    """The stderr of a clean failure: exactly an Error: and a Hint: line, no traceback."""
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("Error: "), result.stderr
    assert lines[1].startswith("Hint: "), result.stderr
    return result.stderr


# --- -o means one thing ---------------------------------------------------------------------


def test_inject_o_json_prints_json_and_writes_no_file(tmp_path: Path):
    shutil.copy(DEPLOYMENT, tmp_path / "app.yaml")
    result = meshctl("inject", "-f", "app.yaml", "-o", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["kind"] == "Deployment"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.yaml"]  # no file named "json"
    written = meshctl("inject", "-f", "app.yaml", "-O", "out.yaml", cwd=tmp_path)
    assert (written.returncode, written.stdout) == (0, "")
    assert yaml.safe_load((tmp_path / "out.yaml").read_text())["kind"] == "Deployment"


def test_iptables_trace_prints_json_with_output_and_explains_dash_o():
    result = meshctl("iptables", "trace", "--dst", "10.96.0.10:80", "--output", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["verdict"] == "redirected"
    refused = meshctl("iptables", "trace", "--dst", "10.96.0.10:80", "-o", "json")
    assert refused.returncode == 2
    assert "Hint: for the output format use --output json" in one_error(refused)
    helped = re.sub(r"-\s+", "-", " ".join(meshctl("iptables", "trace", "--help").stdout.split()))
    assert "(-o is istio-iptables' flag for excluded outbound ports here)" in helped


def test_webhook_config_and_cni_manifest_print_the_table_they_advertise(tmp_path: Path):
    ca = tmp_path / "ca.crt"
    ca.write_text(CA_PEM)
    config = meshctl(
        "inject", "webhook-config", "--service", "s", "--ca-bundle", str(ca), "-o", "table"
    )
    assert config.returncode == 0, config.stderr
    assert config.stdout.split() == [
        "KIND", "NAME",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io",
        "meshctl-sidecar-injector",
    ]  # fmt: skip
    manifest = meshctl("cni", "manifest", "-o", "table")
    assert manifest.returncode == 0, manifest.stderr
    assert manifest.stdout.splitlines()[0].split() == ["KIND", "NAME", "NAMESPACE"]
    assert "daemonset.apps" in manifest.stdout


# --- options on a group ---------------------------------------------------------------------


def test_revision_given_on_inject_reaches_webhook_config(tmp_path: Path):
    ca = tmp_path / "ca.crt"
    ca.write_text(CA_PEM)
    result = meshctl(
        "inject", "--revision", "canary", "webhook-config", "--url", "https://x:15017/inject",
        "--ca-bundle", str(ca),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    selectors = json.dumps(config["webhooks"])
    assert '"istio.io/rev": "canary"' in selectors or "canary" in selectors
    assert "default" not in json.dumps(config["metadata"])
    refused = meshctl("inject", "--image", "foo/bar:1", "webhook-config", "--service", "s")
    assert refused.returncode == 2
    assert "'meshctl inject webhook-config' does not take it" in one_error(refused)


def test_image_given_on_inject_is_what_the_webhook_serves(tmp_path: Path):
    import http.client

    server = start_webhook(tmp_path, group=("--image", "foo/bar:1"), image=None)
    try:
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u",
                "namespace": "shop",
                "operation": "CREATE",
                "object": {"metadata": {"name": "w"}, "spec": {"containers": [{"name": "w"}]}},
            },
        }
        conn = http.client.HTTPSConnection(
            "127.0.0.1", server.port, context=server.context("http/1.1"), timeout=10
        )
        conn.request(
            "POST", "/inject", body=json.dumps(review), headers={"Content-Type": "application/json"}
        )
        answer = json.loads(conn.getresponse().read())
        conn.close()
    finally:
        stop_webhook(server)
    patch = base64.b64decode(answer["response"]["patch"]).decode()
    assert '"image": "foo/bar:1"' in patch or '"foo/bar:1"' in patch


# --- -n --------------------------------------------------------------------------------------


def test_dash_n_is_a_namespace_wherever_it_exists(tmp_path: Path):
    dry = meshctl("iptables", "apply", "-n")
    assert dry.returncode == 2
    assert "No such option: -n" in one_error(dry)
    manifest = meshctl("cni", "manifest", "-n", "mesh-nodes", "-o", "json")
    items = json.loads(manifest.stdout)["items"]
    assert {i["metadata"].get("namespace", i["metadata"]["name"]) for i in items[:2]} == {
        "mesh-nodes"
    }
    ca = tmp_path / "ca.crt"
    ca.write_text(CA_PEM)
    config = meshctl(
        "inject", "webhook-config", "--service", "s", "-n", "hooks", "--ca-bundle", str(ca)
    )
    service = yaml.safe_load(config.stdout)["webhooks"][0]["clientConfig"]["service"]
    assert service["namespace"] == "hooks"


# --- version --server against a server that does not answer --------------------------------


@contextlib.contextmanager
def silent_api_server(tmp_path: Path) -> Iterator[Path]:
    """A loopback port that accepts TCP and never says a word, and a kubeconfig naming it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        textwrap.dedent(f"""
        apiVersion: v1
        kind: Config
        clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}"}}}}]
        users: [{{name: u, user: {{token: t}}}}]
        contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
        current-context: x
        """)
    )
    try:
        yield kubeconfig
    finally:
        listener.close()


def test_version_server_gives_up_after_the_request_timeout_in_one_line(tmp_path: Path):
    with silent_api_server(tmp_path) as kubeconfig:
        started = time.monotonic()
        result = meshctl(
            "--kubeconfig", str(kubeconfig), "version", "--server", "--request-timeout", "1s",
            "-o", "json",
        )  # fmt: skip
        took = time.monotonic() - started
    assert result.returncode == 1
    assert "did not answer within 1s" in one_error(result)
    assert "Retrying" not in result.stderr
    assert "urllib3" not in result.stderr
    assert json.loads(result.stdout)["meshctl"]  # the client's version, printed first
    assert took < 20  # one attempt: not the four of urllib3's default retries
    assert GlobalSettings().request_timeout == 30.0


# --- help, metavars, env vars, ranges -------------------------------------------------------


def test_help_names_types_and_env_vars():
    render = meshctl("iptables", "render", "--help").stdout
    assert "<str>" not in render
    assert "-p, --envoy-port PORT" in render
    run = " ".join(meshctl("ztunnel", "run", "--help").stdout.split())
    for needle in ("--mark MARK", "[env PACKET_MARK]", "--drain-deadline DURATION"):
        assert needle in run
    assert "[env CONNECTION_TERMINATION_DEADLINE]" in run


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["iptables", "trace", "--dst", "10.0.0.1:80", "--uid", "-1"], "(0-4294967294)"),
        (
            ["inject", "webhook", "--drain-seconds", "-1", "--tls-cert", __file__,
             "--tls-key", __file__],
            "-1s is out of range (0s to 1h)",
        ),
    ],
)  # fmt: skip
def test_negative_values_are_refused_with_the_range(args, says):
    result = meshctl(*args)
    assert result.returncode == 2
    assert says in one_error(result)


# --- ztunnel certs --------------------------------------------------------------------------


def test_certs_with_a_bad_ttl_writes_nothing(tmp_path: Path):
    for ttl in ("soon", "0s", "-1h"):
        result = meshctl(
            "ztunnel", "certs", "--out", str(tmp_path / "w"), "--workload", "a/b/c", "--ttl", ttl
        )
        assert result.returncode == 2, result.stderr
        assert "--ttl" in one_error(result)
    assert list(tmp_path.iterdir()) == []  # no CA minted, no directory made


def test_certs_out_naming_a_file_is_a_usage_error(tmp_path: Path):
    (tmp_path / "afile").write_text("x")
    result = meshctl("ztunnel", "certs", "--out", str(tmp_path / "afile"), "--workload", "a/b/c")
    assert result.returncode == 2
    assert "is a file, not a directory" in one_error(result)


def test_certs_bad_trust_domain_is_told_about_the_trust_domain(tmp_path: Path):
    result = meshctl(
        "ztunnel", "certs", "--out", str(tmp_path / "w"), "--workload", "a/b/c",
        "--trust-domain", "Bad Domain!",
    )  # fmt: skip
    assert result.returncode == 2
    text = one_error(result)
    assert "--trust-domain" in text
    assert "--workload" not in text
    assert list(tmp_path.iterdir()) == []


def test_certs_says_where_it_minted_the_ca(tmp_path: Path):
    result = meshctl("ztunnel", "certs", "--out", str(tmp_path / "w"), "--workload", "a/b/c")
    assert result.returncode == 0, result.stderr
    assert f"minted a development CA for cluster.local in {tmp_path / 'ca'}" in result.stderr
    assert "--ca-dir" in result.stderr


# --- inject webhook messages ----------------------------------------------------------------


def test_webhook_names_the_missing_certificate_and_the_bad_address(tmp_path: Path):
    missing = meshctl("inject", "webhook", "--tls-cert", "/nope", "--tls-key", "/nope")
    assert missing.returncode == 2
    assert "'/nope' does not exist" in one_error(missing)
    assert "None" not in missing.stderr
    bad = meshctl(
        "inject", "webhook", "--address", "nothost", "--tls-cert", __file__, "--tls-key", __file__
    )
    assert bad.returncode == 2
    text = one_error(bad)
    assert "'nothost' is not an IP address" in text
    assert "port" not in text.split("Hint:")[0].lower()


# --- daemons say where they listen and when they are ready -----------------------------------


def _lines_until(stream: Any, needle: str, timeout: float) -> list[str]:
    """Lines read from a process's pipe until one holds ``needle``, or ``timeout`` passed."""
    lines: list[str] = []
    buffered = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not any(needle in line for line in lines):
        ready, _, _ = select.select([stream], [], [], 0.2)
        if not ready:
            continue
        chunk = os.read(stream.fileno(), 65536)
        if not chunk:
            break
        buffered += chunk
        *complete, buffered = buffered.split(b"\n")
        lines += [line.decode(errors="replace") for line in complete]
    return lines


def test_webhook_logs_listening_and_ready_at_the_default_level(tmp_path: Path):
    server = start_webhook(tmp_path)
    try:
        lines = _lines_until(server.process.stderr, " ready", 30)
    finally:
        stop_webhook(server)
    listening = [line for line in lines if "injection webhook listening on" in line]
    ready = [line for line in lines if "injection webhook ready" in line]
    assert len(listening) == 1, lines
    assert f"https://127.0.0.1:{server.port}/inject" in listening[0]
    assert len(ready) == 1, lines


def test_cni_installer_logs_listening_and_ready_at_the_default_level(tmp_path: Path):
    seed = Path(__file__).parents[1] / "golden" / "cni" / "testdata" / "dbnet.conflist"
    (tmp_path / "net.d").mkdir()
    shutil.copy(seed, tmp_path / "net.d" / "dbnet.conflist")
    (tmp_path / "sa").mkdir()
    (tmp_path / "sa" / "token").write_text("t\n")
    (tmp_path / "sa" / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    argv = [
        *MESHCTL, "cni", "install", "--cni-bin-dir", str(tmp_path / "bin"),
        "--cni-conf-dir", str(tmp_path / "net.d"), "--run-dir", str(tmp_path / "run"),
        "--service-account-dir", str(tmp_path / "sa"), "--kube-server", "https://127.0.0.1:6443",
        "--readiness-address", f"127.0.0.1:{port}", "--poll-interval", "0.2",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE)
    try:
        lines = _lines_until(proc.stderr, " ready: ", 30)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    listening = [line for line in lines if "CNI node agent listening on" in line]
    assert len(listening) == 1, lines
    assert f"http://127.0.0.1:{port} (/readyz, /healthz)" in listening[0]
    assert [line for line in lines if "CNI node agent ready: " in line], lines


# --- progress on a terminal, nothing on a pipe ----------------------------------------------


def _many_deployments(path: Path, count: int) -> None:
    doc = yaml.safe_load(DEPLOYMENT.read_text())
    docs = []
    for i in range(count):
        doc["metadata"]["name"] = f"app-{i}"
        docs.append(yaml.safe_dump(doc))
    path.write_text("---\n".join(docs))


def _on_a_terminal(argv: list[str], env: dict[str, str], until: bytes, timeout: float) -> bytes:
    """Run ``argv`` with stdout and stderr on a pseudo-terminal; what it wrote until ``until``
    appeared (then it is stopped) or it exited."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
        env={**os.environ, **env},
    )
    os.close(secondary)
    seen = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and until not in seen:
            ready, _, _ = select.select([primary], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(primary, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        os.close(primary)
    return seen


def test_inject_of_many_objects_shows_progress_on_a_terminal_only(tmp_path: Path):
    manifest = tmp_path / "many.yaml"
    # Enough for a few seconds of work: streaming injects ~2,000-3,000 objects a second, and
    # the bar appears only after a second.
    _many_deployments(manifest, 12_000)
    seen = _on_a_terminal(
        [*MESHCTL, "inject", "-f", str(manifest), "-O", str(tmp_path / "out.yaml")],
        {"TERM": "xterm"},
        until=b"ing ",
        timeout=120,
    )
    assert b"ing " in seen, seen[-500:]  # "reading ...", "injecting ...", "writing"
    assert b"\x1b[" in seen  # a live bar, drawn with terminal controls
    # On a pipe: nothing on stderr, though the run takes well over a second.
    proc = subprocess.Popen(
        [*MESHCTL, "inject", "-f", str(manifest), "-O", str(tmp_path / "out2.yaml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(3)
    finally:
        proc.kill()
        out, err = proc.communicate(timeout=30)
    assert (out, err) == (b"", b"")


# --- printed YAML, the CNI manifest, version --------------------------------------------------


def test_printed_yaml_has_no_anchors_and_kubernetes_key_order():
    result = meshctl("cni", "manifest")
    assert result.returncode == 0, result.stderr
    assert "&id" not in result.stdout
    assert "*id" not in result.stdout
    documents = list(yaml.safe_load_all(result.stdout))
    assert documents[0] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "meshctl-system", "labels": {"app.kubernetes.io/part-of": "meshctl"}},
    }
    for document in documents:
        assert list(document)[:3] == ["apiVersion", "kind", "metadata"]
    assert result.stdout.count("\n---\n") == len(documents) - 1


def test_version_table_lists_only_what_meshctl_depends_on():
    table = meshctl("version").stdout
    assert "click" not in table
    assert "=-" not in table
    assert "not installed" not in table


# --- colour and empty input -------------------------------------------------------------------


def test_no_color_turns_off_the_diff_colour_on_a_terminal():
    argv = [*MESHCTL, "inject", "-f", str(DEPLOYMENT), "--diff"]
    coloured = _on_a_terminal(argv, {"TERM": "xterm"}, until=b"\x00", timeout=60)
    assert b"\x1b[32m+" in coloured
    plain = _on_a_terminal(argv, {"TERM": "xterm", "NO_COLOR": "1"}, until=b"\x00", timeout=60)
    assert b"+      - name: istio-proxy" in plain
    assert b"\x1b[" not in plain


def test_empty_stdin_says_nothing_was_read():
    result = meshctl("inject", "-f", "-", stdin="")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "no Kubernetes object was read from <stdin>" in one_error(result)
    comments = meshctl("inject", "-f", "-", stdin="# only a comment\n---\n")
    assert comments.returncode == 2
