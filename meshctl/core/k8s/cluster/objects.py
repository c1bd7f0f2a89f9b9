"""Reading Kubernetes objects (JSON as the API serves them) defensively, with one error type.

Owns the small accessors every reader here uses: a mapping's field by path, strings, label maps,
IP literals. Invariant: a malformed object raises ``ObjectError`` naming the object and the field;
nothing else escapes a reader.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from meshctl.core.mesh.addresses import IPAddress


class ObjectError(ValueError):
    """A Kubernetes object lacks a field the mesh needs, or has one of the wrong type."""


def field(obj: Any, *path: str) -> Any:
    """``obj[path[0]][path[1]]...``, or None as soon as a step is missing."""
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def text(obj: Any, *path: str, default: str = "") -> str:
    value = field(obj, *path)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ObjectError(f"{'.'.join(path)} is {type(value).__name__}, not a string")
    return value


def identify(obj: Any, kind: str) -> tuple[str, str]:
    """(namespace, name) of a namespaced object; ``ObjectError`` without them."""
    if not isinstance(obj, Mapping):
        raise ObjectError(f"{kind} is {type(obj).__name__}, not an object")
    namespace, name = text(obj, "metadata", "namespace"), text(obj, "metadata", "name")
    if not namespace or not name:
        raise ObjectError(f"{kind} without metadata.namespace and metadata.name")
    return namespace, name


def string_map(obj: Any, *path: str) -> dict[str, str]:
    """A labels/annotations/selector map (absent = empty); values must be strings."""
    value = field(obj, *path)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ObjectError(f"{'.'.join(path)} is {type(value).__name__}, not a map")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ObjectError(f"{'.'.join(path)} has a non-string entry {k!r}")
        out[k] = v
    return out


def items(obj: Any, *path: str) -> list[Any]:
    value = field(obj, *path)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ObjectError(f"{'.'.join(path)} is {type(value).__name__}, not a list")
    return value


def ip_literal(value: Any, where: str) -> IPAddress:
    if not isinstance(value, str):
        raise ObjectError(f"{where} is {type(value).__name__}, not an IP address")
    try:
        return ipaddress.ip_address(value)
    except ValueError as exc:
        raise ObjectError(f"{where} {value!r} is not an IP address") from exc


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """A ``matchLabels``-style selector: every pair present in ``labels``."""
    return all(labels.get(k) == v for k, v in selector.items())
