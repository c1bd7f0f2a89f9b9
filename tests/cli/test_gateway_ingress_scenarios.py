"""The Ingress scenarios of the gateway goldens (the Kubernetes Ingress docs' path examples, the
old ingress-conformance path and host rules) through a real ``meshctl gateway run --gateway
ingress``: one gateway per scenario file, one echo backend per Service answering with its own
name, and every request of the scenario sent as a real HTTP/1.1 request (over TLS with its SNI
where the scenario says https). The expected outcome of each request is read from the scenario's
``.golden`` decision, so the pure matcher and the wire cannot drift apart; a decision this test
cannot turn into an observable outcome fails loudly."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness import gateway as gw

DATA = Path(__file__).parents[1] / "golden" / "gateway" / "testdata"
SCENARIOS = ("ingress-path-examples", "ingress-path-rules", "ingress-host-rules")
# The request line the golden test writes (its ``_request_line``): anything else (headers, a
# Gateway instead of the Ingress proxy) is a row this test does not know how to send.
LINE = re.compile(
    r"(?P<method>[A-Z]+) (?P<scheme>https?)://(?P<host>[^/\s]+)(?P<target>/\S*)"
    r" \(port (?P<port>\d+)(?:, sni (?P<sni>[^,)\s]+))?\) via ingress"
)
BACKEND = re.compile(r"(?P<namespace>[^/\s]+)/(?P<name>[^:\s]+):(?P<port>\d+) weight \d+")
NO_LISTENER = ": no listener)"


class UnmappedRowError(Exception):
    """A golden row (or scenario fact) this test cannot turn into a request and an outcome."""


@dataclass(frozen=True, slots=True)
class Row:
    """One request of a scenario and what the wire must show for it."""

    method: str
    scheme: str
    host: str  # the Host header, as the scenario writes it (case and port kept)
    target: str  # path and query, sent as they are (dot segments included)
    port: int
    sni: str
    backend: str = ""  # the Service whose echo must answer 200, or
    status: int = 0  # the gateway's own status, with
    reason: str = ""  # its x-meshctl-route header, or
    refused: bool = False  # the TLS handshake refused (no HTTPS listener covers the SNI)
    certificate: str = ""  # the Secret whose certificate the HTTPS listener must serve


def _expectation(decision: dict[str, Any], https: bool) -> dict[str, Any]:
    outcome = decision.get("outcome")
    if outcome == "forward":
        backends = decision.get("backends") or []
        found = [BACKEND.fullmatch(b) for b in backends]
        if len(found) != 1 or found[0] is None:
            raise UnmappedRowError(f"a forward to {backends!r}: not exactly one backend to observe")
        return {"backend": found[0]["name"]}
    status, reason = decision.get("status"), decision.get("reason")
    if not isinstance(status, int) or not isinstance(reason, str):
        raise UnmappedRowError(f"outcome {outcome!r} without a status and a reason")
    if https and outcome == "no-route" and reason.endswith(NO_LISTENER):
        # No HTTPS listener covers the name: the matcher reports the 404 it would answer, but
        # the handshake comes first and is refused (certificates.py's invariant: never another
        # listener's certificate), so no HTTP answer can exist.
        return {"refused": True}
    return {"status": status, "reason": reason}


def _certificates(golden: dict[str, Any]) -> dict[str, str]:
    """Each HTTPS listener of the golden's Ingress table -> the name of its first Secret."""
    out = {}
    for port in (golden.get("tables") or {}).get("ingress", {}).get("ports", ()):
        for listener in port["listeners"]:
            if listener.get("certificates"):
                out[listener["listener"]] = listener["certificates"][0].split("/")[1]
    return out


def rows(scenario: str) -> list[Row]:
    spec = yaml.safe_load((DATA / f"{scenario}.yaml").read_text(encoding="utf-8"))
    golden = yaml.safe_load((DATA / f"{scenario}.golden").read_text(encoding="utf-8"))
    decisions = golden.get("decisions") or []
    if len(decisions) != len(spec.get("requests") or ()):
        raise UnmappedRowError(f"{scenario}: the golden's decisions are not its requests")
    certificates = _certificates(golden)
    out = []
    for entry in decisions:
        line = LINE.fullmatch(entry["request"])
        if line is None:
            raise UnmappedRowError(f"{scenario}: cannot send {entry['request']!r}")
        https = line["scheme"] == "https"
        expected = _expectation(entry["decision"], https)
        listener = entry["decision"].get("listener", "")
        if https and not expected.get("refused") and listener not in certificates:
            raise UnmappedRowError(f"{entry['request']!r}: no certificate for {listener!r}")
        out.append(
            Row(
                method=line["method"],
                scheme=line["scheme"],
                host=line["host"],
                target=line["target"],
                port=int(line["port"]),
                sni=line["sni"] or "",
                certificate=certificates.get(listener, "") if https else "",
                **expected,
            )
        )
    return out


