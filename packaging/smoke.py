"""Smoke test of the frozen binary: it starts, lists its plugins, runs one, and fails cleanly.

Usage: python packaging/smoke.py [dist/meshctl]. Exits non-zero with a one-line reason on failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def run(binary: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=60, check=False
    )


def check(binary: Path) -> list[str]:
    """Every failed expectation, as one line each."""
    problems: list[str] = []
    helped = run(binary, "--help")
    if helped.returncode != 0 or "version" not in helped.stdout:
        problems.append(
            f"--help: exit {helped.returncode}, 'version' not listed: {helped.stderr!r}"
        )
    shown = run(binary, "version", "-o", "json")
    try:
        data = json.loads(shown.stdout)
    except ValueError:
        problems.append(f"version -o json: not JSON: {shown.stdout[:200]!r} {shown.stderr!r}")
    else:
        if data.get("frozen") is not True:
            problems.append(f"version -o json: frozen is {data.get('frozen')!r}, expected true")
        missing = [k for k, v in data.get("dependencies", {}).items() if not v]
        if missing:
            problems.append(f"version -o json: no version for {', '.join(missing)}")
    problems += check_plugins(binary)
    bad = run(binary, "no-such-command")
    if bad.returncode != 2 or not bad.stderr.startswith("Error: unknown command"):
        problems.append(f"unknown command: exit {bad.returncode}, stderr {bad.stderr!r}")
    if "Traceback" in bad.stderr:
        problems.append("unknown command printed a traceback")
    return problems


POD = """apiVersion: v1
kind: Pod
metadata: {name: smoke, namespace: default}
spec:
  containers: [{name: app, image: app:1}]
