"""Plugin discovery: which subcommands exist, their one-line help, and loading one on demand.

Invariant: listing plugins never imports a plugin's code. The help line comes from a
``plugin.json`` manifest beside the plugin's package (located with ``find_spec`` on the package,
which does not execute it), else from the distribution's ``Summary``. A package that provides
several subcommands gives each its own line under ``commands`` (``{"help": ..., "commands":
{"uninstall": {"help": ...}}}``). Only ``load`` imports.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from meshctl.errors import MeshctlError

ENTRY_POINT_GROUP = "meshctl.plugins"
MANIFEST_NAME = "plugin.json"

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginInfo:
    """A subcommand as advertised by an installed distribution, before any import."""

    name: str
    target: str  # "module:attribute" from the entry point
    distribution: str
    help: str
    hidden: bool = False


def discover() -> dict[str, PluginInfo]:
    """Every installed plugin by subcommand name; on a name clash the first distribution wins."""
    found: dict[str, PluginInfo] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist_name = ep.dist.name if ep.dist is not None else "?"
        if ep.name in found:
            log.warning(
                "plugin %r from %s ignored: %s already provides it",
                ep.name,
                dist_name,
                found[ep.name].distribution,
            )
            continue
        help_text, hidden = _manifest(ep)
        found[ep.name] = PluginInfo(
            name=ep.name, target=ep.value, distribution=dist_name, help=help_text, hidden=hidden
        )
    return found


def find(name: str) -> PluginInfo | None:
    """The plugin for subcommand ``name`` (first distribution wins, as in ``discover``), without
    reading any manifest: for fast paths that run one known plugin (the CNI plugin)."""
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=name):
        dist_name = ep.dist.name if ep.dist is not None else "?"
        return PluginInfo(name=ep.name, target=ep.value, distribution=dist_name, help="")
    return None


def load(info: PluginInfo) -> object:
    """Import the plugin and return the object its entry point names (a Typer app or a command)."""
    module_name, _, attr = info.target.partition(":")
    try:
        module = importlib.import_module(module_name)
        obj: object = module
        for part in filter(None, attr.split(".")):
            obj = getattr(obj, part)
    except Exception as exc:  # a broken third-party plugin must not crash the whole CLI
        raise MeshctlError(
            f"plugin {info.name!r} ({info.target}, from {info.distribution}) failed to load: "
            f"{type(exc).__name__}: {exc}",
            hint=f"reinstall or upgrade the {info.distribution} distribution",
        ) from exc
    return obj


def _manifest(ep: importlib.metadata.EntryPoint) -> tuple[str, bool]:
    """Help line and hidden flag for ``ep`` without importing the plugin module itself."""
    module_name = ep.value.partition(":")[0].strip()
    path = _manifest_path(module_name)
    if path is not None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            entry = (data.get("commands") or {}).get(ep.name) or data
            return str(entry.get("help", "")), bool(entry.get("hidden", False))
        except (OSError, ValueError) as exc:
            log.debug("unreadable plugin manifest %s: %s", path, exc)
    summary = ep.dist.metadata["Summary"] if ep.dist is not None else None
    return (summary or "", False)


def _manifest_path(module_name: str) -> Path | None:
    """``plugin.json`` in the package holding ``module_name``, or in ``module_name`` if a package.

    Only the top-level package's spec is looked up (``find_spec("a")`` imports nothing) and the
    rest of the dotted path is followed as folders, so no package of the plugin's (nor a parent
    package, as ``meshctl_plugins.ztunnel`` is to ``meshctl_plugins.ztunnel.supervisor``) is
    executed here.
    """
    top, *inner, last = module_name.split(".") if "." in module_name else (module_name, "")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        base = Path(location).joinpath(*inner)
        for folder in (base, base / last) if last else (base,):
            path = folder / MANIFEST_NAME
            if path.is_file():
                return path
    return None
