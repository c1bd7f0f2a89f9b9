"""``meshctl proxy-status``: the replicas' sync reports merged into one view, and its tables.

Owns merging (every replica's proxies, each tagged with the replica holding its stream; the
certificates of all replicas joined to each proxy by requester, the latest per identity, since
a proxy's CA call may land on another replica than its discovery stream), the rows (problems
first: a NACK, STALE or unreachable replica stands out at the top and in STATUS) and the one
proxy's detail. Invariants: pure; a replica that did not answer is a row of its own with its
error, never dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from meshctl.core.xds.syncstatus import SEVERITY, SyncState

from .syncz import IssuedFacts, Report

UNREACHABLE = "UNREACHABLE"


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """A replica that did not answer, and why (one line)."""

    control_plane: str
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Merged:
    proxies: list[dict[str, Any]]  # ProxyFacts + controlPlane + certificates
    failures: list[Failure]


def type_name(type_url: str) -> str:
    """The column for a type URL: its message name in capitals (``ADDRESS``, ...)."""
    return type_url.rsplit("/", 1)[-1].rsplit(".", 1)[-1].upper()


def merge(reports: Sequence[Report], failures: Sequence[Failure] = ()) -> Merged:
    latest: dict[tuple[str, str], IssuedFacts] = {}
    for report in reports:
        for cert in report["certificates"]:
            key = (cert["requester"], cert["identity"])
            held = latest.get(key)
            if held is None or cert["notBefore"] > held["notBefore"]:
                latest[key] = cert
    by_requester: dict[str, list[IssuedFacts]] = {}
    for (requester, _), cert in sorted(latest.items()):
        by_requester.setdefault(requester, []).append(cert)
    proxies: list[dict[str, Any]] = []
    for report in reports:
        for proxy in report["proxies"]:
            entry: dict[str, Any] = dict(proxy)
            entry["controlPlane"] = report["controlPlane"]
            entry["certificates"] = by_requester.get(proxy["requester"], [])
            proxies.append(entry)
    proxies.sort(key=_order)
    return Merged(proxies=proxies, failures=list(failures))


def _order(proxy: Mapping[str, Any]) -> tuple[int, str, str]:
    status = str(proxy.get("status", ""))
    rank = SEVERITY.index(SyncState(status)) if status in set(SEVERITY) else 0
    return rank, str(proxy.get("requester", "")), str(proxy.get("id", ""))


def soonest_expiry(certificates: Iterable[Mapping[str, str]]) -> str:
    """The earliest ``notAfter`` of a proxy's certificates ('' without any)."""
    times = sorted(c["notAfter"] for c in certificates if c.get("notAfter"))
    return times[0] if times else ""


def _expiry_cell(certificates: Sequence[Mapping[str, str]], now: datetime) -> str:
    soonest = soonest_expiry(certificates)
    if not soonest:
        return "-"
    try:
        left = datetime.fromisoformat(soonest) - now
    except ValueError:
        return soonest
    stamp = soonest[:19].replace("T", " ")
    more = f", {len(certificates)} ids" if len(certificates) > 1 else ""
    return f"{stamp} ({human(left.total_seconds())}{more})"


def human(seconds: float | None) -> str:
    """``42s``, ``5m``, ``3h``, ``2d``; negative: ``expired``; None: ``-``."""
    if seconds is None:
        return "-"
    if seconds < 0:
        return "expired"
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _type_cell(facts: Mapping[str, Any] | None) -> str:
    if facts is None:
        return "-"
    status = str(facts.get("status", "?"))
    if status == SyncState.NOT_SENT:
        return status
    return f"{status} ({human(facts.get('sentAgo'))})"


def name_of(proxy: Mapping[str, Any]) -> str:
    return str(proxy.get("requester") or proxy.get("id") or "?")


