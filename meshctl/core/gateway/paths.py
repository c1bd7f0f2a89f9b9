"""Request paths: the Gateway API's and Ingress's path matches, prefix replacement and the dot
segments a path may carry.

Owns the path rules and the normalisation before them (unreserved escapes decoded, dot
segments resolved). ``Exact`` is the whole path, case-sensitive (``/foo`` is not ``/foo/``);
a prefix matches element by element on ``/``, ignoring one trailing ``/`` of the prefix:
``/foo`` and ``/foo/`` both match ``/foo``, ``/foo/`` and ``/foo/bar``, never ``/foobar``; ``/``
matches every path. ``replace_prefix`` follows the API's ReplacePrefixMatch table. Invariant:
pure string functions; a path is origin-form, without its query.
"""

from __future__ import annotations


def exact_matches(value: str, path: str) -> bool:
    return path == value


def prefix_matches(prefix: str, path: str) -> bool:
    """``path`` starts with the elements of ``prefix`` (a trailing ``/`` of it ignored)."""
    base = prefix.rstrip("/")
    return not base or path == base or path.startswith(base + "/")


def replace_prefix(path: str, prefix: str, replacement: str) -> str:
    """``path`` (matched by ``prefix``) with the prefix's elements replaced by ``replacement``:
    ``/foo/bar`` with ``/foo`` -> ``/xyz`` gives ``/xyz/bar``; an empty result is ``/``."""
    rest = path[len(prefix.rstrip("/")) :]
    return (replacement.rstrip("/") + rest) or "/"


_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def decode_unreserved(path: str) -> str:
    """RFC 3986 section 6.2.2.2: percent-encoded unreserved characters are those characters
    (``/%61dmin`` is ``/admin``, ``%2E%2E`` is ``..``); every other escape is kept as sent
    (``%2F`` is not a separator), its hex digits upper-cased."""
    if "%" not in path:
        return path
    out = []
    i = 0
    while i < len(path):
        escape = path[i + 1 : i + 3]
        if (
            path[i] == "%"
            and len(escape) == 2
            and all(c in "0123456789abcdefABCDEF" for c in escape)
        ):
            char = chr(int(escape, 16))
            out.append(char if char in _UNRESERVED else "%" + escape.upper())
            i += 3
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def normalize(path: str) -> str:
    """The path as matched and forwarded: unreserved escapes decoded, then dot segments
    resolved, so that neither ``/public/../admin`` nor ``/%2e%2e/admin`` slips past a route
    for ``/admin``."""
    return remove_dot_segments(decode_unreserved(path))


def remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4: ``.`` and ``..`` segments resolved, so that ``/public/../admin`` is
    matched (and forwarded) as ``/admin``, the path a backend would serve. Never climbs above
    ``/``; empty segments (``//``) are kept, as the backend sees them."""
    if not path.startswith("/"):
        path = "/" + path
    segments = path.split("/")[1:]
    out: list[str] = []
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment in (".", ".."):
            if segment == ".." and out:
                out.pop()
            if last:
                out.append("")  # "/a/." and "/a/b/.." name the directory: "/a/"
            continue
        out.append(segment)
    return "/" + "/".join(out)


def invalid_path(value: str) -> str:
    """Why ``value`` cannot be an Exact or PathPrefix match (the API's own validation), or ""."""
    if not value.startswith("/"):
        return f"path {value!r} does not start with '/'"
    for bad in ("//", "/./", "/../", "%2f", "%2F", "#"):
        if bad in value:
            return f"path {value!r} contains {bad!r}"
    if value.endswith(("/..", "/.")):
        return f"path {value!r} ends with a dot segment"
    return ""