"""


def check_plugins(binary: Path) -> list[str]:
    """Each frozen plugin does real work: lazily imported modules must all be in the archive."""
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        pod = Path(tmp) / "pod.yaml"
        pod.write_text(POD)
        injected = run(binary, "inject", "-f", str(pod))
        if injected.returncode != 0 or "name: istio-proxy" not in injected.stdout:
            problems.append(f"inject: exit {injected.returncode}: {injected.stderr.strip()!r}")
        rules = run(binary, "iptables", "render")
        if rules.returncode != 0 or "MESH_OUTPUT" not in rules.stdout:
            problems.append(f"iptables render: exit {rules.returncode}: {rules.stderr.strip()!r}")
        certs = run(
            binary,
            "ztunnel",
            "certs",
            "--out",
            f"{tmp}/w",
            "--ca-dir",
            f"{tmp}/ca",
            "--workload",
            "default/smoke/default",
        )
        if certs.returncode != 0 or not any(Path(tmp, "w").glob("*.pem")):
            problems.append(f"ztunnel certs: exit {certs.returncode}: {certs.stderr.strip()!r}")
        manifest = run(binary, "cni", "manifest")
        if manifest.returncode != 0 or "kind: DaemonSet" not in manifest.stdout:
            problems.append(
                f"cni manifest: exit {manifest.returncode}: {manifest.stderr.strip()!r}"
            )
        plane = run(binary, "controlplane", "manifest")
        if plane.returncode != 0 or "kind: Deployment" not in plane.stdout:
            problems.append(f"controlplane manifest: exit {plane.returncode}: {plane.stderr!r}")
        # Imports the whole control plane (grpc, protobuf, hypercorn) before it needs a cluster.
        nowhere = run(binary, "--kubeconfig", f"{tmp}/none", "controlplane", "run")
        if nowhere.returncode != 2 or "kubeconfig" not in nowhere.stderr:
            problems.append(f"controlplane run: exit {nowhere.returncode}: {nowhere.stderr!r}")
        # Imports the discovery client (grpc, protobuf, meshctl.xds) before it would connect.
        xds = run(
            binary,
            *("ztunnel", "run", "--workload", "default/smoke/default", "--cert-dir", f"{tmp}/w"),
            *("--xds-address", "127.0.0.1:15012", "--xds-root-ca", f"{tmp}/missing.pem"),
        )
        if xds.returncode != 2 or "root certificate" not in xds.stderr:
            problems.append(f"ztunnel run --xds-address: exit {xds.returncode}: {xds.stderr!r}")
        # Node mode: the ZDS client, the in-pod socket adapter and the identities load, and a
        # node proxy without a source of pod certificates is one usage error.
        node = run(binary, "ztunnel", "run", "--mode", "node", "--ca-dir", f"{tmp}/no-ca")
        if node.returncode != 2 or "cannot read the CA" not in node.stderr:
            problems.append(f"ztunnel run --mode node: exit {node.returncode}: {node.stderr!r}")
        ambient = run(binary, "cni", "manifest", "--ambient")
        if ambient.returncode != 0 or "AMBIENT_ENABLED" not in ambient.stdout:
            problems.append(f"cni manifest --ambient: exit {ambient.returncode}")
        problems += check_cni_name(binary, Path(tmp))
        problems += check_completion(binary)
        dataplane = run(binary, "ztunnel-dataplane", "--help")
        if dataplane.returncode != 0 or "--channel-fd" not in dataplane.stdout:
            problems.append(f"ztunnel-dataplane --help: exit {dataplane.returncode}")
    if os.geteuid() == 0:
        problems += check_iptc(binary)
    return problems


def check_completion(binary: Path) -> list[str]:
    """``--version``, the completion script, and an answer to the shell's completion request
    (typer's shell classes and rich's help sanitiser are imported lazily: they must be frozen)."""
    problems: list[str] = []
    version = run(binary, "--version")
    if version.returncode != 0 or not version.stdout.startswith("meshctl "):
        problems.append(f"--version: exit {version.returncode}: {version.stdout!r}")
    script = run(binary, "completion", "bash")
    if script.returncode != 0 or "complete -o default -F _meshctl_completion" not in script.stdout:
        problems.append(f"completion bash: exit {script.returncode}: {script.stderr.strip()!r}")
    for shell, env in (
        ("bash", {"COMP_WORDS": "meshctl ver", "COMP_CWORD": "1"}),
        ("zsh", {"_TYPER_COMPLETE_ARGS": "meshctl ver"}),
        (
            "powershell",
            {"_TYPER_COMPLETE_ARGS": "meshctl ver", "_TYPER_COMPLETE_WORD_TO_COMPLETE": "ver"},
        ),
    ):
        answer = subprocess.run(
            [str(binary)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, **env, "_MESHCTL_COMPLETE": f"complete_{shell}"},
        )
        if answer.returncode != 0 or "version" not in answer.stdout:
            problems.append(
                f"completion request ({shell}): exit {answer.returncode}: "
                f"{answer.stdout[:200]!r} {answer.stderr.strip()[:200]!r}"
            )
    return problems


def check_cni_name(binary: Path, tmp: Path) -> list[str]:
    """Installed as ``meshctl-cni``, the binary answers the container runtime's VERSION call."""
    plugin = tmp / "meshctl-cni"
    plugin.symlink_to(binary.resolve())
    answer = subprocess.run(
        [str(plugin)],
        input='{"cniVersion": "1.0.0", "name": "smoke", "type": "meshctl-cni"}',
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "CNI_COMMAND": "VERSION"},
    )
    try:
        versions = json.loads(answer.stdout)["supportedVersions"]
    except (ValueError, KeyError):
        return [f"meshctl-cni VERSION: exit {answer.returncode}: {answer.stdout[:200]!r}"]
    return [] if "1.1.0" in versions else [f"meshctl-cni VERSION: {versions!r} lacks 1.1.0"]


def check_iptc(binary: Path) -> list[str]:
    """The in-process iptc backend needs python-iptables' ctypes helper inside the bundle."""
    name = f"mt-smoke-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        for verb in ("apply", "check", "clean"):
            done = run(binary, "iptables", verb, "--backend", "iptc", "--netns", name)
            if done.returncode != 0:
                reason = f"exit {done.returncode}: {done.stderr.strip()!r}"
                return [f"iptables {verb} --backend iptc: {reason}"]
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
    return []


def main() -> int:
    binary = Path(sys.argv[1] if len(sys.argv) > 1 else "dist/meshctl")
    if not binary.is_file():
        print(f"smoke: {binary} does not exist; run bash packaging/build.sh", file=sys.stderr)
        return 1
    problems = check(binary)
    for line in problems:
        print(f"smoke: FAIL {line}", file=sys.stderr)
    if not problems:
        size = binary.stat().st_size / 2**20
        print(f"smoke: ok {binary} ({size:.1f} MiB)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
