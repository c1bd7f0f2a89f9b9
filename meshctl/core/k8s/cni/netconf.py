"""The node's CNI network config as data: pick the primary file, merge our entry in, take it out.

Owns the installer's decisions; ``meshctl_plugins.cni.installer`` only reads and writes files.
Invariants:
- The primary config is the lexically first valid ``.conf``/``.conflist``/``.json`` file of the
  conf dir (the one container runtimes use, as libcni's ``ConfFiles`` sorts them).
- Merging appends our entry to a list after removing any older entry of ours (one entry, last);
  a single-plugin config is wrapped into a ``.conflist`` keeping its ``name`` and ``cniVersion``
  (the network name keys the runtime's IPAM and result caches, so it must not change).
- ``Backup`` keeps the original bytes, name and mode; restoring gives the node's file back byte
  for byte when nobody else changed it since, else the current file minus our entry.
- The kubeconfig for the plugin is JSON (valid YAML) so the plugin reads it without a YAML parser.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, cast

from meshctl.core.k8s.cni.spec import PLUGIN_TYPE
from meshctl.structured import InputError, load_json

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Kubeconfig, KubeconfigCluster

CONF_EXTENSIONS = (".conf", ".conflist", ".json")
Plugin = dict[str, object]  # one plugin's config: its "type", then its own keys (unread)


class NetworkConfig(TypedDict, total=False):
    """A config ``parse`` accepted: a list (``plugins``, each with a ``type``), or one plugin's
    config (its ``type`` and its own keys, which ride along unread)."""

    cniVersion: str
    name: str
    type: str
    plugins: list[Plugin]


def parse(name: str, raw: bytes) -> NetworkConfig | None:
    """The config when it is one a runtime would load, else None (not JSON, no type, no plugins)."""
    if not name.endswith(CONF_EXTENSIONS):
        return None
    try:
        data = load_json(raw, name)
    except InputError:  # not JSON, not UTF-8, nested past any config: not one a runtime loads
        return None
    if not isinstance(data, dict):
        return None
    if "plugins" in data:
        plugins = data["plugins"]
        ok = isinstance(plugins, list) and bool(plugins) and all(_typed(p) for p in plugins)
        return cast(NetworkConfig, data) if ok else None
    return cast(NetworkConfig, data) if _typed(data) else None


def primary(files: Mapping[str, bytes]) -> str | None:
    """The name of the config the runtime uses: the lexically first valid one."""
    return next((name for name in sorted(files) if parse(name, files[name]) is not None), None)


def _plugins(data: NetworkConfig) -> list[Plugin]:
    """The config's plugins (a single plugin's config counts as a list of one)."""
    return data["plugins"] if "plugins" in data else [cast(Plugin, data)]


def _head(data: NetworkConfig) -> Plugin:
    """The keys a list keeps of a single config it wraps, in this order."""
    fields = cast(Plugin, data)
    return {k: fields[k] for k in ("cniVersion", "name") if k in fields}


def entries(data: NetworkConfig, plugin_type: str = PLUGIN_TYPE) -> list[Plugin]:
    """Our entries in a parsed config (a single config counts as a list of one)."""
    return [p for p in _plugins(data) if p.get("type") == plugin_type]


def installed(data: NetworkConfig, entry: Mapping[str, object]) -> bool:
    """The config holds exactly our entry, once, as the last plugin of a list."""
    plugins = data.get("plugins")
    return (
        isinstance(plugins, list)
        and plugins[-1] == dict(entry)
        and len(entries(data, str(entry["type"]))) == 1
    )


def merge(name: str, raw: bytes, entry: Mapping[str, object]) -> tuple[str, bytes]:
    """``(new file name, new bytes)`` of the config with our entry appended (or wrapped in)."""
    data = parse(name, raw)
    if data is None:
        raise ValueError(f"{name} is not a valid CNI network config")
    kind = str(entry["type"])
    if "plugins" in data:
        plugins = [p for p in data["plugins"] if p.get("type") != kind]
        return name, render({**data, "plugins": [*plugins, dict(entry)]})
    if data.get("type") == kind:
        raise ValueError(f"{name} configures {kind} alone; it needs a primary plugin before it")
    inner = {k: v for k, v in data.items() if k not in ("cniVersion", "name")}
    head = _head(data)
    return conflist_name(name), render({**head, "plugins": [inner, dict(entry)]})


def strip(name: str, raw: bytes, plugin_type: str = PLUGIN_TYPE) -> bytes | None:
    """The config without our entries, or None when it holds none (or is not valid)."""
    data = parse(name, raw)
    if data is None or not entries(data, plugin_type) or "plugins" not in data:
        return None
    kept = [p for p in data["plugins"] if p.get("type") != plugin_type]
    return render({**data, "plugins": kept})


def conflist_name(name: str) -> str:
    stem = name.rsplit(".", 1)[0]
    return f"{stem}.conflist"


def render(data: Mapping[str, object]) -> bytes:
    """Key order kept (a reader diffing before/after sees only our entry), 2-space indent."""
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class Backup:
    """What the node's config was before we merged into it, and what we wrote."""

    original_name: str
    original: bytes
    mode: int
    written_name: str
    written: bytes

    def to_json(self) -> str:
        return json.dumps(
            {
                "original_name": self.original_name,
                "original": base64.b64encode(self.original).decode(),
                "mode": self.mode,
                "written_name": self.written_name,
                "written": base64.b64encode(self.written).decode(),
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> Backup | None:
        """The backup, or None when the text is not one (a torn or foreign file)."""
        try:
            data = json.loads(text)
            return cls(
                original_name=str(data["original_name"]),
                original=base64.b64decode(data["original"]),
                mode=int(data["mode"]),
                written_name=str(data["written_name"]),
                written=base64.b64decode(data["written"]),
            )
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True, slots=True)
class Write:
    name: str
    data: bytes
    mode: int


@dataclass(frozen=True, slots=True)
class Delete:
    name: str


Action = Write | Delete


def restore(
    backup: Backup | None, files: Mapping[str, bytes], plugin_type: str = PLUGIN_TYPE
) -> list[Action]:
    """The file changes that take our entry out of the node's config.

    Byte for byte when the file is still what we wrote, or when taking our entry out of what is
    there now gives the original's content (another tool reformatted it); otherwise the current
    content minus our entry (someone else changed the config meanwhile: keep their change).
    """
    if backup is not None and backup.written_name in files:
        current = files[backup.written_name]
        wrapped = backup.written_name != backup.original_name
        undo: list[Action] = [Write(backup.original_name, backup.original, backup.mode)]
        if wrapped:
            undo.append(Delete(backup.written_name))
        if current == backup.written or _same_as_original(backup, current, plugin_type):
            return undo
        stripped = strip(backup.written_name, current, plugin_type)
        return [] if stripped is None else [Write(backup.written_name, stripped, backup.mode)]
    actions: list[Action] = []
    for name in sorted(files):
        stripped = strip(name, files[name], plugin_type)
        if stripped is not None:
            actions.append(Write(name, stripped, -1))  # -1: keep the file's current mode
    return actions


def _same_as_original(backup: Backup, current: bytes, plugin_type: str) -> bool:
    data = parse(backup.written_name, current)
    original = parse(backup.original_name, backup.original)
    if data is None or original is None:
        return False
    plugins = [p for p in _plugins(data) if p.get("type") != plugin_type]
    if "plugins" in original:
        return {**data, "plugins": plugins} == original
    head = _head(data)
    return len(plugins) == 1 and {**head, **plugins[0]} == original


def kubeconfig(server: str, token: str, ca_pem: bytes | None, *, insecure: bool = False) -> bytes:
    """A kubeconfig for the plugin: the service account's bearer token and the cluster CA."""
    cluster: KubeconfigCluster = {"server": server}
    if insecure:
        cluster["insecure-skip-tls-verify"] = True
    elif ca_pem:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    config: Kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": PLUGIN_TYPE, "user": {"token": token}}],
        "contexts": [{"name": PLUGIN_TYPE, "context": {"cluster": "local", "user": PLUGIN_TYPE}}],
        "current-context": PLUGIN_TYPE,
    }
    return render(config)


def _typed(plugin: Any) -> bool:
    return isinstance(plugin, dict) and isinstance(plugin.get("type"), str) and bool(plugin["type"])
