"""Finding the components installed distributions contribute to install and verify.

Plugins publish ``meshctl.core.k8s.install.components.Component`` values in the
``meshctl.components`` entry-point group (``name = "module:attribute"``; the attribute is a
Component or a function
returning one). Invariants: nothing is imported until install, uninstall or verify asks; a broken
contribution is a one-line error naming its distribution, never a traceback; a name clash keeps
the first distribution's component, as plugin discovery does.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from typing import Any

from meshctl.core.k8s.install.checks import Check
from meshctl.core.k8s.install.components import Component, Registry
from meshctl.errors import MeshctlError

ENTRY_POINT_GROUP = "meshctl.components"
CHECKS_GROUP = "meshctl.checks"  # verify checks not tied to an installed component

log = logging.getLogger(__name__)


def _load(ep: importlib.metadata.EntryPoint, what: str) -> object:
    dist = ep.dist.name if ep.dist is not None else "?"
    module_name, _, attr = ep.value.partition(":")
    try:
        obj: object = importlib.import_module(module_name.strip())
        for part in filter(None, attr.strip().split(".")):
            obj = getattr(obj, part)
        if callable(obj) and not isinstance(obj, Component):
            obj = obj()
    except Exception as exc:  # a broken third-party contribution must not crash install
        raise MeshctlError(
            f"{what} {ep.name!r} ({ep.value}, from {dist}) failed to load: "
            f"{type(exc).__name__}: {exc}",
            hint=f"reinstall or upgrade the {dist} distribution",
        ) from exc
    return obj


def load() -> Registry:
    """Every contributed component, imported now."""
    found: dict[str, Component[Any]] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else "?"
        if ep.name in found:
            log.warning("component %r from %s ignored: already provided", ep.name, dist)
            continue
        obj = _load(ep, "component")
        if not isinstance(obj, Component):
            raise MeshctlError(
                f"component {ep.name!r} ({ep.value}, from {dist}) is a {type(obj).__name__}, "
                "not a Component",
                hint=f"report this to the maintainers of {dist}",
            )
        if obj.name != ep.name:
            raise MeshctlError(
                f"component entry point {ep.name!r} ({dist}) names a component {obj.name!r}",
                hint=f"report this to the maintainers of {dist}",
            )
        found[ep.name] = obj
    return Registry(found.values())


def load_checks() -> list[Check]:
    """Every check contributed outside a component (the ``meshctl.checks`` group), in order."""
    found: list[Check] = []
    for ep in importlib.metadata.entry_points(group=CHECKS_GROUP):
        obj = _load(ep, "checks")
        items = list(obj) if isinstance(obj, list | tuple) else [obj]
        checks = [item for item in items if isinstance(item, Check)]
        if len(checks) != len(items):
            dist = ep.dist.name if ep.dist is not None else "?"
            raise MeshctlError(
                f"checks {ep.name!r} ({ep.value}, from {dist}) are not Check values",
                hint=f"report this to the maintainers of {dist}",
            )
        found += checks
    return found
