"""The limits on input a user or a peer controls, their one-line errors, and JSON read within
them: the base of the one bounded reader (YAML: ``meshctl.yamlread``; files and stdin:
``meshctl.inputs``).

Owns the limits (bytes held at once, nesting depth, values per document with YAML aliases
written out in full), how env vars raise them, and the errors users see: ``SOURCE:LINE:
problem`` for a limit or a structure, ``SOURCE: invalid JSON|YAML at line N, column M:
problem`` for a syntax error. Invariants: pure (text or bytes in; plain ``dict``/``list``/scalar
values out; no files; env only as a mapping handed in); every failure is an ``InputError``
(exit 2 unless a caller says the input is something else), one line, with a hint.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from meshctl.errors import UserError

# A JSON value, as these readers return it and as manifests are built: read-only containers
# (covariant), so a ``dict[str, str]`` or a list of them is one as it is, without a copy.
Json: TypeAlias = "str | int | float | bool | Sequence[Json] | Mapping[str, Json] | None"

DEFAULT_MAX_BYTES = 32 << 20
DEFAULT_MAX_DEPTH = 100
DEFAULT_MAX_NODES = 1_000_000
# Past this, the recursive walks downstream (copying, printing) would reach Python's own
# recursion limit; libyaml refuses deeper than 1000 levels of syntax anyway.
DEPTH_CEILING = 250
BYTES_CEILING = 1 << 40

ENV_MAX_BYTES = "MESHCTL_MAX_INPUT_BYTES"
ENV_MAX_DEPTH = "MESHCTL_MAX_INPUT_DEPTH"
ENV_MAX_NODES = "MESHCTL_MAX_INPUT_NODES"
LIMITS_HINT = (
    f"if the input is genuine, raise the limit with ${ENV_MAX_BYTES}, ${ENV_MAX_DEPTH} or "
    f"${ENV_MAX_NODES} (docs/cli.md)"
)
_SIZE_UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
_SIZE_UNITS |= {"K": 10**3, "M": 10**6, "G": 10**9}
_DIGITS = 15  # more is no limit anyone means (and int() refuses past 4,300 digits)


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """How much one input may make a command do (docs/cli.md, "Input limits")."""

    max_bytes: int = DEFAULT_MAX_BYTES  # a file held whole; one document of a stream
    max_depth: int = DEFAULT_MAX_DEPTH  # nesting of mappings and lists, through aliases
    max_nodes: int = DEFAULT_MAX_NODES  # per document, every alias written out in full


class InputError(UserError):
    """Input we refuse: one line naming the source (and the line), with a hint."""

    def __init__(
        self, source: str, problem: str, *, line: int | None = None, hint: str | None = None
    ) -> None:
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {problem}", hint=hint or "fix the input there")
        self.source, self.line, self.problem = source, line, problem


def limits_from_env(env: Mapping[str, str]) -> Limits:
    """The limits, with any of ``MESHCTL_MAX_INPUT_{BYTES,DEPTH,NODES}`` set in ``env``."""
    values: dict[str, int] = {}
    for name, field, parse in (
        (ENV_MAX_BYTES, "max_bytes", _size),
        (ENV_MAX_DEPTH, "max_depth", _whole),
        (ENV_MAX_NODES, "max_nodes", _whole),
    ):
        raw = env.get(name, "").strip()
        if not raw:
            continue
        value = parse(raw)
        ceiling = {"max_depth": DEPTH_CEILING, "max_bytes": BYTES_CEILING}.get(field)
        if value is None or value < 1 or (ceiling is not None and value > ceiling):
            allowed = f"1-{ceiling}" if field != "max_bytes" else "a size up to 1Ti, e.g. 64Mi"
            raise UserError(f"env {name}: invalid value {raw!r} ({allowed})", hint=LIMITS_HINT)
        values[field] = value
    return Limits(**values)


def _whole(raw: str) -> int | None:
    return int(raw) if raw.isdigit() and len(raw) <= _DIGITS else None


def _size(raw: str) -> int | None:
    number = raw.rstrip("KMGTi")
    unit = raw[len(number) :]
    if not number.isdigit() or len(number) > _DIGITS or unit not in _SIZE_UNITS:
        return None
    return int(number) * _SIZE_UNITS[unit]


def size_text(size: int) -> str:
    """``32Mi``, ``512Ki`` or bytes: how limits are written in messages and env vars."""
    for unit in ("Ti", "Gi", "Mi", "Ki"):
        if size % _SIZE_UNITS[unit] == 0:
            return f"{size // _SIZE_UNITS[unit]}{unit}"
    return f"{size} bytes"


def too_large(source: str, limits: Limits) -> InputError:
    return InputError(
        source,
        f"larger than {size_text(limits.max_bytes)} (the limit for input held at once)",
        hint=f"split the input, or raise the limit with ${ENV_MAX_BYTES} (e.g. 256Mi)",
    )


def decode(data: bytes, source: str) -> str:
    """UTF-8 text (a leading byte-order mark dropped), or an ``InputError`` naming the line."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(
            source,
            f"not UTF-8 text (byte {exc.start} cannot be decoded; binary data?)",
            line=line,
            hint="give a UTF-8 text file",
        ) from None


# --- JSON ---------------------------------------------------------------------------------------


def load_json(data: bytes | str, source: str, limits: Limits = Limits()) -> Any:
    """One JSON value, or an ``InputError`` (syntax, encoding, size, depth) in one line."""
    if len(data) > limits.max_bytes:
        raise too_large(source, limits)
    text = decode(data, source) if isinstance(data, bytes) else data
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            source,
            f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
            hint="fix the JSON there",
        ) from None
    except RecursionError:
        raise _too_deep(source, None, limits) from None
    except ValueError as exc:  # numbers beyond int's digit limit and the like
        raise InputError(source, f"invalid JSON: {exc}", hint="fix the JSON") from None
    _check_depth(value, source, limits)
    return value


def _check_depth(value: Any, source: str, limits: Limits) -> None:
    """Iterative: JSON has no aliases, so depth is the only thing left to bound."""
    if not isinstance(value, dict | list):
        return
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limits.max_depth:
            raise _too_deep(source, None, limits)
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))


def _too_deep(source: str, line: int | None, limits: Limits) -> InputError:
    return InputError(
        source,
        f"nested deeper than {limits.max_depth} levels",
        line=line,
        hint=f"flatten the input, or raise the limit with ${ENV_MAX_DEPTH} "
        f"(at most {DEPTH_CEILING})",
    )


# --- YAML ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Document:
    """One YAML document: its value and the 1-based line it starts on; when it is a mapping
    with an ``items`` list (a ``v1 List``), the line of each item."""

    data: Any
    line: int
    item_lines: tuple[int, ...] = ()
