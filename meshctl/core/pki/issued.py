"""What the CA last signed, per requester and identity: the certificate expiry ``meshctl
proxy-status`` shows beside each proxy.

Owns the record (requester, identity, serial, validity) and its bound. A requester is the pod a
caller's token is bound to (``namespace/pod``), else its service account (``namespace/sa``):
the same key a discovery stream of that caller has, so the two join. Invariants: pure; one entry
per (requester, identity), the latest signing replaces the earlier one; at most ``limit``
entries, the least recently signed dropped first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

from .callers import Caller

_LIMIT = 50_000


def requester_of(caller: Caller) -> str:
    """``namespace/pod`` for a pod-bound token, else ``namespace/service-account``."""
    return f"{caller.namespace}/{caller.pod_name}" if caller.pod_name else caller.account


@dataclass(frozen=True, slots=True, kw_only=True)
class Issued:
    requester: str
    identity: str  # SPIFFE id
    serial: str  # hex
    not_before: datetime
    not_after: datetime

    def facts(self) -> dict[str, str]:
        return {
            "requester": self.requester,
            "identity": self.identity,
            "serial": self.serial,
            "notBefore": self.not_before.isoformat(),
            "notAfter": self.not_after.isoformat(),
        }


class IssuedLedger:
    """The latest certificate signed for each (requester, identity)."""

    __slots__ = ("_entries", "_limit")

    def __init__(self, limit: int = _LIMIT) -> None:
        self._entries: OrderedDict[tuple[str, str], Issued] = OrderedDict()
        self._limit = limit

    def record(self, issued: Issued) -> None:
        key = (issued.requester, issued.identity)
        self._entries.pop(key, None)
        self._entries[key] = issued
        while len(self._entries) > self._limit:
            self._entries.popitem(last=False)

    def entries(self) -> list[Issued]:
        return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)
