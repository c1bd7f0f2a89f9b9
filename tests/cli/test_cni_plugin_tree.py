"""The CNI installer's fast form: a verified one-dir tree on the node, ``meshctl-cni`` a link to it.

In-process installs of synthetic trees (their executable a launcher of this checkout's plugin, so
the installed link really answers the runtime) cover placement, upgrade, crash leftovers, damage,
and cleanup; one test runs the installer daemon with ``--plugin-tree``; one installs the real
frozen tree (``MESHCTL_FROZEN_TREE``) and execs it through the link as a runtime does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from meshctl_plugins.cni.installer import TREES_DIR, Installer, InstallSettings, PluginTree

from meshctl import tree as trees
from meshctl.core.tree import MANIFEST_NAME
from tests.harness.cni import SEED_CONFLIST, NodeAgent, exec_plugin, fake_node
from tests.harness.frozen import frozen_tree
from tests.harness.kube import free_port
from tests.harness.wait import eventually

LAUNCHER = f"#!/bin/sh\nexec '{sys.executable}' -m meshctl cni-plugin \"$@\"\n"


def make_tree(where: Path, version: str, payload: bytes = b"") -> PluginTree:
    """A one-dir tree whose executable runs this checkout's CNI plugin."""
    (where / "_internal").mkdir(parents=True)
    (where / "meshctl").write_text(LAUNCHER)
    (where / "meshctl").chmod(0o755)
    (where / "_internal" / "lib.so").write_bytes(payload or os.urandom(50_000))
    manifest = trees.scan(where, executable="meshctl", version=version)
    (where / MANIFEST_NAME).write_bytes(manifest.render())
    return PluginTree(where, manifest)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    return fake_node(tmp_path)


def settings(node: Path, tree_check_interval: float = 30.0) -> InstallSettings:
    return InstallSettings(
        cni_bin_dir=str(node / "bin"),
        cni_conf_dir=str(node / "net.d"),
        run_dir=str(node / "run"),
        service_account_dir=str(node / "sa"),
        kube_server="https://127.0.0.1:6443",
        tree_check_interval=tree_check_interval,
    )


def answers_version(plugin: Path) -> bool:
    try:
        result = exec_plugin(plugin, "VERSION", {"cniVersion": "1.0.0"}, pod=None)
    except OSError:  # not there (yet)
        return False
    return result.returncode == 0 and "1.1.0" in result.json["supportedVersions"]


def trees_on(node: Path) -> list[str]:
    return sorted(p.name for p in (node / "bin" / TREES_DIR).iterdir())


def test_the_plugin_is_a_link_into_a_verified_tree_and_answers_the_runtime(node, tmp_path):
    tree = make_tree(tmp_path / "v1", "1.0")
    installer = Installer(settings(node), tree=tree)
    assert installer.status().ready is False
    changed = installer.install()
    assert changed[0] == f"binary {node / 'bin' / 'meshctl-cni'}"
    link = node / "bin" / "meshctl-cni"
    assert link.readlink() == Path(TREES_DIR, tree.manifest.name, "meshctl")  # relative
    assert trees.problems(link.resolve().parent, tree.manifest, content=True) == []
    assert installer.status().ready, installer.status().reason
    assert installer.install() == []  # nothing to do the second time
    assert answers_version(link)


def test_an_upgrade_switches_the_link_to_a_complete_tree_and_keeps_only_the_previous(
    node, tmp_path
):
    names = []
    for version in ("1.0", "2.0", "3.0"):
        tree = make_tree(tmp_path / version, version)
        Installer(settings(node), tree=tree).install()
        names.append(tree.manifest.name)
        assert (node / "bin" / "meshctl-cni").readlink().parts[1] == tree.manifest.name
        assert answers_version(node / "bin" / "meshctl-cni")
    # The tree a plugin started from a moment ago may still be loading: it stays until the next.
    assert trees_on(node) == sorted(names[1:])


