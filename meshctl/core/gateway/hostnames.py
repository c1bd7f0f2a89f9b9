"""Hostnames of listeners, routes and requests: normalising, wildcard matching, intersection and
precedence, by the Gateway API's and Ingress's rules.

Owns what a hostname pattern means. A pattern is an exact name, ``*.`` and a suffix, or ``ANY``
(``*``, the absent hostname, which matches every host). For the Gateway API a wildcard stands for
one or more labels (``*.example.com`` matches ``a.example.com`` and ``a.b.example.com``, never
``example.com``); for Ingress exactly one (``one_label``). Invariants: pure; names compare
lower-case, without a port and without a trailing dot.
"""

from __future__ import annotations

ANY = "*"


def request_host(authority: str) -> str:
    """The host a request names (``Host`` or ``:authority``) as patterns see it: lower-case,
    without the port (the Gateway API ignores it) or a trailing dot; IPv6 literals keep their
    brackets."""
    host = authority.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[: end + 1] if end != -1 else host
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit():
        host = name
    return host.rstrip(".")


def server_name_host(server_name: str) -> str:
    """A TLS server name (SNI) as patterns see it: lower-case, without a trailing dot (RFC 6066
    §3 forbids one; a client that sends it anyway names the same host). "" stays "": no SNI."""
    return server_name.lower().rstrip(".")


def is_wildcard(pattern: str) -> bool:
    return pattern.startswith("*.")


def matches(pattern: str, host: str, *, one_label: bool = False) -> bool:
    """``host`` (normalised, exact) is named by ``pattern``."""
    if pattern == ANY:
        return True
    if not is_wildcard(pattern):
        return host == pattern
    suffix = pattern[1:]  # ".example.com"
    if len(host) <= len(suffix) or not host.endswith(suffix):
        return False
    return not one_label or "." not in host[: -len(suffix)]


def covers(wide: str, narrow: str, *, one_label: bool = False) -> bool:
    """Every host ``narrow`` names is named by ``wide`` too."""
    if wide == ANY:
        return True
    if narrow == ANY:
        return False
    if not is_wildcard(narrow):
        return matches(wide, narrow, one_label=one_label)
    if not is_wildcard(wide):
        return False
    if narrow == wide:
        return True
    # ``*.a.example.com`` names hosts of two or more labels before ``example.com``: inside
    # ``*.example.com`` when a wildcard spans labels, never when it is one label (Ingress).
    return not one_label and matches(wide, narrow[2:])


def intersection(a: str, b: str, *, one_label: bool = False) -> str | None:
    """The pattern naming the hosts both name, or None. Two patterns either nest or are
    disjoint (wildcards are suffixes), so the answer is the narrower of the two."""
    if covers(a, b, one_label=one_label):
        return b
    if covers(b, a, one_label=one_label):
        return a
    return None


def precedence(pattern: str) -> tuple[int, int, int, str]:
    """Sort key, most specific first: exact names, then wildcards with more labels (and
    characters) after the ``*``, then ``ANY``; ties by name so that the order is total."""
    if pattern == ANY:
        return (2, 0, 0, pattern)
    if is_wildcard(pattern):
        return (1, -pattern.count("."), -len(pattern), pattern)
    return (0, 0, -len(pattern), pattern)


def best(patterns: list[str], host: str, *, one_label: bool = False) -> str | None:
    """The most specific of ``patterns`` that names ``host``, or None."""
    named = [p for p in patterns if matches(p, host, one_label=one_label)]
    return min(named, key=precedence) if named else None
