"""The control plane's sync report (istiod's ``istio.io/debug/syncz``): its wire form and its
authorization rule, shared by the control plane that writes it and the CLI that reads it.

A debug request is a state-of-the-world ``DiscoveryRequest`` of type ``SYNCZ_TYPE`` on the
control plane's xDS port (as istioctl asks istiod); the answer is one resource of type
``REPORT_TYPE`` whose bytes are this module's JSON (``Report``): the replica, every connected
proxy with its per-type sync facts (``core.xds.syncstatus``), and what the replica's CA last
signed (``core.pki.issued``). Invariants: only callers whose service account lives in the
control plane's own namespace may ask (istiod's rule for its debug types outside
``config_dump``/``ndsz``/``edsz``); a report that is not this JSON is a ``ReportError``.
"""

from __future__ import annotations

import json
from typing import Any, NotRequired, TypedDict

from meshctl.core.pki.callers import Caller, CallerError

SYNCZ_TYPE = "istio.io/debug/syncz"
REPORT_TYPE = "type.googleapis.com/meshctl.debug.v1.SyncReport"
DEFAULT_STALE_AFTER = 10.0  # seconds a response may wait for its ACK before it counts as STALE


class TypeFacts(TypedDict):
    status: str
    sent: dict[str, str]
    sentAgo: float | None
    acked: dict[str, str]
    ackedAgo: float | None
    nacked: dict[str, str]
    nackedAgo: float | None


class ProxyFacts(TypedDict):
    id: str  # the node id the proxy sent
    requester: str  # namespace/pod (or namespace/service-account): joins the CA's records
    account: str  # namespace/service-account
    identity: str  # SPIFFE id of the caller
    kind: str  # sidecar | node proxy | gateway
    node: str
    connectedAgo: float
    status: str
    types: dict[str, TypeFacts]
    controlPlane: NotRequired[str]  # the replica holding the stream (the CLI adds it)


class IssuedFacts(TypedDict):
    requester: str
    identity: str
    serial: str
    notBefore: str
    notAfter: str


class Report(TypedDict):
    controlPlane: str
    generation: int
    staleAfterSeconds: float
    proxies: list[ProxyFacts]
    certificates: list[IssuedFacts]


class ReportError(ValueError):
    """The bytes are not a sync report."""


def authorize_debug(caller: Caller, system_namespace: str) -> None:
    """Only the control plane's namespace's service accounts may read every proxy's state."""
    if caller.namespace != system_namespace:
        raise CallerError(
            "PERMISSION_DENIED",
            f"{SYNCZ_TYPE} is served to service accounts of {system_namespace!r} only "
            f"(the caller is {caller.account})",
        )


def encode(report: Report) -> bytes:
    return json.dumps(report, separators=(",", ":"), sort_keys=True).encode()


def decode(raw: bytes) -> Report:
    try:
        data: Any = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ReportError("not a JSON object")
    for key, kind in (("controlPlane", str), ("proxies", list), ("certificates", list)):
        if not isinstance(data.get(key), kind):
            raise ReportError(f"{key!r} missing or not a {kind.__name__}")
    for proxy in data["proxies"]:
        if not isinstance(proxy, dict) or not isinstance(proxy.get("requester"), str):
            raise ReportError("a proxy entry is not an object with a 'requester'")
        types = proxy.get("types")
        if not isinstance(types, dict) or not all(isinstance(t, dict) for t in types.values()):
            raise ReportError(f"proxy {proxy['requester']}: 'types' is not an object of objects")
    for cert in data["certificates"]:
        fields = ("requester", "identity", "serial", "notBefore", "notAfter")
        if not isinstance(cert, dict) or not all(isinstance(cert.get(f), str) for f in fields):
            raise ReportError(f"a certificate entry lacks one of {', '.join(fields)}")
    report: Report = data  # type: ignore[assignment]  # checked above as far as readers rely
    return report