def test_a_crash_mid_copy_or_before_the_switch_leaves_a_working_plugin(node, tmp_path):
    old = make_tree(tmp_path / "old", "1.0")
    new = make_tree(tmp_path / "new", "2.0")
    Installer(settings(node), tree=old).install()
    link = node / "bin" / "meshctl-cni"
    # A dead installer's half-written copy, and a complete copy it never switched to.
    partial = node / "bin" / TREES_DIR / f".tmp-{new.manifest.name}-4242"
    partial.mkdir()
    (partial / "meshctl").write_text("#!/bin/sh\nexit 1\n")
    stale = time.time() - 3600
    os.utime(partial, (stale, stale))
    trees.place(new.root, new.manifest, node / "bin" / TREES_DIR)
    assert link.readlink().parts[1] == old.manifest.name
    assert answers_version(link)
    assert Installer(settings(node), tree=old).status().ready  # still whole, still ours
    Installer(settings(node), tree=new).install()
    assert link.readlink().parts[1] == new.manifest.name
    assert trees_on(node) == sorted([old.manifest.name, new.manifest.name])  # leftover gone


def test_a_damaged_tree_is_reported_and_repaired(node, tmp_path):
    tree = make_tree(tmp_path / "v1", "1.0")
    installer = Installer(settings(node), tree=tree)
    installer.install()
    installed = node / "bin" / TREES_DIR / tree.manifest.name
    (installed / "_internal" / "lib.so").unlink()
    # Each poll checks the link and the executable; every file only each tree_check_interval.
    assert installer.status().ready
    (installed / "meshctl").unlink()
    assert installer.status().reason.endswith("meshctl is missing")
    installer.install()
    assert installer.status().ready
    assert trees.problems(installed, tree.manifest, content=True) == []
    (installed / "_internal" / "lib.so").unlink()
    sweeping = Installer(settings(node, tree_check_interval=1e-6), tree=tree)
    status = sweeping.status()
    assert not status.ready
    assert status.reason.endswith("_internal/lib.so is missing")
    sweeping.install()
    assert sweeping.status().ready
    assert trees.problems(installed, tree.manifest, content=True) == []


def test_a_binary_from_an_older_installer_is_replaced_by_the_link(node, tmp_path):
    Installer(settings(node), binary=LAUNCHER.encode()).install()
    assert not (node / "bin" / "meshctl-cni").is_symlink()
    tree = make_tree(tmp_path / "v1", "1.0")
    Installer(settings(node), tree=tree).install()
    assert (node / "bin" / "meshctl-cni").is_symlink()
    assert answers_version(node / "bin" / "meshctl-cni")


def test_cleanup_leaves_a_newer_installers_plugin_and_uninstall_removes_all(node, tmp_path):
    old = Installer(settings(node), tree=make_tree(tmp_path / "old", "1.0"))
    new_tree = make_tree(tmp_path / "new", "2.0")
    old.install()
    Installer(settings(node), tree=new_tree).install()
    old.cleanup()  # the old DaemonSet pod stops after the new one started
    link = node / "bin" / "meshctl-cni"
    assert link.readlink().parts[1] == new_tree.manifest.name
    assert trees_on(node) == [new_tree.manifest.name]
    Installer(settings(node), binary=b"").cleanup(everything=True)  # meshctl cni uninstall
    assert not link.is_symlink()
    assert not (node / "bin" / TREES_DIR).exists()
    assert (node / "net.d" / "dbnet.conflist").read_bytes() == SEED_CONFLIST.read_bytes()


