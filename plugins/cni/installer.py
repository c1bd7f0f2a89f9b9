"""The node installer's file work: plugin binary, plugin kubeconfig, our entry in the CNI config.

Decisions come from ``meshctl.core.k8s.cni.netconf``; this module reads and writes files only.
Invariants:
- Every write is atomic (temp file in the same directory, fsync, rename), so a runtime never
  reads a half-written config or executes a half-copied binary; a config keeps its file mode.
- Run from the image (the frozen one-dir tree), the plugin installed is a verified copy of that
  tree in ``<cni_bin_dir>/.meshctl-cni/<version>-<digest>/`` and ``meshctl-cni`` is a relative
  symlink to its executable: it starts without unpacking itself. A new tree is copied and checked
  beside the old one, then the symlink is replaced by rename; only then are older trees removed
  (the previous one stays, a plugin started from it a moment ago may still be loading). A crash
  at any point leaves ``meshctl-cni`` pointing at a complete tree.
- ``install`` is idempotent: when everything is in place it writes nothing.
- The original of the config we merged into is kept in ``<run_dir>/conf-backup.json`` before the
  merged file is written, so ``cleanup`` (SIGTERM, ``meshctl cni uninstall``, or a later installer
  after a crash) gives the node its config back byte for byte.
- The service-account token is never logged.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import stat
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypedDict

from meshctl import tree as trees
from meshctl import values
from meshctl.config import setting
from meshctl.core.k8s import layout
from meshctl.core.k8s.cni import netconf
from meshctl.core.k8s.cni.spec import (
    DEFAULT_EXCLUDED_NAMESPACES,
    DEFAULT_RUN_DIR,
    KUBECONFIG_NAME,
    PLUGIN_TYPE,
)
from meshctl.core.tree import MANIFEST_NAME, Manifest, ManifestError
from meshctl.core.tree import parse as parse_manifest
from meshctl.core.wire import zds
from meshctl.errors import ConfigError, MeshctlError
from meshctl.structured import Json

log = logging.getLogger(__name__)

BACKUP_NAME = "conf-backup.json"
TREES_DIR = f".{PLUGIN_TYPE}"  # in the CNI bin dir: the verified one-dir trees
STALE_TEMP = 600.0  # seconds: an older temp copy is a dead installer's leftover
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
CLIENT_MODULE = "meshctl_plugins.cni_plugin.client"


@dataclass(frozen=True, slots=True, kw_only=True)
class InstallSettings:
    """Where the node's CNI files live and how the plugin is configured (Istio's env names)."""

    # The DaemonSet mounts the host's CNI dirs here (meshctl.core.k8s.layout.HOST_MOUNT).
    cni_bin_dir: str = setting(
        layout.mounted(layout.HOST_CNI_BIN_DIR), env="CNI_BIN_DIR", flag="--cni-bin-dir"
    )
    cni_conf_dir: str = setting(
        layout.mounted(layout.HOST_CNI_CONF_DIR),
        env=("MOUNTED_CNI_NET_DIR", "CNI_NET_DIR"),
        flag="--cni-conf-dir",
    )
    # Empty: the lexically first valid file, as the runtime picks it.
    cni_conf_name: str = setting("", env="CNI_CONF_NAME", flag="--cni-conf-name")
    # Same path on the host and in the installer's container: the plugin reads it on the host.
    run_dir: str = setting(DEFAULT_RUN_DIR, env="CNI_AGENT_RUN_DIR", flag="--run-dir")
    service_account_dir: str = setting(
        SA_DIR, env="MESHCTL_CNI_SERVICE_ACCOUNT_DIR", flag="--service-account-dir"
    )
    kube_server: str = setting("", env="MESHCTL_CNI_KUBE_SERVER", flag="--kube-server")
    kubernetes_service_host: str = setting("", env="KUBERNETES_SERVICE_HOST")
    kubernetes_service_port: str = setting("443", env="KUBERNETES_SERVICE_PORT")
    kube_ca_file: str = setting("", env="KUBE_CA_FILE", flag="--kube-ca-file")
    skip_tls_verify: bool = setting(False, env="SKIP_TLS_VERIFY", flag="--skip-tls-verify")
    exclude_namespaces: tuple[str, ...] = setting(
        DEFAULT_EXCLUDED_NAMESPACES, env="EXCLUDE_NAMESPACES", flag="--exclude-namespaces"
    )
    plugin_log_level: str = setting(
        "info", env="PLUGIN_LOG_LEVEL", choices=("debug", "info", "warning", "error")
    )
    iptables_backend: str = setting(
        "iptc",
        env="MESHCTL_CNI_IPTABLES_BACKEND",
        flag="--iptables-backend",
        choices=("auto", "nft", "legacy", "iptc"),
    )
    pod_lookup_timeout: float = setting(
        5.0,
        env="MESHCTL_CNI_POD_LOOKUP_TIMEOUT",
        parse=values.Duration(positive=True, maximum=60),
        hint="give a duration, e.g. 5s",
    )
    readiness_address: str = setting(
        "0.0.0.0:8000",
        env="MESHCTL_CNI_READINESS_ADDRESS",
        flag="--readiness-address",
        parse=values.ListenAddress(empty_ok=True),
        hint="give HOST:PORT, e.g. :8000 or 0.0.0.0:8000 ('' turns readiness off)",
    )
    poll_interval: float = setting(
        0.5,
        env="MESHCTL_CNI_POLL_INTERVAL",
        flag="--poll-interval",
        parse=values.Duration(positive=True, maximum=3600),
        hint=f"give a duration, {values.DURATION_EXAMPLES}",
    )
    # A one-dir tree (its manifest beside the executable) to install as the plugin; empty: the
    # tree this binary runs from when it runs from one (the image), else the binary itself.
    plugin_tree: str = setting("", env="MESHCTL_CNI_PLUGIN_TREE", flag="--plugin-tree")
    # Every poll checks the link and the tree's executable; every file of the tree (a few
    # thousand lstat calls) only this often.
    tree_check_interval: float = setting(
        30.0,
        env="MESHCTL_CNI_TREE_CHECK_INTERVAL",
        parse=values.Duration(positive=True, maximum=3600),
        hint=f"give a duration, {values.DURATION_EXAMPLES}",
    )
    # Ambient mode (Istio's istio-cni node agent): enroll this node's pods for the node proxy.
    ambient: bool = setting(False, env="AMBIENT_ENABLED", flag="--ambient")
    ztunnel_socket: str = setting(
        zds.DEFAULT_SOCKET, env="ZTUNNEL_UDS_ADDRESS", flag="--ztunnel-socket"
    )
    node_name: str = setting("", env="NODE_NAME", flag="--node-name")
    ambient_dns_capture: bool = setting(False, env="AMBIENT_DNS_CAPTURE")
    # No API server (a laptop, a VM): the node's Pods and Namespaces from this file, a v1 List,
    # for the agent and the plugin alike; no kubeconfig is written then.
    local_inventory: str = setting("", env="MESHCTL_CNI_LOCAL_INVENTORY", flag="--local-inventory")
    ambient_ipv6: bool = setting(False, env="AMBIENT_IPV6")
    # Where the runtime's pod netns files appear in this container (the DaemonSet mounts the
    # host's components.cni.netnsDir here): named in the error when a netns lies elsewhere.
    netns_dir: str = setting("", env="MESHCTL_CNI_NETNS_DIR")
    # This agent's own pod (the downward API; Istio's names): on SIGTERM its DaemonSet tells an
    # uninstall (gone or being deleted: release every pod) from an upgrade (keep them).
    pod_name: str = setting("", env="POD_NAME")
    pod_namespace: str = setting("", env="POD_NAMESPACE")
    release_on_exit: str = setting(
        "auto",
        env="MESHCTL_CNI_RELEASE_ON_EXIT",
        choices=("auto", "always", "never"),
    )

    @property
    def server(self) -> str:
        if self.kube_server:
            return self.kube_server
        host = self.kubernetes_service_host
        if not host:
            raise ConfigError(
                "no API server address: KUBERNETES_SERVICE_HOST is not set",
                hint="run in a pod, or pass --kube-server https://HOST:PORT",
            )
        return f"https://{f'[{host}]' if ':' in host else host}:{self.kubernetes_service_port}"

    @property
    def kubeconfig_path(self) -> Path:
        return Path(self.run_dir) / KUBECONFIG_NAME

    @property
    def binary_path(self) -> Path:
        return Path(self.cni_bin_dir) / PLUGIN_TYPE

    def entry(self) -> dict[str, Json]:
        """Our plugin's entry in the node's conflist (its keys: ``meshctl.core.k8s.cni.spec``)."""
        return {
            "type": PLUGIN_TYPE,
            "run_dir": self.run_dir,
            **(
                {"local_inventory": self.local_inventory}
                if self.local_inventory
                else {"kubeconfig": str(self.kubeconfig_path)}
            ),
            "exclude_namespaces": list(self.exclude_namespaces),
            "log_level": self.plugin_log_level,
            "iptables_backend": self.iptables_backend,
            "pod_lookup_timeout": self.pod_lookup_timeout,
            **({"ambient_enabled": True} if self.ambient else {}),
        }


def plugin_binary(run_dir: str = DEFAULT_RUN_DIR) -> bytes:
    """What to install as ``meshctl-cni`` when not from a tree.

    Frozen (the one-file binary): this very executable, copied as-is (it dispatches on its name,
    see meshctl/entry.py; it unpacks itself at every start, so the image's tree is the fast form).
    Unfrozen (development, tests): the thin client itself as a script run by this interpreter
    as ``python -I -S`` (isolated, no site: nothing but the standard library's built-ins), with
    ``run_dir`` as its default (where it finds the agent when a config names none)."""
    if getattr(sys, "frozen", False):
        return Path(sys.executable).read_bytes()
    import importlib.util

    # Its source is data here (copied, never imported: plugins do not import each other).
    spec = importlib.util.find_spec(CLIENT_MODULE)
    if spec is None or spec.origin is None:
        raise MeshctlError(f"no CNI plugin client: {CLIENT_MODULE} is missing", hint="reinstall")
    source = Path(spec.origin).read_text(encoding="utf-8")
    default = f'DEFAULT_RUN_DIR = "{DEFAULT_RUN_DIR}"\n'
    if source.count(default) != 1:
        raise MeshctlError(f"{spec.origin} does not define {default.strip()}", hint="reinstall")
    source = source.replace(default, f"DEFAULT_RUN_DIR = {run_dir!r}\n")
    # One interpreter argument at most on a #! line (Linux passes the rest as one): -IS.
    return (
        f"#!{sys.executable} -IS\n"
        "# meshctl-cni, written by 'meshctl cni install' for an unfrozen meshctl: the thin client\n"
        "# (meshctl_plugins/cni_plugin/client.py) that hands each request to the node agent.\n"
        f"{source}"
    ).encode()


@dataclass(frozen=True, slots=True)
class PluginTree:
    """The one-dir tree this installer runs from, to be placed on the node as the plugin."""

    root: Path
    manifest: Manifest

    @property
    def link_target(self) -> str:
        """What ``meshctl-cni`` points to: relative, so it resolves on the host and in here.

        The tree's own ``meshctl-cni`` launcher (packaging/cni/launcher.c: the thin client in the
        tree's Python, no PyInstaller bootloader) when it has one, else its executable."""
        names = {f.path for f in self.manifest.files}
        target = PLUGIN_TYPE if PLUGIN_TYPE in names else self.manifest.executable
        return f"{TREES_DIR}/{self.manifest.name}/{target}"


def plugin_form(settings: InstallSettings) -> bytes | PluginTree:
    """What to install: ``--plugin-tree``, else the tree this process runs from (the image),
    else the binary (``plugin_binary``)."""
    if settings.plugin_tree:
        root = Path(settings.plugin_tree)
        try:
            return PluginTree(root.resolve(), parse_manifest((root / MANIFEST_NAME).read_bytes()))
        except OSError as exc:
            raise ConfigError(
                f"--plugin-tree {root}: cannot read {MANIFEST_NAME}: {exc.strerror}",
                hint="give the directory bash packaging/build.sh writes (dist/meshctl-tree)",
            ) from exc
        except ManifestError as exc:
            raise ConfigError(
                f"--plugin-tree {root}: {exc}", hint="rebuild it with bash packaging/build.sh"
            ) from exc
    own = trees.own()
    if own is not None:
        return PluginTree(*own)
    return plugin_binary(settings.run_dir)


class ConfReport(TypedDict, total=False):
    """``/debug/conflist``: the CNI conf dir, the file the runtime uses (None: no valid one
    yet) and every config file's text."""

    confDir: str
    active: str | None
    files: dict[str, str]
    error: str  # the conf dir cannot be listed


CONF_REPORT_LIMIT = 256 * 1024  # bytes of one config file shown


@dataclass(frozen=True, slots=True)
class Status:
    ready: bool
    reason: str


class Installer:
    """Puts the plugin in place on this node, checks it is still there, and takes it away."""

    def __init__(
        self, settings: InstallSettings, binary: bytes | None = None, tree: PluginTree | None = None
    ) -> None:
        self.settings = settings
        form = (
            (tree or binary) if (tree is not None or binary is not None) else plugin_form(settings)
        )
        self._tree = form if isinstance(form, PluginTree) else None
        self._binary = form if isinstance(form, bytes) else b""
        self._swept = -math.inf  # when every file of the installed tree was last checked

    # --- install -----------------------------------------------------------------------------

    def install(self) -> list[str]:
        """Make the node hold our binary, kubeconfig and config entry; returns what changed."""
        changed = []
        if self._install_binary():
            changed.append(f"binary {self.settings.binary_path}")
        if not self.settings.local_inventory and self._install_kubeconfig():
            changed.append(f"kubeconfig {self.settings.kubeconfig_path}")
        conf = self._install_conf()
        if conf:
            changed.append(f"config {conf}")
        return changed

    def _install_binary(self) -> bool:
        path = self.settings.binary_path
        if self._tree is not None:
            return self._install_tree(self._tree)
        with contextlib.suppress(OSError):
            if (
                not path.is_symlink()
                and path.read_bytes() == self._binary
                and os.access(path, os.X_OK)
            ):
                return False
        previous = self._linked_tree()
        try:
            atomic_write(path, self._binary, 0o755)
        except OSError as exc:
            raise _bin_dir_error(path.parent, exc) from exc
        self._prune_trees(keep={previous} if previous else set())
        return True

    def _install_tree(self, tree: PluginTree) -> bool:
        """Place the verified tree, point ``meshctl-cni`` at it, then drop older trees."""
        link = self.settings.binary_path
        if self._tree_problem(tree, every_file=True) is None:
            return False
        previous = self._linked_tree()
        try:
            trees.place(tree.root, tree.manifest, self._trees_dir())
            tmp = link.with_name(f".{link.name}.meshctl-tmp")
            trees.remove(tmp)
            tmp.symlink_to(tree.link_target)
            tmp.replace(link)  # rename(2): the runtime sees the old plugin or the new, never none
            trees.fsync_dir(link.parent)
        except OSError as exc:
            raise _bin_dir_error(link.parent, exc) from exc
        self._swept = time.monotonic()  # place() has just checked every byte
        log.info("plugin tree %s in place (%d files)", tree.manifest.name, len(tree.manifest.files))
        self._prune_trees(keep={tree.manifest.name, *([previous] if previous else [])})
        return True

    def _tree_problem(self, tree: PluginTree, *, every_file: bool) -> str | None:
        """Why the installed plugin is not this tree: the link and the executable, and with
        ``every_file`` each file's size and mode (no hashing: ``place`` hashed them)."""
        link = self.settings.binary_path
        try:
            target = str(link.readlink())
        except OSError:
            return f"{link} is not the symlink to the plugin tree {tree.manifest.name}"
        if target != tree.link_target:
            return f"{link} points to {target}, not to the plugin tree {tree.manifest.name}"
        installed = self._trees_dir() / tree.manifest.name
        if every_file:
            found = trees.problems(installed, tree.manifest, content=False)
        else:
            executable = [f for f in tree.manifest.files if f.path == tree.manifest.executable]
            found = trees.problems(
                installed, replace(tree.manifest, files=tuple(executable)), content=False
            )
        return f"the plugin tree {tree.manifest.name} is damaged: {found[0]}" if found else None

    def _trees_dir(self) -> Path:
        return Path(self.settings.cni_bin_dir) / TREES_DIR

    def _linked_tree(self) -> str | None:
        """The name of the tree ``meshctl-cni`` points into now, if it does."""
        try:
            parts = self.settings.binary_path.readlink().parts
        except OSError:
            return None
        return parts[1] if len(parts) == 3 and parts[0] == TREES_DIR else None

    def _prune_trees(self, keep: set[str], *, temp_too: bool = False) -> None:
        directory = self._trees_dir()
        try:
            entries = list(directory.iterdir())
        except FileNotFoundError:
            return
        now = time.time()
        for entry in entries:
            if entry.name in keep:
                continue
            if entry.name.startswith((".tmp-", ".old-")) and not temp_too:
                with contextlib.suppress(OSError):
                    if now - entry.lstat().st_mtime < STALE_TEMP:
                        continue  # maybe another installer's copy in progress
            trees.remove(entry)
            log.info("removed the old plugin tree %s", entry.name)
        with contextlib.suppress(OSError):
            directory.rmdir()  # only when empty

    def desired_kubeconfig(self) -> bytes:
        sa = Path(self.settings.service_account_dir)
        try:
            token = (sa / "token").read_text(encoding="utf-8").strip()
            ca_file = (
                Path(self.settings.kube_ca_file) if self.settings.kube_ca_file else sa / "ca.crt"
            )
            ca = None if self.settings.skip_tls_verify else ca_file.read_bytes()
        except OSError as exc:
            raise MeshctlError(
                f"cannot read the service account credentials: {exc.strerror}: {exc.filename}",
                hint="mount the service account token (automountServiceAccountToken: true)",
            ) from exc
        return netconf.kubeconfig(
            self.settings.server, token, ca, insecure=self.settings.skip_tls_verify
        )

    def _install_kubeconfig(self) -> bool:
        wanted = self.desired_kubeconfig()
        path = self.settings.kubeconfig_path
        with contextlib.suppress(OSError):
            if path.read_bytes() == wanted:
                return False
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, wanted, 0o600)  # holds a bearer token
        return True

    def _conf_files(self) -> dict[str, bytes]:
        directory = Path(self.settings.cni_conf_dir)
        files = {}
        try:
            names = sorted(p.name for p in directory.iterdir())
        except OSError as exc:
            raise MeshctlError(
                f"cannot list the CNI conf dir {directory}: {exc.strerror}",
                hint="mount the host's /etc/cni/net.d (--cni-conf-dir)",
            ) from exc
        for name in names:
            if name.endswith(netconf.CONF_EXTENSIONS) and not name.startswith("."):
                with contextlib.suppress(OSError):
                    files[name] = (directory / name).read_bytes()
        return files

    def _target(self, files: dict[str, bytes]) -> str | None:
        name = self.settings.cni_conf_name
        if not name:
            return netconf.primary(files)
        for candidate in (name, netconf.conflist_name(name)):
            if candidate in files and netconf.parse(candidate, files[candidate]) is not None:
                return candidate
        return None

    def _install_conf(self) -> str | None:
        files = self._conf_files()
        name = self._target(files)
        if name is None:
            raise MeshctlError(
                f"no valid CNI network config in {self.settings.cni_conf_dir} yet",
                hint="the node's primary CNI plugin writes it; meshctl waits and merges then",
            )
        entry = self.settings.entry()
        data = netconf.parse(name, files[name])
        if data is not None and netconf.installed(data, entry):
            return None
        backup = self.read_backup()
        if backup is not None and backup.written_name != name and backup.written_name in files:
            # The runtime now uses another file: give the old one back before taking the new one,
            # except where the old original *is* the new file (a primary CNI rewrote the .conf we
            # had wrapped): that content is theirs now, and newer than our copy.
            undo = netconf.restore(backup, files)
            self._apply([a for a in undo if not (isinstance(a, netconf.Write) and a.name == name)])
            files = self._conf_files()
            backup = None
        directory = Path(self.settings.cni_conf_dir)
        current = files[name]
        mode = stat.S_IMODE((directory / name).stat().st_mode)
        keep = backup is not None and backup.written_name == name and current == backup.written
        new_name, merged = netconf.merge(name, current, entry)
        original = netconf.strip(name, current) or current
        fresh = netconf.Backup(
            original_name=backup.original_name if keep and backup else name,
            original=backup.original if keep and backup else original,
            mode=backup.mode if keep and backup else mode,
            written_name=new_name,
            written=merged,
        )
        # Backup first: if we die between the two writes, cleanup still knows the original.
        atomic_write(self._backup_path(), fresh.to_json().encode(), 0o600)
        atomic_write(directory / new_name, merged, mode)
        if new_name != name:
            (directory / name).unlink(missing_ok=True)
            log.info("wrapped %s into %s with %s appended", name, new_name, PLUGIN_TYPE)
        return new_name

    def conf_report(self) -> ConfReport:
        """What ``/debug/conflist`` serves (``meshctl bug-report`` reads it through the API
        server): the node's CNI config files as this agent reads them and which one the runtime
        uses. Read-only; each file is cut at ``CONF_REPORT_LIMIT`` bytes."""
        try:
            files = self._conf_files()
        except MeshctlError as exc:
            return {"confDir": self.settings.cni_conf_dir, "error": exc.message, "files": {}}
        shown = {
            name: data[:CONF_REPORT_LIMIT].decode(errors="replace")
            + ("\n... (cut)" if len(data) > CONF_REPORT_LIMIT else "")
            for name, data in files.items()
        }
        active = self._target(files)
        return {"confDir": self.settings.cni_conf_dir, "active": active, "files": shown}

    # --- status ------------------------------------------------------------------------------

    def status(self) -> Status:  # noqa: PLR0911 (one exit per reason)
        """Ready when the binary, the kubeconfig (unless ``local_inventory``) and our entry in the
        runtime's config are there."""
        if self._tree is not None:
            now = time.monotonic()
            every_file = now - self._swept >= self.settings.tree_check_interval
            problem = self._tree_problem(self._tree, every_file=every_file)
            if problem is not None:
                return Status(False, problem)
            if every_file:
                self._swept = now
        elif not os.access(self.settings.binary_path, os.X_OK):
            return Status(False, f"{self.settings.binary_path} is missing")
        try:
            if self.settings.local_inventory:
                pass  # no API server: nothing to reach it with
            elif self.settings.kubeconfig_path.read_bytes() != self.desired_kubeconfig():
                return Status(False, "the plugin kubeconfig is stale (token rotated?)")
        except OSError:
            return Status(False, f"{self.settings.kubeconfig_path} is missing")
        files = self._conf_files()
        name = self._target(files)
        if name is None:
            return Status(False, f"no valid CNI network config in {self.settings.cni_conf_dir}")
        data = netconf.parse(name, files[name])
        if data is None or not netconf.installed(data, self.settings.entry()):
            return Status(
                False, f"{name} (the runtime's CNI config) does not include {PLUGIN_TYPE}"
            )
        return Status(True, f"{PLUGIN_TYPE} is chained in {name}")

    # --- cleanup -----------------------------------------------------------------------------

    def cleanup(self, *, everything: bool = False) -> list[str]:
        """Take everything out again; the node's config as it was before ``install``.

        The plugin goes only if it is this installer's (its bytes, or the link to its tree), so
        that an old installer stopping after a new one started leaves the new one's plugin;
        ``everything`` (``meshctl cni uninstall``) removes whatever plugin and trees are there.
        """
        done = []
        with contextlib.suppress(MeshctlError):
            actions = netconf.restore(self.read_backup(), self._conf_files())
            self._apply(actions)
            done += [f"{type(a).__name__.lower()} {a.name}" for a in actions]
        paths = [self._backup_path(), self.settings.kubeconfig_path]
        if everything or self._plugin_is_ours():
            paths.append(self.settings.binary_path)
        for path in paths:
            try:
                path.unlink()
                done.append(f"removed {path}")
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("cannot remove %s: %s", path, exc.strerror)
        # A newer installer's tree (the link still points into it) stays; ours and older go.
        linked = self._linked_tree()
        ours = self._tree.manifest.name if self._tree is not None else None
        keep = {linked} if linked and linked != ours and not everything else set()
        if self._trees_dir().is_dir():
            self._prune_trees(keep=keep, temp_too=everything)
            if not self._trees_dir().exists():
                done.append(f"removed {self._trees_dir()}")
        return done

    def _plugin_is_ours(self) -> bool:
        path = self.settings.binary_path
        if self._tree is not None:
            return self._linked_tree() == self._tree.manifest.name
        try:
            return not path.is_symlink() and path.read_bytes() == self._binary
        except OSError:
            return False

    def read_backup(self) -> netconf.Backup | None:
        try:
            return netconf.Backup.from_json(self._backup_path().read_text(encoding="utf-8"))
        except OSError:
            return None

    def _backup_path(self) -> Path:
        return Path(self.settings.run_dir) / BACKUP_NAME

    def _apply(self, actions: list[netconf.Action]) -> None:
        directory = Path(self.settings.cni_conf_dir)
        for action in actions:
            path = directory / action.name
            if isinstance(action, netconf.Delete):
                path.unlink(missing_ok=True)
                continue
            mode = action.mode
            if mode < 0:
                mode = stat.S_IMODE(path.stat().st_mode)
            atomic_write(path, action.data, mode)


def _bin_dir_error(directory: Path, exc: OSError) -> MeshctlError:
    return MeshctlError(
        f"cannot install the plugin into {directory}: {exc.strerror or exc}",
        hint="the CNI bin dir must be a writable hostPath (on GKE: /home/kubernetes/bin)",
    )


def atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data`` (``mode``) so readers see the old or the new file, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.meshctl-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), mode)  # the umask must not narrow it
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    # The rename itself must survive a crash too.
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
