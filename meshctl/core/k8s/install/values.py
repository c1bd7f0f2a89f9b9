"""Install values: a typed schema, ``--set key=value`` assignments, files, merging, validation.

A schema is a nested mapping whose leaves are ``Field``s. Values come from the schema's defaults,
then the profile's overlay, then ``-f`` files in order, then ``--set`` in order (later wins;
mappings merge key by key, anything else is replaced), and are validated as a whole. Invariant:
every refusal is one ``ConfigError`` naming where the value came from and the offending key's
full path (``components.cni.cniBinDir``), with the keys that path does accept; nothing is
half-applied because nothing is applied before validation passes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

from meshctl.errors import ConfigError

Kind = Literal["string", "int", "bool", "strings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Field:
    """One settable leaf: its type, default, help, and optional constraints."""

    kind: Kind
    default: Any
    help: str = ""
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    # Returns what is wrong with a value of the right type, or None when it is fine.
    check: Callable[[Any], str | None] | None = None


Schema = Mapping[str, Union[Field, "Schema"]]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SET_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def dns_label(value: str) -> str | None:
    """``check`` for names that become part of object names and labels (RFC 1123 labels)."""
    if _DNS_LABEL.match(value):
        return None
    return "must be a DNS-1123 label (lower-case letters, digits and '-', at most 63)"


def defaults(schema: Schema) -> dict[str, Any]:
    """The schema's default values as a nested mapping (fresh containers every call)."""
    out: dict[str, Any] = {}
    for key, node in schema.items():
        if isinstance(node, Field):
            out[key] = list(node.default) if isinstance(node.default, list) else node.default
        else:
            out[key] = defaults(node)
    return out


def merge(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """``overlay`` over ``base``: mappings merge recursively, other values replace."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_assignment(text: str, schema: Schema, source: str | None = None) -> dict[str, Any]:
    """``--set a.b.c=value`` as the overlay ``{"a": {"b": {"c": value}}}``.

    The value is typed by the schema's field at that path (``true`` is a bool only where the
    field is one, ``1.0`` stays a string where the field is a string); a comma list fills a
    ``strings`` field, and an empty value an empty list.
    """
    source = source or f"--set {text}"
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"{source}: expected KEY=VALUE", hint="e.g. --set revision=canary")
    path = key.split(".")
    for part in path:
        if not _SET_KEY.match(part):
            raise ConfigError(
                f"{source}: {key!r} is not a key path",
                hint="keys are dot-separated names, e.g. components.cni.enabled",
            )
    node: Field | Schema = schema
    for depth, part in enumerate(path):
        if isinstance(node, Field):
            raise ConfigError(
                f"{source}: {'.'.join(path[:depth])} is a value, not a section",
                hint=f"set {'.'.join(path[:depth])}=VALUE",
            )
        if part not in node:
            raise _unknown(source, path[:depth], part, node)
        node = node[part]
    if not isinstance(node, Field):
        raise ConfigError(
            f"{source}: {key} is a section, not a value",
            hint=f"set one of its keys: {', '.join(f'{key}.{k}' for k in node)}",
        )
    value = _from_text(raw, node, source, key)
    overlay: dict[str, Any] = {path[-1]: value}
    for part in reversed(path[:-1]):
        overlay = {part: overlay}
    return overlay


def validate(schema: Schema, data: Any, source: str) -> dict[str, Any]:
    """``data`` (already merged over the defaults) checked against ``schema``; every key known,
    every value of its field's type and within its constraints. Returns a fresh copy."""
    return _validate(schema, data, source, ())


def _validate(schema: Schema, data: Any, source: str, at: tuple[str, ...]) -> dict[str, Any]:
    where = ".".join(at)
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: {where or 'the values'} must be a mapping, not {_type_name(data)}",
            hint="write 'key: value' lines",
        )
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str) or key not in schema:
            raise _unknown(source, list(at), str(key), schema)
        node = schema[key]
        if isinstance(node, Field):
            out[key] = _check(node, value, source, ".".join((*at, key)))
        else:
            out[key] = _validate(node, value, source, (*at, key))
    missing = [key for key in schema if key not in out]
    if missing:
        # Values are merged over the defaults before validation, so only a null or an emptied
        # section can lose a key.
        raise ConfigError(
            f"{source}: {'.'.join((*at, missing[0]))} is missing",
            hint="leave a key out to keep its default; never set a section to null",
        )
    return out


def _check(field: Field, value: Any, source: str, path: str) -> Any:
    problem = _type_problem(field, value)
    if problem is None and field.choices and value not in field.choices:
        problem = f"{value!r} is not one of {', '.join(field.choices)}"
    if problem is None and field.kind == "int" and not _within(field, value):
        problem = f"{value} is out of range ({_range(field)})"
    if problem is None and field.check is not None:
        items = value if field.kind == "strings" else [value]
        problem = next((f"{v!r} {p}" for v in items if (p := field.check(v))), None)
    if problem is not None:
        raise ConfigError(f"{source}: {path}: {problem}", hint=_hint(field, path))
    return list(value) if isinstance(value, list) else value


def _type_problem(field: Field, value: Any) -> str | None:
    ok = {
        "string": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "strings": isinstance(value, list) and all(isinstance(v, str) for v in value),
    }[field.kind]
    if ok:
        return None
    expected = {
        "string": "a string",
        "int": "an integer",
        "bool": "true or false",
        "strings": "a list of strings",
    }[field.kind]
    return f"expected {expected}, got {_type_name(value)} {value!r}"


def _from_text(raw: str, field: Field, source: str, path: str) -> Any:
    if field.kind == "string":
        return raw
    if field.kind == "strings":
        return [part.strip() for part in raw.split(",") if part.strip()]
    if field.kind == "bool":
        lowered = raw.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        raise ConfigError(
            f"{source}: {path}: expected true or false, got {raw!r}", hint=_hint(field, path)
        )
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(
            f"{source}: {path}: expected an integer, got {raw!r}", hint=_hint(field, path)
        ) from None


def _within(field: Field, value: int) -> bool:
    return (field.minimum is None or value >= field.minimum) and (
        field.maximum is None or value <= field.maximum
    )


def _range(field: Field) -> str:
    if field.minimum is not None and field.maximum is not None:
        return f"{field.minimum}-{field.maximum}"
    if field.minimum is not None:
        return f"at least {field.minimum}"
    return f"at most {field.maximum}"


def _hint(field: Field, path: str) -> str:
    return f"{path}: {field.help}" if field.help else "see 'meshctl install --help'"


def _unknown(source: str, at: Sequence[str], key: str, node: Schema) -> ConfigError:
    parent = ".".join(at)
    full = f"{parent}.{key}" if parent else key
    return ConfigError(
        f"{source}: unknown key {full!r}",
        hint=f"{'keys of ' + parent if parent else 'top-level keys'}: {', '.join(node)}",
    )


def _type_name(value: Any) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        dict: "mapping",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def lookup(data: Mapping[str, Any], path: str) -> Any:
    """The value at dotted ``path`` of validated values (a KeyError names the path)."""
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(path)
        node = node[part]
    return node


def non_defaults(data: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` whose values differ from ``base`` (what a user changed)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), Mapping):
            inner = non_defaults(value, base[key])
            if inner:
                out[key] = inner
        elif base.get(key) != value:
            out[key] = value
    return out