CASES = [
    pytest.param(scenario, row, id=f"{scenario}-{i:02d}-{row.scheme}-{row.host}{row.target}")
    for scenario in SCENARIOS
    for i, row in enumerate(rows(scenario))
]


def _objects(spec: dict[str, Any], backends: dict[str, gw.Backend]) -> list[dict[str, Any]]:
    """The scenario's objects, an EndpointSlice per Service to its echo on loopback, and a
    Secret per Ingress TLS entry with a certificate for its hosts (labelled with its name)."""
    facts = (spec.get("facts") or {}).get("certificates") or {}
    if any(verdict != "valid" for verdict in facts.values()):
        raise UnmappedRowError(f"certificate facts this test cannot make real: {facts}")
    out = list(spec["objects"])
    for obj in spec["objects"]:
        namespace = obj["metadata"].get("namespace", "")
        if obj["kind"] == "Service":
            name = obj["metadata"]["name"]
            out.append(
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": {
                        "name": f"{name}-echo",
                        "namespace": namespace,
                        "labels": {"kubernetes.io/service-name": name},
                    },
                    "addressType": "IPv4",
                    # unnamed, as the scenarios' Service ports are
                    "ports": [{"port": backends[name].port}],
                    "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
                }
            )
        tls_entries = (obj.get("spec") or {}).get("tls") if obj["kind"] == "Ingress" else None
        for tls in tls_entries or ():
            if f"{namespace}/{tls['secretName']}" not in facts:
                raise UnmappedRowError(f"Secret {namespace}/{tls['secretName']} has no golden fact")
            chain, key = gw.server_cert(*tls["hosts"], label=tls["secretName"])
            out.append(gw.tls_secret(tls["secretName"], chain, key, namespace=namespace))
    return out


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], gw.Running]]:
    """The running gateway of a scenario, started on first use, kept for the module."""
    with contextlib.ExitStack() as stack:
        running: dict[str, gw.Running] = {}

        def start(scenario: str) -> gw.Running:
            if scenario not in running:
                spec = yaml.safe_load((DATA / f"{scenario}.yaml").read_text(encoding="utf-8"))
                names = {o["metadata"]["name"] for o in spec["objects"] if o["kind"] == "Service"}
                backends = {n: stack.enter_context(gw.backend(n)) for n in sorted(names)}
                running[scenario] = stack.enter_context(
                    gw.run_gateway(
                        tmp_path_factory.mktemp(scenario),
                        _objects(spec, backends),
                        args=("--gateway", "ingress"),
                    )
                )
            return running[scenario]

        yield start


def _connect(proc: gw.Running, row: Row) -> tuple[http.client.HTTPConnection, str]:
    """A connection to the row's listener port: plain, or TLS with the row's SNI (the served
    certificate's organisation names its Secret)."""
    conn = http.client.HTTPConnection("127.0.0.1", proc.port(row.port), timeout=10)
    if row.scheme == "http":
        return conn, ""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # self-signed; which certificate it is is checked instead
    ctx.set_alpn_protocols(["http/1.1"])
    raw = socket.create_connection(("127.0.0.1", proc.port(row.port)), timeout=10)
    try:
        sock = ctx.wrap_socket(raw, server_hostname=row.sni)
    except BaseException:
        raw.close()
        raise
    conn.sock = sock
    return conn, gw.peer_organisation(sock.getpeercert(binary_form=True) or b"")


def test_every_scenario_file_has_rows():
    for scenario in SCENARIOS:
        assert len(rows(scenario)) >= 10, scenario


@pytest.mark.parametrize(("scenario", "row"), CASES)
def test_ingress_request_gets_the_goldens_outcome(gateway, scenario: str, row: Row) -> None:
    proc = gateway(scenario)
    if row.refused:
        # The SNI callback answers unrecognized_name; asyncio's TLS transport closes on the
        # failed handshake, and whether the alert record leaves first is its own (as in
        # test_gateway_https): either way no HTTP exchange happens.
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _connect(proc, row)[0].close()
        return
    conn, served = _connect(proc, row)
    try:
        assert served == row.certificate
        conn.request(row.method, row.target, headers={"Host": row.host})
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    route = response.getheader("x-meshctl-route")
    if row.backend:
        assert (response.status, route) == (200, None), body
        assert response.getheader("x-backend") == row.backend
        assert json.loads(body)["server"] == row.backend
    else:
        assert (response.status, route) == (row.status, row.reason), body
        assert response.getheader("x-backend") is None
