"""The summary a maintainer reads first: what the collected pods, events, logs and config dumps
show is wrong, as data (``-o json|yaml``) and as the archive's ``SUMMARY.md``.

Owns the findings: pods not ready or restarting, proxies that did not answer, Warning events,
error lines in the logs (counted per log, with the first examples), NACKs and disconnected
discovery in the proxies' dumps, and what could not be collected or was cut. Invariants: pure;
the same collection gives the same summary (examples are taken in a fixed order); it reads
text already redacted and copies at most ``EXAMPLE_CHARS`` of any line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshctl.core.bugreport import layout

EXAMPLES = 5
NOTHING_FOUND = (
    "Nothing stands out: every pod ready, every proxy answered, no Warning events, no error "
    "lines in the logs, no NACKs."
)
EXAMPLE_CHARS = 300
# meshctl's text logs ("<time> ERROR <logger>: ..."), its JSON logs ("level": "error"), Python
# tracebacks, and other programs' usual spellings.
_ERROR_LINE = re.compile(
    r"\b(?:ERROR|CRITICAL|FATAL|PANIC)\b|\"level\":\s*\"(?:error|critical|fatal)\"|"
    r"^Traceback \(most recent call last\)|\blevel=(?:error|fatal)\b"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LogText:
    namespace: str
    pod: str
    container: str
    previous: bool
    text: str  # redacted
    cut: bool = False  # the per-log cap kept only part of the window

    @property
    def member(self) -> str:
        return layout.log_member(self.namespace, self.pod, self.container, previous=self.previous)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyAnswer:
    namespace: str
    pod: str
    role: str
    dump: Mapping[str, Any] | None  # None: it did not answer
    error: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Collected:
    mesh_namespace: str
    namespaces: Sequence[str]
    since: str  # how far back logs go, for people ("1h")
    cluster_version: str
    meshctl_version: str
    pods: Sequence[Mapping[str, Any]] = ()
    events: Sequence[Mapping[str, Any]] = ()
    logs: Sequence[LogText] = ()
    proxies: Sequence[ProxyAnswer] = ()
    not_collected: Sequence[str] = ()
    cut: Sequence[str] = field(default_factory=list)
    left_out: Sequence[str] = field(default_factory=list)


def summarize(collected: Collected) -> dict[str, Any]:
    """The findings as JSON-ready data."""
    return {
        "cluster": collected.cluster_version,
        "meshctl": collected.meshctl_version,
        "meshNamespace": collected.mesh_namespace,
        "namespaces": list(collected.namespaces),
        "since": collected.since,
        "pods": len(collected.pods),
        "podsNotReady": _not_ready(collected.pods),
        "podsRestarting": _restarting(collected.pods),
        "proxies": len(collected.proxies),
        "proxiesNotAnswering": [
            {"pod": f"{p.namespace}/{p.pod}", "role": p.role, "error": p.error}
            for p in sorted(collected.proxies, key=lambda p: (p.namespace, p.pod))
            if p.dump is None
        ],
        "nacks": _nacks(collected.proxies),
        "discoveryDisconnected": _disconnected(collected.proxies),
        "warningEvents": _warnings(collected.events),
        "logErrors": _log_errors(collected.logs),
        "logsCut": sorted(log.member for log in collected.logs if log.cut),
        "notCollected": list(collected.not_collected),
        "cutBySizeCap": list(collected.cut),
        "leftOutBySizeCap": list(collected.left_out),
    }


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _not_ready(pods: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    out = []
    for pod in sorted(pods, key=layout.pod_key):
        status = pod.get("status") or {}
        if status.get("phase") == "Succeeded" or _ready(pod):
            continue
        out.append({"pod": layout.pod_key(pod), "why": _why(status)})
    return out


def _why(status: Mapping[str, Any]) -> str:
    for item in [
        *(status.get("initContainerStatuses") or ()),
        *(status.get("containerStatuses") or ()),
    ]:
        state = item.get("state") or {}
        for phase in ("waiting", "terminated"):
            detail = state.get(phase)
            if detail and detail.get("reason") not in (None, "Completed", "PodInitializing"):
                return f"container {item.get('name')} {phase}: {detail.get('reason')}"
    return str(status.get("phase") or "Pending")


def _restarting(pods: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for pod in sorted(pods, key=layout.pod_key):
        statuses = {
            str(s.get("name")): s
            for s in [
                *((pod.get("status") or {}).get("initContainerStatuses") or ()),
                *((pod.get("status") or {}).get("containerStatuses") or ()),
            ]
        }
        for container, count in sorted(layout.restarts(pod).items()):
            last = (statuses.get(container, {}).get("lastState") or {}).get("terminated") or {}
            out.append(
                {
                    "pod": layout.pod_key(pod),
                    "container": container,
                    "restarts": count,
                    "lastExit": f"{last.get('reason', '?')} ({last.get('exitCode', '?')})"
                    if last
                    else "",
                }
            )
    return out


def _types(dump: Mapping[str, Any]) -> Mapping[str, Any]:
    xds = dump.get("xds")
    types = xds.get("types") if isinstance(xds, Mapping) else None
    return types if isinstance(types, Mapping) else {}


def _nacks(proxies: Sequence[ProxyAnswer]) -> list[dict[str, Any]]:
    out = []
    for proxy in sorted(proxies, key=lambda p: (p.namespace, p.pod)):
        if proxy.dump is None:
            continue
        for type_url, facts in sorted(_types(proxy.dump).items()):
            nacks = facts.get("nacks") if isinstance(facts, Mapping) else None
            if isinstance(nacks, int) and nacks > 0:
                out.append(
                    {
                        "pod": f"{proxy.namespace}/{proxy.pod}",
                        "type": str(type_url).rsplit(".", 1)[-1],
                        "nacks": nacks,
                        "lastNack": _short(str(facts.get("lastNack") or "")),
                    }
                )
    return out


def _disconnected(proxies: Sequence[ProxyAnswer]) -> list[dict[str, str]]:
    out = []
    for proxy in sorted(proxies, key=lambda p: (p.namespace, p.pod)):
        xds = proxy.dump.get("xds") if proxy.dump is not None else None
        if isinstance(xds, Mapping) and xds and xds.get("connected") is False:
            out.append(
                {
                    "pod": f"{proxy.namespace}/{proxy.pod}",
                    "lastError": _short(str(xds.get("lastError") or "")),
                }
            )
    return out


def _warnings(events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    warnings = [e for e in events if e.get("type") == "Warning"]
    warnings.sort(key=_event_time, reverse=True)
    examples = []
    for event in warnings[:EXAMPLES]:
        involved = event.get("involvedObject") or {}
        where = (
            f"{involved.get('namespace') or (event.get('metadata') or {}).get('namespace', '')}/"
            f"{involved.get('kind', '?')}/{involved.get('name', '?')}"
        )
        count = event.get("count")
        times = f" (x{count})" if isinstance(count, int) and count > 1 else ""
        message = " ".join(str(event.get("message") or "").split())
        examples.append(_short(f"{where}: {event.get('reason', '')}: {message}{times}"))
    return {"count": len(warnings), "examples": examples}


def _event_time(event: Mapping[str, Any]) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


def error_lines(text: str) -> list[str]:
    """The lines of a log that report an error."""
    return [line for line in text.splitlines() if _ERROR_LINE.search(line)]


def _log_errors(logs: Sequence[LogText]) -> dict[str, Any]:
    by_log: dict[str, int] = {}
    examples: list[str] = []
    for log in sorted(logs, key=lambda item: item.member):
        found = error_lines(log.text)
        if not found:
            continue
        by_log[log.member] = len(found)
        for line in found[: max(0, EXAMPLES - len(examples))]:
            examples.append(_short(f"{log.namespace}/{log.pod}/{log.container}: {line.strip()}"))
    return {"count": sum(by_log.values()), "byLog": by_log, "examples": examples}


def _short(text: str) -> str:
    return text if len(text) <= EXAMPLE_CHARS else text[: EXAMPLE_CHARS - 3] + "..."


# --- SUMMARY.md -------------------------------------------------------------------------------


def markdown(summary: Mapping[str, Any], archive: str = "") -> str:
    """``SUMMARY.md``: findings first, then what the report holds and what it could not get."""
    lines = ["# meshctl bug report", ""]
    namespaces = ", ".join(summary["namespaces"]) or "(none meshed)"
    if archive:
        lines += [f"Archive: {archive}", ""]
    lines += [
        f"- meshctl {summary['meshctl']}, Kubernetes {summary['cluster']}",
        f"- mesh namespace {summary['meshNamespace']}; namespaces {namespaces}",
        f"- logs since {summary['since']}; {summary['pods']} pods, {summary['proxies']} proxies",
        "",
        "## Findings",
        "",
    ]
    findings = _findings(summary)
    lines += findings or [NOTHING_FOUND]
    lines.append("")
    gaps = [
        *(f"- not collected: {n}" for n in summary["notCollected"]),
        *(f"- log cut by the per-log cap (oldest lines dropped): {n}" for n in summary["logsCut"]),
        *(f"- cut by the total size cap: {n}" for n in summary["cutBySizeCap"]),
        *(f"- left out by the total size cap: {n}" for n in summary["leftOutBySizeCap"]),
    ]
    if gaps:
        lines += ["## What this report lacks", "", *gaps, ""]
    return "\n".join(lines)


def _findings(summary: Mapping[str, Any]) -> list[str]:
    out: list[str] = []

    def section(title: str, items: Sequence[str]) -> None:
        if items:
            out.extend([f"### {title}", "", *(f"- {i}" for i in items), ""])

    section("Pods not ready", [f"{p['pod']}: {p['why']}" for p in summary["podsNotReady"]])
    section(
        "Containers that restarted",
        [
            f"{p['pod']} {p['container']}: {p['restarts']} restarts"
            + (f", last exit {p['lastExit']}" if p["lastExit"] else "")
            for p in summary["podsRestarting"]
        ],
    )
    section(
        "Proxies that did not answer",
        [f"{p['pod']} ({p['role']}): {p['error']}" for p in summary["proxiesNotAnswering"]],
    )
    section(
        "NACKs in the proxies' config dumps",
        [
            f"{n['pod']} {n['type']}: {n['nacks']} NACKs, last: {n['lastNack']}"
            for n in summary["nacks"]
        ],
    )
    section(
        "Proxies disconnected from discovery",
        [
            f"{d['pod']}: {d['lastError'] or 'no error recorded'}"
            for d in summary["discoveryDisconnected"]
        ],
    )
    warnings = summary["warningEvents"]
    if warnings["count"]:
        section(f"Warning events: {warnings['count']} (newest first)", warnings["examples"])
    errors = summary["logErrors"]
    if errors["count"]:
        per_log = [f"{name}: {count}" for name, count in errors["byLog"].items()]
        section(f"Error lines in the logs: {errors['count']}", per_log)
        section("First error lines", errors["examples"])
    return out
