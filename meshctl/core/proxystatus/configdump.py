"""``meshctl proxy-config``: a proxy's ``/config_dump`` (ztunnel's shapes, ``core.wire.dump``;
it may come from a proxy we did not build, ztunnel itself included) as tables, whole or as one
pod's view of a node proxy.

Owns the five sections: workloads, services, policies, certs, listeners; and the per-pod view
of a node proxy (ztunnel's): the pod's own certificate and listeners from ``workloadState``, and
the policies that apply to it. Invariants: pure; any field may be absent or of the wrong type
(a reader never trusts the dump): missing facts are ``-``, a dump that is not an object or has
no such section is a ``DumpError`` naming what is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SECTIONS = ("workloads", "services", "policies", "certs", "listeners")


class DumpError(ValueError):
    """The dump lacks what a section needs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRef:
    """The pod whose view of a node proxy is shown."""

    namespace: str
    name: str


def _list(dump: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = dump.get(key)
    if isinstance(value, Mapping):  # older ztunnels keyed these sections (as istioctl accepts)
        value = list(value.values())
    if not isinstance(value, list):
        raise DumpError(f"the proxy's config_dump has no {key!r} list")
    return [v for v in value if isinstance(v, Mapping)]


def _s(value: object) -> str:
    if value is None or value in ("", []):
        return "-"
    if isinstance(value, list):
        return ",".join(_s(v) for v in value)
    return str(value)


def workload_identity(w: Mapping[str, Any]) -> str:
    td = w.get("trustDomain") or "cluster.local"
    return f"spiffe://{td}/ns/{w.get('namespace', '?')}/sa/{w.get('serviceAccount') or 'default'}"


def pod_entry(dump: Mapping[str, Any], pod: PodRef) -> Mapping[str, Any]:
    """The node proxy's ``workloadState`` entry of ``pod`` (ztunnel's per-pod state)."""
    state = dump.get("workloadState")
    if not isinstance(state, Mapping):
        raise DumpError("this proxy's config_dump has no workloadState (it is not a node proxy)")
    for entry in state.values():
        info = entry.get("info") if isinstance(entry, Mapping) else None
        if (
            isinstance(info, Mapping)
            and info.get("namespace") == pod.namespace
            and info.get("name") == pod.name
        ):
            found: Mapping[str, Any] = entry
            return found
    raise DumpError(f"the node proxy has not enrolled pod {pod.namespace}/{pod.name}")


def workloads(dump: Mapping[str, Any]) -> list[dict[str, str]]:
    rows = [
        {
            "NAME": _s(w.get("name")),
            "NAMESPACE": _s(w.get("namespace")),
            "IP": _s(w.get("workloadIps")),
            "NODE": _s(w.get("node")),
            "PROTOCOL": _s(w.get("protocol")),
            "IDENTITY": workload_identity(w),
        }
        for w in _list(dump, "workloads")
    ]
    return sorted(rows, key=lambda r: (r["NAMESPACE"], r["NAME"]))


def services(dump: Mapping[str, Any]) -> list[dict[str, str]]:
    rows = []
    for s in _list(dump, "services"):
        vips = s.get("vips")  # ztunnel's NetworkAddress: "<network>/<ip>"
        ports = s.get("ports")
        endpoints = s.get("endpoints")
        rows.append(
            {
                "NAME": _s(s.get("name")),
                "NAMESPACE": _s(s.get("namespace")),
                "VIPS": _s([str(v).rpartition("/")[2] for v in vips])
                if isinstance(vips, list)
                else "-",
                "PORTS": _s([f"{p}->{t}" for p, t in ports.items()])
                if isinstance(ports, Mapping)
                else "-",
                "ENDPOINTS": str(len(endpoints)) if isinstance(endpoints, Mapping) else "-",
            }
        )
    return sorted(rows, key=lambda r: (r["NAMESPACE"], r["NAME"]))


def _applies(policy: Mapping[str, Any], workload: Mapping[str, Any] | None) -> bool:
    if workload is None:
        return True
    scope = policy.get("scope")
    key = f"{policy.get('namespace')}/{policy.get('name')}"
    if scope == "Global":
        return True
    if scope == "Namespace":
        return policy.get("namespace") == workload.get("namespace")
    named = workload.get("authorizationPolicies")
    return isinstance(named, list) and key in named


def find_workload(dump: Mapping[str, Any], pod: PodRef) -> Mapping[str, Any] | None:
    for w in _list(dump, "workloads"):
        if w.get("namespace") == pod.namespace and w.get("name") == pod.name:
            return w
    return None


def policies(dump: Mapping[str, Any], pod: PodRef | None = None) -> list[dict[str, str]]:
    """Every policy the proxy holds; with ``pod``, those that apply to that pod."""
    workload = find_workload(dump, pod) if pod is not None else None
    if pod is not None and workload is None:
        raise DumpError(f"the proxy holds no workload for pod {pod.namespace}/{pod.name}")
    rows = []
    for p in _list(dump, "policies"):
        if not _applies(p, workload):
            continue
        rules = p.get("rules")
        rows.append(
            {
                "NAME": _s(p.get("name")),
                "NAMESPACE": _s(p.get("namespace")),
                "SCOPE": _s(p.get("scope")),
                "ACTION": _s(p.get("action")) + (" (dry run)" if p.get("dryRun") else ""),
                "RULES": str(len(rules)) if isinstance(rules, list) else "-",
            }
        )
    return sorted(rows, key=lambda r: (r["NAMESPACE"], r["NAME"]))


def _cert_rows(summary: Mapping[str, Any]) -> list[dict[str, str]]:
    rows = []
    for role, key in (("chain", "certChain"), ("root", "rootCerts")):
        certs = summary.get(key)
        for index, cert in enumerate(certs if isinstance(certs, list) else ()):
            if not isinstance(cert, Mapping):
                continue
            rows.append(
                {
                    "IDENTITY": _s(summary.get("identity")),
                    "TYPE": "leaf" if role == "chain" and index == 0 else role,
                    "SERIAL": _serial(cert.get("serialNumber")),
                    "NOT BEFORE": _s(cert.get("validFrom")),
                    "NOT AFTER": _s(cert.get("expirationTime")),
                    "STATE": _s(summary.get("state")),
                }
            )
    if not rows:  # no certificate yet: the identity and its state still say so
        rows.append(
            {
                "IDENTITY": _s(summary.get("identity")),
                "TYPE": "-",
                "SERIAL": "-",
                "NOT BEFORE": "-",
                "NOT AFTER": "-",
                "STATE": _s(summary.get("state")),
            }
        )
    return rows


def pod_certificates(dump: Mapping[str, Any], pod: PodRef) -> Any:
    """The certificates of ``pod``'s identity on a node proxy: meshctl puts them in the pod's
    ``workloadState`` entry; ztunnel only lists them under ``certificates``, by identity."""
    entry = pod_entry(dump, pod)
    if "certificate" in entry:
        return entry.get("certificate")
    info = entry.get("info")
    account = info.get("serviceAccount") if isinstance(info, Mapping) else None
    suffix = f"/ns/{pod.namespace}/sa/{account or 'default'}"
    for summary in _list(dump, "certificates"):
        if str(summary.get("identity", "")).endswith(suffix):
            return summary
    return {}


def _serial(decimal: object) -> str:
    """ztunnel writes serials in decimal; shown in hexadecimal, as istioctl and the CA do."""
    try:
        return format(int(str(decimal)), "x")
    except ValueError:
        return _s(decimal)


def certs(dump: Mapping[str, Any], pod: PodRef | None = None) -> list[dict[str, str]]:
    if pod is not None:
        summary = pod_certificates(dump, pod)
        return _cert_rows(summary if isinstance(summary, Mapping) else {})
    return [row for summary in _list(dump, "certificates") for row in _cert_rows(summary)]


def _listener_rows(listeners: object) -> list[dict[str, str]]:
    if not isinstance(listeners, Mapping):
        raise DumpError("the proxy's config_dump lists no listeners (an older data plane?)")
    return [
        {"ADDRESS": _s(address), "SERVES": _s(role)}
        for role, address in sorted(listeners.items(), key=lambda kv: str(kv[1]))
    ]


def listeners(dump: Mapping[str, Any], pod: PodRef | None = None) -> list[dict[str, str]]:
    if pod is not None:
        return _listener_rows(pod_entry(dump, pod).get("listeners"))
    return _listener_rows(dump.get("listeners"))


def section(dump: Mapping[str, Any], name: str, pod: PodRef | None = None) -> list[dict[str, str]]:
    """The table of section ``name`` (one of ``SECTIONS``)."""
    if not isinstance(dump, Mapping):
        raise DumpError("the proxy's config_dump is not a JSON object")
    if name == "workloads":
        return workloads(dump)
    if name == "services":
        return services(dump)
    if name == "policies":
        return policies(dump, pod)
    if name == "certs":
        return certs(dump, pod)
    if name == "listeners":
        return listeners(dump, pod)
    raise DumpError(f"unknown section {name!r}")


def raw(dump: Mapping[str, Any], name: str, pod: PodRef | None = None) -> Any:
    """The dump's own data behind a section (``-o json|yaml``)."""
    if name == "certs":
        return pod_certificates(dump, pod) if pod else dump.get("certificates")
    if name == "listeners":
        return pod_entry(dump, pod).get("listeners") if pod else dump.get("listeners")
    if name == "policies" and pod is not None:
        workload = find_workload(dump, pod)
        return [p for p in _list(dump, "policies") if _applies(p, workload)]
    return dump.get(name)
