"""Drift: where a live object no longer holds what the manifest sets, named field by field.

Only what the manifest sets is compared (the server's defaults and other managers' fields, such
as the control plane's caBundle or a controller's annotations, are not drift). Lists of mappings
that all carry a ``name`` are matched by name (containers, env, ports, webhooks), volume mounts by
``mountPath``; any other list is compared whole. Paths read like ``kubectl explain``'s:
``spec.template.spec.containers[discovery].image``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshctl.core.k8s.inject.annotations import quantity

_MISSING = object()
_QUANTITY_PATH = re.compile(r"(^|\.)resources\.(limits|requests)\.[^.\[]+$")
_LIST_KEYS = ("name", "mountPath", "containerPort")


@dataclass(frozen=True, slots=True)
class Difference:
    path: str
    live: Any  # the live value, or None with ``missing``
    desired: Any
    missing: bool = False

    def __str__(self) -> str:
        found = "missing" if self.missing else _short(self.live)
        return f"{self.path} is {found}, the manifest sets {_short(self.desired)}"


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def differences(desired: Mapping[str, Any], live: Mapping[str, Any]) -> list[Difference]:
    """Every field ``desired`` sets that ``live`` lacks or holds differently."""
    out: list[Difference] = []
    _walk(desired, live, "", out)
    return out


def _zero(value: Any) -> bool:
    """Go's zero values, which the API server drops from fields marked omitempty when it
    stores an object: a manifest's ``value: ""`` or ``initialDelaySeconds: 0`` comes back absent,
    and that is the same object, not drift."""
    if isinstance(value, bool | int | float | str):
        return not value
    return value is None or (isinstance(value, Mapping | Sequence) and not value)


def _walk(desired: Any, live: Any, path: str, out: list[Difference]) -> None:
    if live is _MISSING and _zero(desired):
        return
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            out.append(Difference(path, live, desired, missing=live is _MISSING))
            return
        for key, value in desired.items():
            child = f"{path}.{key}" if path else str(key)
            _walk(value, live.get(key, _MISSING), child, out)
        return
    if isinstance(desired, Sequence) and not isinstance(desired, str):
        key = _list_key(desired)
        if key is not None and isinstance(live, Sequence) and not isinstance(live, str):
            by_key = {item.get(key): item for item in live if isinstance(item, Mapping)}
            for item in desired:
                _walk(item, by_key.get(item[key], _MISSING), f"{path}[{item[key]}]", out)
            return
    if live is _MISSING:
        out.append(Difference(path, None, desired, missing=True))
    elif live != desired and not _same_quantity(path, desired, live):
        out.append(Difference(path, live, desired))


def _same_quantity(path: str, desired: Any, live: Any) -> bool:
    """Resource quantities come back canonical (``2000m`` is stored as ``2``, ``1024Mi`` as
    ``1Gi``): under ``resources.limits``/``requests`` equal amounts are the same value."""
    if not _QUANTITY_PATH.search(path):
        return False
    try:
        return quantity(str(desired)) == quantity(str(live))
    except ArithmeticError:  # decimal's InvalidOperation: not a quantity after all
        return False


def _list_key(items: Sequence[Any]) -> str | None:
    if not items or not all(isinstance(i, Mapping) for i in items):
        return None
    for key in _LIST_KEYS:
        names = [i.get(key) for i in items]
        if all(n is not None for n in names) and len(set(map(str, names))) == len(names):
            return key
    return None