def table(merged: Merged, now: datetime) -> list[dict[str, str]]:
    """One row per proxy (problems first), then one per replica that did not answer."""
    urls = sorted({url for p in merged.proxies for url in p.get("types", {})}, key=type_name)
    rows: list[dict[str, str]] = []
    for proxy in merged.proxies:
        row = {
            "NAME": name_of(proxy),
            "KIND": str(proxy.get("kind", "")),
            "NODE": str(proxy.get("node") or "-"),
            "CONTROL PLANE": str(proxy.get("controlPlane", "")),
        }
        for url in urls:
            row[type_name(url)] = _type_cell(proxy.get("types", {}).get(url))
        row["CERT EXPIRY"] = _expiry_cell(proxy.get("certificates", []), now)
        row["STATUS"] = str(proxy.get("status", ""))
        rows.append(row)
    for failure in merged.failures:
        row = {"NAME": "-", "KIND": "-", "NODE": "-", "CONTROL PLANE": failure.control_plane}
        row.update({type_name(url): "-" for url in urls})
        row["CERT EXPIRY"] = "-"
        row["STATUS"] = UNREACHABLE
        rows.append(row)
    return rows


def problems(merged: Merged) -> list[str]:
    """One line per proxy that is not SYNCED/PENDING and per replica that did not answer."""
    lines = [f"control plane {f.control_plane} did not answer: {f.error}" for f in merged.failures]
    for proxy in merged.proxies:
        status = proxy.get("status")
        if status in (SyncState.NACK, SyncState.STALE):
            detail = ""
            for url, facts in proxy.get("types", {}).items():
                if facts.get("status") == SyncState.NACK:
                    detail += f"; {type_name(url)} refused: {facts['nacked'].get('error', '')}"
            lines.append(f"{name_of(proxy)} is {status}{detail}")
    return lines


def select(merged: Merged, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The proxies whose stream is bound to ``namespace/pod``."""
    wanted = f"{namespace}/{pod}"
    return [p for p in merged.proxies if p.get("requester") == wanted]


def node_proxies_on(merged: Merged, node: str) -> list[dict[str, Any]]:
    """The node proxies serving ``node`` (an ambient pod's proxy is its node's)."""
    return [p for p in merged.proxies if p.get("kind") == "node proxy" and p.get("node") == node]


def detail(proxy: Mapping[str, Any], now: datetime) -> list[dict[str, str]]:
    """One row per xDS type of one proxy: what was sent, ACKed, NACKed and when."""
    rows = []
    for url, facts in sorted(proxy.get("types", {}).items(), key=lambda kv: type_name(kv[0])):
        sent, acked, nacked = facts.get("sent", {}), facts.get("acked", {}), facts.get("nacked", {})
        rows.append(
            {
                "TYPE": url,
                "STATUS": str(facts.get("status", "")),
                "SENT": _exchange(sent, facts.get("sentAgo")),
                "ACKED": _exchange(acked, facts.get("ackedAgo")),
                "NACKED": _exchange(nacked, facts.get("nackedAgo")),
                "NACK ERROR": str(nacked.get("error") or "-"),
            }
        )
    return rows


def _exchange(what: Mapping[str, str], ago: float | None) -> str:
    if not what.get("nonce"):
        return "-"
    return f"v{what.get('version', '?')} nonce {what['nonce']} ({human(ago)} ago)"


def summary(proxy: Mapping[str, Any], now: datetime) -> dict[str, str]:
    """The key facts of one proxy, for the detail view's header."""
    certs = proxy.get("certificates", [])
    return {
        "proxy": name_of(proxy),
        "id": str(proxy.get("id", "")),
        "kind": str(proxy.get("kind", "")),
        "identity": str(proxy.get("identity", "")),
        "node": str(proxy.get("node") or "-"),
        "control plane": str(proxy.get("controlPlane", "")),
        "connected": f"{human(proxy.get('connectedAgo'))} ago",
        "status": str(proxy.get("status", "")),
        "certificates": "; ".join(
            f"{c['identity']} serial {c['serial']} until {c['notAfter']}" for c in certs
        )
        or "-",
        "cert expiry": _expiry_cell(certs, now),
    }


def as_data(merged: Merged) -> dict[str, Any]:
    """The ``-o json|yaml`` form."""
    return {
        "proxies": merged.proxies,
        "unreachable": [
            {"controlPlane": f.control_plane, "error": f.error} for f in merged.failures
        ],
    }
