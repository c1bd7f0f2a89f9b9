"""What a rule's filters do to a request and its response, as pure functions the proxy calls:
header modifiers, the redirect's ``Location`` and the URL rewrite.

Owns the Gateway API's filter semantics. Header modifiers: ``set`` replaces every value of a
name, ``add`` appends a value, ``remove`` drops every value, names case-insensitive, in that
order (set, add, remove). Redirect port: the filter's, else the well-known port of a scheme the
filter sets, else the listener's; left out of ``Location`` for http:80 and https:443. Path
modifiers: ``ReplaceFullPath`` replaces the path, ``ReplacePrefixMatch`` replaces the matched
prefix element-wise. Invariant: pure; the query string is kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import paths
from .model import HeaderModifier, PathModifier, PathModifierType, Redirect, Rewrite

Headers = tuple[tuple[str, str], ...]
_WELL_KNOWN = {"http": 80, "https": 443}


def modify_headers(headers: Sequence[tuple[str, str]], modifier: HeaderModifier) -> Headers:
    """``headers`` (name, value) with the modifier applied; untouched names keep their order."""
    replaced = {name.lower(): (name, value) for name, value in modifier.set}
    removed = {name.lower() for name in modifier.remove}
    out: list[tuple[str, str]] = []
    written: set[str] = set()
    for name, value in headers:
        key = name.lower()
        if key in removed:
            continue
        if key in replaced:
            if key not in written:
                out.append(replaced[key])
                written.add(key)
            continue
        out.append((name, value))
    out.extend(pair for key, pair in replaced.items() if key not in written and key not in removed)
    out.extend((name, value) for name, value in modifier.add if name.lower() not in removed)
    return tuple(out)


def modified_path(path: str, modifier: PathModifier | None, matched_prefix: str) -> str:
    """The path after a redirect's or rewrite's path modifier (``path`` unchanged without one).
    ``matched_prefix`` is the PathPrefix the request matched (``ReplacePrefixMatch`` needs one)."""
    if modifier is None:
        return path
    if modifier.type is PathModifierType.FULL:
        return modifier.value
    return paths.replace_prefix(path, matched_prefix, modifier.value)


def redirect_location(
    redirect: Redirect,
    *,
    scheme: str,
    host: str,
    listener_port: int,
    path: str,
    query: str,
    matched_prefix: str,
) -> str:
    """The ``Location`` of a redirect for a request (``host`` without its port)."""
    target_scheme = redirect.scheme or scheme
    if redirect.port:
        port = redirect.port
    elif redirect.scheme:
        port = _WELL_KNOWN.get(redirect.scheme, listener_port)
    else:
        port = listener_port
    authority = redirect.hostname or host
    if _WELL_KNOWN.get(target_scheme) != port:
        authority = f"{authority}:{port}"
    target = modified_path(path, redirect.path, matched_prefix)
    return f"{target_scheme}://{authority}{target}" + (f"?{query}" if query else "")


def rewritten(
    rewrite: Rewrite | None, *, host: str, path: str, matched_prefix: str
) -> tuple[str, str]:
    """(Host, path) as forwarded upstream after a URL rewrite (both unchanged without one)."""
    if rewrite is None:
        return host, path
    return rewrite.hostname or host, modified_path(path, rewrite.path, matched_prefix)
