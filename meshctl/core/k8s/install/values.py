"""Install values: values types, their schema, ``--set key=value`` assignments, files, merging,
validation.

Each component declares its values as one frozen dataclass whose fields are ``value(...)``s: the
default is written there, once, with the field's help and constraints; ``schema_of`` derives the
schema (keys are the fields' names in camelCase: ``cni_bin_dir`` is ``cniBinDir``) and
``from_data`` builds the typed values back from validated data. A schema is a nested mapping whose
leaves are ``Field``s. Values come from the schema's defaults,
then the profile's overlay, then ``-f`` files in order, then ``--set`` in order (later wins;
mappings merge key by key, anything else is replaced), and are validated as a whole. Invariant:
every refusal is one ``ConfigError`` naming where the value came from and the offending key's
full path (``components.cni.cniBinDir``), with the keys that path does accept; nothing is
half-applied because nothing is applied before validation passes.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar, Union, overload

from meshctl.errors import ConfigError
from meshctl.structured import Json

Kind = Literal["string", "int", "bool", "strings"]
T = TypeVar("T")
# What a string (or each string of a list) must also satisfy: the problem, or None when fine.
Check = Callable[[str], str | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Field:
    """One settable leaf: its type, default, help, and optional constraints."""

    kind: Kind
    default: Json
    help: str = ""
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    check: Check | None = None  # strings only


Schema = Mapping[str, Union[Field, "Schema"]]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SET_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def dns_label(value: str) -> str | None:
    """``check`` for names that become part of object names and labels (RFC 1123 labels)."""
    if _DNS_LABEL.match(value):
        return None
    return "must be a DNS-1123 label (lower-case letters, digits and '-', at most 63)"


def defaults(schema: Schema) -> dict[str, Json]:
    """The schema's default values as a nested mapping (fresh containers every call)."""
    out: dict[str, Json] = {}
    for key, node in schema.items():
        if isinstance(node, Field):
            out[key] = list(node.default) if isinstance(node.default, list) else node.default
        else:
            out[key] = defaults(node)
    return out


def merge(base: Mapping[str, Json], overlay: Mapping[str, Json]) -> dict[str, Json]:
    """``overlay`` over ``base``: mappings merge recursively, other values replace."""
    out = dict(base)
    for key, value in overlay.items():
        prior = out.get(key)
        if isinstance(value, Mapping) and isinstance(prior, Mapping):
            out[key] = merge(prior, value)
        else:
            out[key] = value
    return out


def parse_assignment(text: str, schema: Schema, source: str | None = None) -> dict[str, Json]:
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
    return overlay_at(path, _from_text(raw, node, source, key))


def overlay_at(path: Sequence[str], value: Json) -> dict[str, Json]:
    """The overlay that sets ``value`` at ``path``: ``["a", "b"], 1`` is ``{"a": {"b": 1}}``."""
    overlay: dict[str, Json] = {path[-1]: value}
    for part in reversed(path[:-1]):
        overlay = {part: overlay}
    return overlay


def validate(schema: Schema, data: object, source: str) -> dict[str, Json]:
    """``data`` (already merged over the defaults) checked against ``schema``; every key known,
    every value of its field's type and within its constraints. Returns a fresh copy."""
    return _validate(schema, data, source, ())


def _validate(schema: Schema, data: object, source: str, at: tuple[str, ...]) -> dict[str, Json]:
    where = ".".join(at)
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: {where or 'the values'} must be a mapping, not {_type_name(data)}",
            hint="write 'key: value' lines",
        )
    out: dict[str, Json] = {}
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


def _check(field: Field, value: object, source: str, path: str) -> Json:
    problem = _type_problem(field, value)
    if problem is None and field.choices and value not in field.choices:
        problem = f"{value!r} is not one of {', '.join(field.choices)}"
    if (
        problem is None
        and field.kind == "int"
        and isinstance(value, int)
        and not _within(field, value)
    ):
        problem = f"{value} is out of range ({_range(field)})"
    if problem is None and field.check is not None:
        items = value if isinstance(value, list) else [value]
        problem = next((f"{v!r} {p}" for v in items if (p := field.check(str(v)))), None)
    if problem is not None:
        raise ConfigError(f"{source}: {path}: {problem}", hint=_hint(field, path))
    if isinstance(value, list):
        return [str(v) for v in value]
    return typing.cast("Json", value)  # a str, int or bool: _type_problem said which


