"""A unified diff of two texts for people: ``-``/``+`` lines in red/green when colour is on.

Pure text in, text out; the caller decides whether the terminal wants colour.
"""

from __future__ import annotations

import difflib

_RED = "\x1b[31m"
_GREEN = "\x1b[32m"
_CYAN = "\x1b[36m"
_BOLD = "\x1b[1m"
_RESET = "\x1b[0m"


def unified_diff(before: str, after: str, *, from_name: str, to_name: str, colour: bool) -> str:
    """``diff -u``-style text of ``before`` -> ``after``; empty when they are equal."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=from_name,
        tofile=to_name,
    )
    out: list[str] = []
    for line in lines:
        text = line if line.endswith("\n") else line + "\n"
        if not colour:
            out.append(text)
            continue
        body = text[:-1]
        if line.startswith(("---", "+++")):
            out.append(f"{_BOLD}{body}{_RESET}\n")
        elif line.startswith("@@"):
            out.append(f"{_CYAN}{body}{_RESET}\n")
        elif line.startswith("-"):
            out.append(f"{_RED}{body}{_RESET}\n")
        elif line.startswith("+"):
            out.append(f"{_GREEN}{body}{_RESET}\n")
        else:
            out.append(text)
    return "".join(out)
