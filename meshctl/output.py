"""Rendering data for stdout: ``-o json|yaml|table``.

Invariant: the same data renders the same text; JSON and YAML keep key order; a table is built
from a mapping (two columns) or a list of mappings (one column per key, in first-seen order).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from typing import Any


class OutputFormat(enum.StrEnum):
    """The formats a data-printing command accepts with ``-o``."""

    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


def render(data: Any, fmt: OutputFormat | str) -> str:
    """``data`` (JSON-compatible values) as text in ``fmt``, ending with a newline."""
    fmt = OutputFormat(fmt)
    if fmt is OutputFormat.JSON:
        return json.dumps(data, indent=2) + "\n"
    if fmt is OutputFormat.YAML:
        import yaml  # deferred: only YAML output pays for the import

        class _Plain(yaml.SafeDumper):
            # An object used twice in the data (a shared selector, clientConfig) is written out
            # twice: readers of our manifests should never meet &anchors and *aliases.
            def ignore_aliases(self, data: Any) -> bool:
                return True

        text: str = yaml.dump(data, Dumper=_Plain, sort_keys=False, default_flow_style=False)
        return text
    return render_table(data)


def render_objects(items: Sequence[Mapping[str, Any]], fmt: OutputFormat | str) -> str:
    """Kubernetes objects as ``kubectl apply -f`` reads them: YAML documents separated by
    ``---``, or one JSON ``v1`` List. There is no table of objects: ``ValueError``."""
    fmt = OutputFormat(fmt)
    if fmt is OutputFormat.JSON:
        return render({"apiVersion": "v1", "kind": "List", "items": list(items)}, fmt)
    if fmt is OutputFormat.TABLE:
        raise ValueError("Kubernetes objects print as yaml or json")
    return "---\n".join(render(item, fmt) for item in items)


def render_table(data: Any) -> str:
    """A plain aligned table: mappings as KEY/VALUE rows, lists of mappings as columns."""
    if isinstance(data, Mapping):
        rows = [[str(k).upper(), _cell(v)] for k, v in data.items()]
        return _align(rows)
    if isinstance(data, Sequence) and not isinstance(data, str):
        records = [r for r in data if isinstance(r, Mapping)]
        if len(records) != len(data):
            return "".join(_cell(item) + "\n" for item in data)
        columns: list[str] = []
        for record in records:
            columns.extend(k for k in record if k not in columns)
        rows = [[c.upper() for c in columns]]
        rows.extend([_cell(r.get(c, "")) for c in columns] for r in records)
        return _align(rows)
    return _cell(data) + "\n"


def _cell(value: Any) -> str:
    if isinstance(value, Mapping):
        return ",".join(f"{k}={_cell(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ",".join(_cell(v) for v in value)
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _align(rows: list[list[str]]) -> str:
    if not rows:
        return ""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = (
        "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
    return "\n".join(lines) + "\n"
