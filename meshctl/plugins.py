"""Plugin discovery: which subcommands exist, their one-line help, and loading one on demand.

Invariant: listing plugins never imports a plugin's code. The help line comes from a
``plugin.json`` manifest beside the plugin's package (located with ``find_spec`` on the package,
which does not execute it), else from the distribution's ``Summary``. Only ``load`` imports.

A frozen build holds a fixed set of distributions, so its plugin table is taken once, at build
time (``FROZEN_TABLE`` beside this module, written by packaging/meshctl.spec from ``discover``)
and read instead of scanning entry points: ``importlib.metadata`` alone is 15-30 ms of a start
on a node (the data plane and ``--help`` both look plugins up). Unfrozen, the file is ignored.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from meshctl.errors import MeshctlError

if TYPE_CHECKING:
    import importlib.metadata

ENTRY_POINT_GROUP = "meshctl.plugins"
MANIFEST_NAME = "plugin.json"
FROZEN_TABLE = "frozen-plugins.json"

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
    table = _frozen_table()
    if table is not None:
        return table
    return _scan()


def _scan() -> dict[str, PluginInfo]:
    import importlib.metadata

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
    reading any manifest: for fast paths that run one known plugin (the data plane)."""
    table = _frozen_table()
    if table is not None:
        return table.get(name)
    import importlib.metadata

    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=name):
        dist_name = ep.dist.name if ep.dist is not None else "?"
        return PluginInfo(name=ep.name, target=ep.value, distribution=dist_name, help="")
    return None


def frozen_table_json() -> str:
    """The table a frozen build carries (the build writes it from this process's ``discover``)."""
    return json.dumps([asdict(info) for info in _scan().values()], indent=1, sort_keys=True)


def _frozen_table() -> dict[str, PluginInfo] | None:
    if not getattr(sys, "frozen", False):
        return None
    try:
        rows = json.loads(Path(__file__).with_name(FROZEN_TABLE).read_text(encoding="utf-8"))
        return {row["name"]: PluginInfo(**row) for row in rows}
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.debug("no usable frozen plugin table (%s): scanning entry points", exc)
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
            return str(data.get("help", "")), bool(data.get("hidden", False))
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
