"""Block-style YAML text of plain data, byte for byte what PyYAML's libyaml dumper writes with
``meshctl.output``'s settings, several times faster (the ``inject -f`` rate depends on it).

Owns the fast path of ``output.yaml_documents``: mappings and lists are laid out here, and each
distinct scalar is rendered once, by libyaml itself for anything but the common case (ASCII text,
numbers, booleans, null), then reused. Invariant: the text is libyaml's; a value this writer is
not sure to lay out the same way (a multi-line or very long string, a long key, a type that is
not JSON's) makes ``block_yaml`` return None, and the caller dumps that document with PyYAML.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import yaml
from yaml.nodes import ScalarNode

_STR = "tag:yaml.org,2002:str"
# A plain scalar cannot start with these (YAML 1.1 indicators: PyYAML's analyze_scalar).
_BAD_FIRST = frozenset("#,[]{}&*!|>'\"%@`")
_ASCII_LINE = re.compile(r"[\x20-\x7e]+\Z")
_LONGEST = 1 << 16  # far below libyaml's fold width (1<<20): a longer string takes the slow path
_LONGEST_KEY = 120  # libyaml writes a key longer than 128 as "? key" (not a simple key)
_CACHE_ENTRIES = 8192  # per cache, cleared when full: memory stays flat over a long stream
_CACHED_LENGTH = 256  # longer strings are rarely written twice (names, JSON annotations)
_BREAKS = re.compile("[\r\x85\u2028\u2029]")  # line breaks to YAML besides "\n"


class _Unsupported(Exception):  # noqa: N818 -- a signal, caught in this module only
    """A value this writer does not lay out: the whole document goes to PyYAML."""


def reference_dumper() -> Any:
    """PyYAML's dumper as ``meshctl.output`` uses it: libyaml's, writing shared objects in
    full (no ``&id001`` anchors)."""
    base: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

    class Dumper(base):  # type: ignore[misc]
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return Dumper


_DUMPER = reference_dumper()
_RESOLVE: Callable[..., str] = yaml.resolver.Resolver().resolve


def reference(value: Any) -> str:
    """``value`` as PyYAML writes it with the settings every meshctl command prints YAML with."""
    return yaml.dump(
        value,
        Dumper=_DUMPER,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=1 << 20,  # long annotation values (JSON) stay on one line
    )


class BlockWriter:
    """Writes documents; keeps the rendering of each scalar seen (bounded)."""

    def __init__(self) -> None:
        self._values: dict[Any, str] = {}
        self._keys: dict[Any, str] = {}

    def block_yaml(self, value: Any) -> str | None:
        """``value`` as one YAML document, or None when PyYAML must write it."""
        out: list[str] = []
        try:
            if value.__class__ is dict and value:
                self._mapping(value, 0, "", out)
            elif value.__class__ is list and value:
                self._sequence(value, 0, "", out)
            else:
                return None
        except (_Unsupported, RecursionError):
            return None
        return "".join(out)

    def _mapping(self, data: dict[Any, Any], indent: int, first: str, out: list[str]) -> None:
        pad = " " * indent
        start = first
        keys, values = self._keys, self._values
        for key, value in data.items():
            key_text = keys.get(key)  # only strings are remembered: 1 and True find nothing
            if key_text is None:
                key_text = self._key(key)
            kind = value.__class__
            if kind is str:  # most values: one lookup
                text = values.get(value)
                if text is None:
                    text = self._scalar(value)
                out.append(f"{start}{key_text}: {text}\n")
            elif kind is dict:
                if value:
                    out.append(f"{start}{key_text}:\n")
                    self._mapping(value, indent + 2, pad + "  ", out)
                else:
                    out.append(f"{start}{key_text}: {{}}\n")
            elif kind is list:
                if value:
                    out.append(f"{start}{key_text}:\n")
                    self._sequence(value, indent, pad, out)  # libyaml: indentless in a mapping
                else:
                    out.append(f"{start}{key_text}: []\n")
            else:
                out.append(f"{start}{key_text}: {self._scalar(value)}\n")
            start = pad

    def _sequence(self, data: list[Any], indent: int, first: str, out: list[str]) -> None:
        pad = " " * indent
        start = first
        values = self._values
        for value in data:
            kind = value.__class__
            if kind is dict:
                if value:
                    self._mapping(value, indent + 2, start + "- ", out)
                else:
                    out.append(f"{start}- {{}}\n")
            elif kind is str:
                text = values.get(value)
                if text is None:
                    text = self._scalar(value)
                out.append(f"{start}- {text}\n")
            elif kind is list:
                if value:
                    self._sequence(value, indent + 2, start + "- ", out)
                else:
                    out.append(f"{start}- []\n")
            else:
                out.append(f"{start}- {self._scalar(value)}\n")
            start = pad

    def _scalar(self, value: Any) -> str:
        kind = value.__class__
        if kind is str:
            text = _ascii_text(value)
            if text is None:
                text = _rendered(value)
            if len(value) <= _CACHED_LENGTH:
                self._remember(self._values, value, text)
            return text
        if kind is bool:
            return "true" if value else "false"
        if kind is int:
            return str(value)
        if value is None:
            return "null"
        if kind is float:
            return _rendered(value)
        raise _Unsupported

    def _key(self, key: Any) -> str:
        kind = key.__class__
        if kind is str and len(key) <= _LONGEST_KEY:
            text = _ascii_text(key)
            if text is not None:
                self._remember(self._keys, key, text)
                return text
        if kind not in (str, int, bool, float) and key is not None:
            raise _Unsupported
        rendered = reference({key: 0})
        if not rendered.endswith(": 0\n") or "\n" in rendered[:-4] or rendered.startswith("? "):
            raise _Unsupported
        if kind is str:
            self._remember(self._keys, key, rendered[:-4])
        return rendered[:-4]

    @staticmethod
    def _remember(cache: dict[Any, str], value: Any, text: str) -> None:
        if len(cache) >= _CACHE_ENTRIES:
            cache.clear()
        cache[value] = text


def _ascii_text(value: str) -> str | None:
    """A printable one-line ASCII string as libyaml writes it in block context (plain when
    that reads back as the same string, else single-quoted), or None for any other string."""
    if not value or len(value) > _LONGEST or not _ASCII_LINE.match(value):
        return None
    first = value[0]
    plain = not (
        first == " "
        or value[-1] == " "
        or first in _BAD_FIRST
        or value.startswith(("---", "..."))
        or (first in "?:-" and (len(value) == 1 or value[1] == " "))
        or ": " in value
        or value[-1] == ":"
        or " #" in value
    )
    if plain and _RESOLVE(ScalarNode, value, (True, False)) == _STR:
        return value
    return "'" + value.replace("'", "''") + "'"


def _rendered(value: Any) -> str:
    """One scalar rendered by libyaml as a mapping value, when that is one line."""
    if isinstance(value, str) and len(value) > _LONGEST:
        raise _Unsupported
    text = reference({"k": value})
    if not text.startswith("k: ") or text.count("\n") != 1 or _BREAKS.search(text):
        raise _Unsupported  # a multi-line string: its lines depend on the indentation
    return text[3:-1]
