"""Golden cases of the gateway core: ``testdata/<case>.yaml`` (Kubernetes objects, the facts the
controller would supply, and requests) -> ``<case>.golden`` (the route tables, every status we
write, and the decision for each request). ``MESHCTL_REFRESH_GOLDEN=1`` rewrites the goldens; a
golden no case produces fails.

Input shape: ``objects`` (a list of objects as the API serves them), ``facts``
(``certificates``: ``ns/name: valid`` or ``invalid: why``; ``gateways``: ``ns/name: {ready,
addresses}``, default ready at 10.96.0.10; ``ingressAddresses``; ``misdirectedByListener``),
``now``, and ``requests`` (``gateway: ns/name`` or ``ingress: true``, ``port``, ``host``,
``path``, ``query``, ``method``, ``headers``, ``scheme``, ``sni``; or ``passthrough: true``
with ``port`` and ``sni``: a TLS connection routed by its ClientHello).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from meshctl.core.gateway import render
from meshctl.core.gateway.gateways import Address, CertificateFacts, GatewayRuntime
from meshctl.core.gateway.local import CLUSTER_FIELDS
from meshctl.core.gateway.matching import Request, match, passthrough
from meshctl.core.gateway.translate import Cluster, Options, Translation, translate
from meshctl.output import yaml_text
from tests.harness.golden import assert_golden, orphans

DATA = Path(__file__).parent / "testdata"
CASES = sorted(p.name.removesuffix(".yaml") for p in DATA.glob("*.yaml"))
NOW = "2026-12-02T10:00:00Z"


def _key(text: str) -> tuple[str, str]:
    namespace, name = text.split("/")
    return namespace, name


def _address(value: str) -> Address:
    return Address(value=value, type="IPAddress" if value[:1].isdigit() else "Hostname")


def _cluster(case: dict[str, Any]) -> Cluster:
    lists: dict[str, list[Any]] = {f: [] for f in CLUSTER_FIELDS.values()}
    for obj in case.get("objects") or ():
        lists[CLUSTER_FIELDS[obj["kind"]]].append(obj)
    facts = case.get("facts") or {}
    certificates = {}
    for key, verdict in (facts.get("certificates") or {}).items():
        valid = verdict == "valid"
        certificates[_key(key)] = CertificateFacts(
            valid=valid, message="" if valid else verdict.removeprefix("invalid: ")
        )
    runtime = {
        (g["metadata"]["namespace"], g["metadata"]["name"]): GatewayRuntime(
            ready=True, addresses=(_address("10.96.0.10"),)
        )
        for g in lists["gateways"]
    }
    for key, spec in (facts.get("gateways") or {}).items():
        runtime[_key(key)] = GatewayRuntime(
            ready=spec.get("ready", True),
            addresses=tuple(_address(a) for a in spec.get("addresses", ())),
        )
    return Cluster(
        **lists,  # type: ignore[arg-type]
        certificates=certificates,
        runtime=runtime,
        ingress_addresses=tuple(_address(a) for a in facts.get("ingressAddresses", ())),
    )


def _request_line(spec: dict[str, Any]) -> str:
    if spec.get("passthrough"):
        return f"TLS sni {spec['sni'] or '(none)'} (port {spec['port']}) via {spec['gateway']}"
    scheme = spec.get("scheme", "http")
    query = f"?{spec['query']}" if spec.get("query") else ""
    line = f"{spec.get('method', 'GET')} {scheme}://{spec['host']}{spec.get('path', '/')}{query}"
    line += f" (port {spec['port']}"
    if spec.get("sni"):
        line += f", sni {spec['sni']}"
    if spec.get("headers"):
        line += ", " + ", ".join(f"{k}: {v}" for k, v in spec["headers"].items())
    via = "ingress" if spec.get("ingress") else spec["gateway"]
    return f"{line}) via {via}"


def _decisions(result: Translation, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for spec in requests:
        table = (
            result.ingress if spec.get("ingress") else result.gateways.get(_key(spec["gateway"]))
        )
        if spec.get("passthrough"):
            decided = passthrough(table, spec["port"], spec["sni"]) if table else None
            decision = render.decision_data(decided) if decided else {"gateway": "none"}
            out.append({"request": _request_line(spec), "decision": decision})
            continue
        request = Request(
            port=spec["port"],
            host=spec["host"],
            path=spec.get("path", "/"),
            query=spec.get("query", ""),
            method=spec.get("method", "GET"),
            headers=tuple((k, str(v)) for k, v in (spec.get("headers") or {}).items()),
            scheme=spec.get("scheme", "http"),
            sni=spec.get("sni", ""),
        )
        decision = render.decision_data(match(table, request)) if table else {"gateway": "none"}
        out.append({"request": _request_line(spec), "decision": decision})
    return out


def output(case: dict[str, Any]) -> str:
    facts = case.get("facts") or {}
    options = Options(misdirected_by_listener=bool(facts.get("misdirectedByListener")))
    result = translate(_cluster(case), now=case.get("now", NOW), options=options)
    tables = {f"{ns}/{name}": render.table_data(t) for (ns, name), t in result.gateways.items()}
    if result.ingress.ports:
        tables["ingress"] = render.table_data(result.ingress)
    data: dict[str, Any] = {}
    if result.problems:
        data["problems"] = list(result.problems)
    data["tables"] = tables
    data["status"] = [
        {
            "object": f"{u.kind} {u.namespace}/{u.name}" if u.namespace else f"{u.kind} {u.name}",
            "changed": u.changed,
            "status": u.status,
        }
        for u in result.statuses
    ]
    if case.get("requests"):
        data["decisions"] = _decisions(result, case["requests"])
    return yaml_text(data)


def test_there_are_golden_cases():
    assert len(CASES) >= 10, CASES


@pytest.mark.parametrize("case", CASES)
def test_gateway_golden(case):
    spec = yaml.safe_load((DATA / f"{case}.yaml").read_text(encoding="utf-8"))
    assert_golden(DATA / f"{case}.golden", output(spec))


def test_no_orphan_goldens():
    assert orphans(DATA, (f"{c}.golden" for c in CASES)) == []