def test_the_installer_daemon_installs_plugin_tree_repairs_it_and_removes_it_on_sigterm(
    node, tmp_path
):
    tree = make_tree(tmp_path / "v1", "1.0")
    port = free_port()
    argv = [
        sys.executable, "-m", "meshctl", "--log-level", "info", "cni", "install",
        "--cni-bin-dir", str(node / "bin"), "--cni-conf-dir", str(node / "net.d"),
        "--run-dir", str(node / "run"), "--service-account-dir", str(node / "sa"),
        "--kube-server", "https://127.0.0.1:6443", "--plugin-tree", str(tree.root),
        "--readiness-address", f"127.0.0.1:{port}", "--poll-interval", "0.2",
    ]  # fmt: skip
    env = {**os.environ, "MESHCTL_CNI_TREE_CHECK_INTERVAL": "0.2"}
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    link = node / "bin" / "meshctl-cni"
    installed = node / "bin" / TREES_DIR / tree.manifest.name
    try:
        eventually("tree installed", lambda: answers_version(link) or proc.poll() is not None, 30)
        assert proc.poll() is None
        (installed / "_internal" / "lib.so").write_bytes(b"short")  # damaged behind our back
        lib = installed / "_internal" / "lib.so"

        def repaired() -> bool:
            try:
                return lib.stat().st_size > 5
            except FileNotFoundError:  # the repaired copy is being renamed into place
                return False

        eventually("tree repaired", repaired)
        assert trees.problems(installed, tree.manifest, content=True) == []
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        stderr = proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "repaired (the plugin tree" in stderr
    assert not link.is_symlink()
    assert not (node / "bin" / TREES_DIR).exists()
    assert (node / "net.d" / "dbnet.conflist").read_bytes() == SEED_CONFLIST.read_bytes()


@pytest.mark.parametrize(
    ("problem", "says"),
    [("missing", "cannot read meshctl-tree.json"), ("garbage", "malformed tree manifest")],
)
def test_a_bad_plugin_tree_is_a_usage_error_before_anything_is_touched(node, problem, says):
    bad = node / "bad-tree"
    bad.mkdir()
    if problem == "garbage":
        (bad / MANIFEST_NAME).write_text("{")
    argv = [
        sys.executable, "-m", "meshctl", "cni", "install", "--plugin-tree", str(bad),
        "--cni-bin-dir", str(node / "bin"), "--cni-conf-dir", str(node / "net.d"),
        "--kube-server", "https://127.0.0.1:6443",
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"Error: --plugin-tree {bad}: ")
    assert says in result.stderr
    assert "Traceback" not in result.stderr
    assert not (node / "bin").exists()


@pytest.mark.packaging
def test_the_frozen_tree_installed_by_link_answers_the_runtime(node):
    tree = frozen_tree()
    installer = Installer(
        settings(node), tree=PluginTree(tree, trees.parse((tree / MANIFEST_NAME).read_bytes()))
    )
    installer.install()
    link = node / "bin" / "meshctl-cni"
    # The tree's own launcher (packaging/cni/launcher.c), not the PyInstaller executable.
    assert link.readlink().name == "meshctl-cni"
    assert answers_version(link)
    # ADD for a pod of an excluded namespace: the whole request path, through the agent's
    # endpoint (this checkout's), no API server needed.
    conf = {
        "cniVersion": "1.0.0",
        "name": "test-net",
        "type": "meshctl-cni",
        "run_dir": str(node / "run"),
        "exclude_namespaces": ["kube-system"],
        "prevResult": {"cniVersion": "1.0.0", "interfaces": [], "ips": []},
    }
    with NodeAgent(node / "run"):
        result = exec_plugin(link, "ADD", conf, netns="/proc/self/ns/net", pod=("kube-system", "p"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.json == conf["prevResult"]
    # Without the agent: fail closed, from the tree's launcher too.
    gone = exec_plugin(
        link, "ADD", conf, netns="/proc/self/ns/net", pod=("kube-system", "p"),
        env={"MESHCTL_CNI_AGENT_WAIT": "0.3"},
    )  # fmt: skip
    assert (gone.returncode, gone.json["code"]) == (1, 104), gone.stdout + gone.stderr


def test_a_tree_with_its_own_cni_launcher_is_linked_to_it(node, tmp_path):
    root = tmp_path / "v2"
    (root / "_internal").mkdir(parents=True)
    for name in ("meshctl", "meshctl-cni"):
        (root / name).write_text(LAUNCHER)
        (root / name).chmod(0o755)
    manifest = trees.scan(root, executable="meshctl", version="2.0")
    (root / MANIFEST_NAME).write_bytes(manifest.render())
    Installer(settings(node), tree=PluginTree(root, manifest)).install()
    link = node / "bin" / "meshctl-cni"
    assert link.readlink() == Path(TREES_DIR, manifest.name, "meshctl-cni")
    assert answers_version(link)