def _type_problem(field: Field, value: object) -> str | None:
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


def _from_text(raw: str, field: Field, source: str, path: str) -> Json:
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


def _type_name(value: object) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        dict: "mapping",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def non_defaults(data: Mapping[str, Json], base: Mapping[str, Json]) -> dict[str, Json]:
    """The keys of ``data`` whose values differ from ``base`` (what a user changed)."""
    out: dict[str, Json] = {}
    for key, value in data.items():
        prior = base.get(key)
        if isinstance(value, Mapping) and isinstance(prior, Mapping):
            inner = non_defaults(value, prior)
            if inner:
                out[key] = inner
        elif prior != value:
            out[key] = value
    return out


# -- values types ------------------------------------------------------------------------------


@overload
def value(
    default: T,
    *,
    help: str = "",
    choices: tuple[str, ...] = (),
    minimum: int | None = None,
    maximum: int | None = None,
    check: Check | None = None,
) -> T: ...


@overload
def value(
    *,
    factory: Callable[[], T],
    help: str = "",
    choices: tuple[str, ...] = (),
    minimum: int | None = None,
    maximum: int | None = None,
    check: Check | None = None,
) -> T: ...


def value(
    default: object = dataclasses.MISSING,
    *,
    factory: Callable[[], object] | None = None,
    help: str = "",  # noqa: A002 (the Field's name for it)
    choices: tuple[str, ...] = (),
    minimum: int | None = None,
    maximum: int | None = None,
    check: Check | None = None,
) -> object:
    """A field of a values type: its default (or a ``factory`` computing it), written only here,
    with the help and constraints its schema ``Field`` carries."""
    meta: dict[str, object] = {"help": help, "choices": choices, "check": check}
    meta |= {"minimum": minimum, "maximum": maximum}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def key(name: str) -> str:
    """A values type's field name as its values key: ``cni_bin_dir`` -> ``cniBinDir``."""
    first, *rest = name.split("_")
    return first + "".join(part.capitalize() for part in rest)


_KINDS: dict[object, Kind] = {str: "string", int: "int", bool: "bool", tuple[str, ...]: "strings"}


def schema_of(cls: type) -> dict[str, Field]:
    """The schema of a values type: one ``Field`` per dataclass field, in their order."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Field] = {}
    for f in dataclasses.fields(cls):
        kind = _KINDS.get(_without_none(hints[f.name]))
        if kind is None:
            raise TypeError(f"{cls.__name__}.{f.name}: a values field is str, int, bool or strings")
        factory = f.default_factory
        default: object = f.default if factory is dataclasses.MISSING else factory()
        if default is dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: a values field has a default")
        if isinstance(default, tuple):
            default = list(default)
        meta = f.metadata
        out[key(f.name)] = Field(
            kind=kind,
            default=typing.cast("Json", default),  # of its kind: checked by the annotation
            help=meta.get("help", ""),
            choices=meta.get("choices", ()),
            minimum=meta.get("minimum"),
            maximum=meta.get("maximum"),
            check=meta.get("check"),
        )
    return out


def from_data(cls: type[T], data: Mapping[str, Json]) -> T:
    """The values type ``cls`` from validated ``data`` (its schema's keys; lists become tuples)."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    given = {f.name: data[key(f.name)] for f in fields}
    return cls(**{n: tuple(v) if isinstance(v, list) else v for n, v in given.items()})


def to_data(values: object) -> dict[str, Json]:
    """A values type's instance as values data (its schema's keys; tuples become lists)."""
    out: dict[str, Json] = {}
    for f in dataclasses.fields(values):  # type: ignore[arg-type]
        item = getattr(values, f.name)
        out[key(f.name)] = list(item) if isinstance(item, tuple) else item
    return out


def _without_none(hint: object) -> object:
    """``X | None`` -> ``X``; other hints unchanged."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint
