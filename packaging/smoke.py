"""Smoke test of the frozen build and its images.

Usage: python packaging/smoke.py [dist/meshctl] [--tree DIR] [--images DIR]

- the one-file binary and the one-dir tree (default: ``meshctl-tree`` beside the binary): each
  starts, lists its plugins, runs them, and fails cleanly; the tree matches its manifest;
- with ``--images DIR`` (what ``packaging/image/build.py --out DIR`` wrote): each tarball is named
  as images.json says; the meshctl image's config is as built, its layer holds the tree byte for
  byte, and its entrypoint runs from the unpacked layers (as root in a chroot with the image's own
  libraries, as the proxy's user; otherwise the tree's executable directly); the pause and test
  programs run; a rebuild without the cache gives the same digests.

Exits non-zero with one line per failed expectation.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "image"))


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
        problems += check_install(binary, Path(tmp))
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


def check_install(binary: Path, tmp: Path) -> list[str]:
    """install/verify: the components come from entry points in the frozen dist-info."""
    problems = []
    generated = run(binary, "manifest", "generate", "--profile", "demo")
    for kind in ("CustomResourceDefinition", "DaemonSet", "MutatingWebhookConfiguration"):
        if generated.returncode != 0 or f"kind: {kind}" not in generated.stdout:
            problems.append(f"manifest generate: exit {generated.returncode}, no {kind}")
    # No cluster: the failed first check, reported as every check is (exit 3, docs/cli.md).
    unreachable = run(binary, "--kubeconfig", f"{tmp}/none", "verify")
    failed = "can reach the cluster: kubeconfig" in unreachable.stdout
    if unreachable.returncode != 3 or not failed:
        problems.append(f"verify: exit {unreachable.returncode}: {unreachable.stdout[-300:]!r}")
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


def check_tree(tree: Path) -> list[str]:
    """The tree matches its manifest byte for byte, and its executable passes ``check``."""
    from meshctl import tree as trees
    from meshctl.core.tree import MANIFEST_NAME, ManifestError, parse

    try:
        manifest = parse((tree / MANIFEST_NAME).read_bytes())
    except (OSError, ManifestError) as exc:
        return [f"tree {tree}: no valid {MANIFEST_NAME}: {exc}"]
    found = trees.problems(tree, manifest, content=True)
    if found:
        return [f"tree {tree} differs from its manifest: {found[0]} (+{len(found) - 1} more)"]
    return [f"tree: {line}" for line in check(tree / manifest.executable)]


IMAGES = ("meshctl", "pause", "testapp")


def check_images(directory: Path, tree: Path) -> list[str]:
    from meshctl.image import oci

    try:
        index = json.loads((directory / "images.json").read_text())
    except (OSError, ValueError) as exc:
        return [f"images: no readable {directory / 'images.json'}: {exc}"]
    problems: list[str] = []
    for name in IMAGES:
        if name not in index:
            problems.append(f"images: {name} is not in images.json")
            continue
        entry = index[name]
        try:
            image = oci.read_archive(directory / entry["file"])
        except (OSError, ValueError, KeyError) as exc:
            problems.append(f"image {name}: unreadable: {exc}")
            continue
        annotations = image["index"]["manifests"][0].get("annotations", {})
        if annotations.get(oci.NAME_ANNOTATION) != entry["ref"]:
            problems.append(f"image {name}: index names {annotations!r}, not {entry['ref']}")
        if image["docker"][0]["RepoTags"] != [entry["ref"]]:
            problems.append(f"image {name}: manifest.json tags {image['docker'][0]['RepoTags']}")
        if image["digest"] != entry["digest"]:
            problems.append(
                f"image {name}: digest {image['digest']}, images.json {entry['digest']}"
            )
        with tempfile.TemporaryDirectory(prefix=f"smoke-{name}-") as tmp:
            root = Path(tmp)
            root.chmod(0o755)  # the image's "/" (the proxy's user must enter it)
            oci.extract(directory / entry["file"], root)
            checker = {"meshctl": _meshctl_image, "pause": _pause_image, "testapp": _testapp_image}
            problems += [f"image {name}: {p}" for p in checker[name](image, root, tree)]
    problems += _rebuilt_the_same(directory, index)
    return problems


def _meshctl_image(image: dict, root: Path, tree: Path) -> list[str]:
    from meshctl import tree as trees
    from meshctl.core.tree import MANIFEST_NAME, parse

    problems = []
    config = image["config"]["config"]
    expected = {"Entrypoint": ["/usr/local/bin/meshctl"], "User": "1337:1337", "WorkingDir": "/"}
    for key, value in expected.items():
        if config.get(key) != value:
            problems.append(f"config {key} is {config.get(key)!r}, not {value!r}")
    manifest = parse((tree / MANIFEST_NAME).read_bytes())
    found = trees.problems(root / "opt" / "meshctl", manifest, content=True)
    if found:
        problems.append(f"/opt/meshctl is not the tree {tree}: {found[0]}")
    if str((root / "usr/local/bin/meshctl").readlink()) != "/opt/meshctl/meshctl":
        problems.append("/usr/local/bin/meshctl does not link to /opt/meshctl/meshctl")
    if os.geteuid() == 0:
        (root / "proc").mkdir(exist_ok=True)
        for argv in (["--help"], ["version", "-o", "json"], ["iptables", "render"]):
            # The image's own libraries, not the host's: a chroot, /proc in a private mount ns.
            script = (
                'mount -t proc proc "$0/proc" && exec chroot --userspec=1337:1337 "$0" '
                f"/usr/local/bin/meshctl {' '.join(argv)}"
            )
            done = subprocess.run(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(root)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            if done.returncode != 0:
                reason = done.stderr.strip()[:300]
                problems.append(f"entrypoint {' '.join(argv)}: exit {done.returncode}: {reason!r}")
            elif argv[0] == "version" and json.loads(done.stdout).get("frozen") is not True:
                problems.append("entrypoint version: not frozen")
    else:
        done = run(root / "opt" / "meshctl" / "meshctl", "--help")
        if done.returncode != 0:
            problems.append(f"/opt/meshctl/meshctl --help: exit {done.returncode}")
    return problems


def _pause_image(image: dict, root: Path, tree: Path) -> list[str]:
    del tree
    if image["config"]["config"].get("Entrypoint") != ["/pause"]:
        return ["entrypoint is not /pause"]
    shown = run(root / "pause", "-v")
    if shown.returncode != 0 or "pause" not in shown.stdout:
        return [f"/pause -v: exit {shown.returncode}"]
    proc = subprocess.Popen([str(root / "pause")], stderr=subprocess.DEVNULL)
    time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(10)
    return [] if code == 0 else [f"/pause exited {code} on SIGTERM, not 0"]


def _testapp_image(image: dict, root: Path, tree: Path) -> list[str]:
    del tree
    if image["config"]["config"].get("Entrypoint") != ["/usr/local/bin/meshtest"]:
        return ["entrypoint is not /usr/local/bin/meshtest"]
    shown = run(root / "usr" / "local" / "bin" / "meshtest", "version")
    if shown.returncode != 0 or not shown.stdout.startswith("meshtest"):
        return [f"meshtest version: exit {shown.returncode}"]
    if str((root / "bin" / "sh").readlink()) != "/bin/busybox":
        return ["/bin/sh is not busybox"]
    return []


def _rebuilt_the_same(directory: Path, index: dict) -> list[str]:
    """Same inputs, same digest: a rebuild that bypasses the cache must match byte for byte."""
    with tempfile.TemporaryDirectory(prefix="smoke-rebuild-") as tmp:
        done = subprocess.run(
            [sys.executable, str(HERE / "image" / "build.py"), "--out", tmp, "--no-cache", *IMAGES],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            return [f"rebuild without cache failed: {done.stderr.strip()[:300]}"]
        again = json.loads(Path(tmp, "images.json").read_text())
    return [
        f"image {name}: rebuilt as {again[name]['digest']}, was {index[name]['digest']}"
        for name in IMAGES
        if name in index and again[name]["digest"] != index[name]["digest"]
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary", nargs="?", default="dist/meshctl", type=Path)
    parser.add_argument("--tree", type=Path, help="default: meshctl-tree beside the binary")
    parser.add_argument("--images", type=Path, help="the --out dir of packaging/image/build.py")
    args = parser.parse_args()
    binary: Path = args.binary
    tree: Path = args.tree or binary.parent / "meshctl-tree"
    if not binary.is_file():
        print(f"smoke: {binary} does not exist; run bash packaging/build.sh", file=sys.stderr)
        return 1
    problems = check(binary)
    if tree.is_dir():
        problems += check_tree(tree)
    elif args.tree or args.images:
        problems.append(f"no tree at {tree}: run bash packaging/build.sh")
    if args.images:
        problems += check_images(args.images, tree)
    for line in problems:
        print(f"smoke: FAIL {line}", file=sys.stderr)
    if not problems:
        size = binary.stat().st_size / 2**20
        shown = [f"{binary} ({size:.1f} MiB)"]
        if tree.is_dir():
            shown.append(str(tree))
        if args.images:
            shown.append(f"images in {args.images}")
        print(f"smoke: ok {', '.join(shown)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
