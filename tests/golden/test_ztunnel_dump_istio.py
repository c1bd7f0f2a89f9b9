"""meshctl's ``/config_dump`` sections against a real ztunnel dump and istioctl's own structs.

The pinned Istio module (tests/harness/istio.py) carries the dump istioctl's ``ztunnel-config``
tests parse (``istioctl/pkg/writer/ztunnel/configdump/testdata/dump.json``, written by a
ztunnel) and the Go structs istioctl decodes a dump into (``api.go``). Each workload, service
and policy of that dump, read by meshctl's local-config reader, must dump back exactly as
ztunnel wrote it, but for the fields ztunnel has added since that dump was taken (each written
with ztunnel's default); each certificate, described by meshctl's parser, must dump with the
same serial number and date form (and its PEM, base64-encoded as ztunnel now does). Every field
istioctl declares must hold a JSON value its Go type decodes.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from meshctl.core.mesh.localconfig import parse_record
from meshctl.core.mesh.records import (
    Action,
    Kind,
    Policy,
    Protocol,
    RbacMatch,
    Scope,
    Service,
    StringMatch,
    Workload,
)
from meshctl.core.pki import certs as certs_mod
from meshctl.core.wire import channel, ztunnel_dump
from tests.harness.istio import istio_module_dir

CONFIGDUMP = "istioctl/pkg/writer/ztunnel/configdump"
RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")

# Fields ztunnel writes today that the testdata dump predates, with the value ztunnel writes
# when the record does not set them (src/state/workload.rs, service.rs, rbac.rs).
NEWER_DEFAULTS = {
    "workloads": {"networkMode": "Standard", "capacity": 1},
    "services": {"canonical": False, "visibility": "Public"},
    "policies": {"dryRun": False},
}


@pytest.fixture(scope="module")
def configdump_dir() -> Path:
    return istio_module_dir() / CONFIGDUMP


@pytest.fixture(scope="module")
def real_dump(configdump_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((configdump_dir / "testdata/dump.json").read_text())
    return data


def _entries(section: Any) -> list[dict[str, Any]]:
    return list(section.values()) if isinstance(section, dict) else list(section)


def _differences(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (ours.get(k), theirs.get(k)) for k in {*ours, *theirs} if ours.get(k) != theirs.get(k)
    }


def test_a_real_ztunnels_workloads_services_and_policies_dump_back_as_ztunnel_wrote_them(
    real_dump: dict[str, Any],
) -> None:
    shapers = {
        "workloads": (Kind.WORKLOAD, ztunnel_dump.workload),
        "services": (Kind.SERVICE, lambda r: ztunnel_dump.service(r, {})),
        "policies": (Kind.POLICY, ztunnel_dump.policy),
    }
    for section, (kind, shape) in shapers.items():
        entries = _entries(real_dump[section])
        assert entries, section
        for theirs in entries:
            # ztunnel's local config wants the workload's services map; its dump lists them.
            doc = {**theirs, "services": {}} if kind is Kind.WORKLOAD else theirs
            ours = shape(parse_record(kind, doc))
            assert _differences(ours, theirs) == {
                k: (v, None) for k, v in NEWER_DEFAULTS[section].items()
            }, (section, theirs)


def test_certificates_dump_with_ztunnels_serials_validity_and_pem(
    real_dump: dict[str, Any],
) -> None:
    seen = 0
    for entry in real_dump["certificates"]:
        for theirs in [*entry["certChain"], *entry.get("rootCerts", [])]:
            pem = theirs["pem"]  # this dump predates ztunnel's base64 of the PEM
            (facts,) = certs_mod.describe(pem.encode())
            described = channel.certificate_facts(
                facts.serial,
                facts.not_before.isoformat(),
                facts.not_after.isoformat(),
                list(facts.uri_sans),
            )
            ours = ztunnel_dump.cert(described, pem)
            assert ours["serialNumber"] == theirs["serialNumber"]
            # istioctl's tests edit some dates (to show expired and valid rows), so the dates
            # are compared in form; meshctl's own are the certificate's (unit tests).
            for key in ("validFrom", "expirationTime"):
                assert RFC3339_UTC.fullmatch(theirs[key]), theirs[key]
                assert RFC3339_UTC.fullmatch(ours[key]), ours[key]
            assert ours["validFrom"] == rfc3339(facts.not_before)
            assert base64.b64decode(ours["pem"]).decode() == pem
            seen += 1
    assert seen >= 2


def rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- istioctl's structs --------------------------------------------------------------------------

_STRUCT = re.compile(r"^type (\w+) struct \{\n(.*?)^\}", re.S | re.M)
_FIELD = re.compile(r"^\s+\w+\s+(\S+)\s+`json:\"([^\",]+)")


def go_structs(api_go: str) -> dict[str, dict[str, str]]:
    """``type X struct`` of ``api.go``: JSON name -> Go type, per struct."""
    out = {}
    for name, body in _STRUCT.findall(api_go):
        out[name] = {m.group(2): m.group(1) for m in map(_FIELD.match, body.splitlines()) if m}
    return out


_SCALARS: dict[str, type | tuple[type, ...]] = {"string": str, "bool": bool, "any": object}


def decodes(value: Any, go_type: str, structs: dict[str, dict[str, str]], where: str) -> None:
    """Fails unless Go's encoding/json decodes ``value`` into ``go_type`` (null always does)."""
    go_type = go_type.lstrip("*")
    if value is None:
        return
    if go_type.startswith("[]"):
        assert isinstance(value, list), where
        for i, item in enumerate(value):
            decodes(item, go_type[2:], structs, f"{where}[{i}]")
    elif go_type.startswith("map["):
        key_type, value_type = go_type[4:].split("]", 1)
        assert isinstance(value, dict), where
        for key, item in value.items():
            assert key.isdigit() or not key_type.startswith(("uint", "int")), f"{where}: {key!r}"
            decodes(item, value_type, structs, f"{where}.{key}")
    elif go_type in _SCALARS:
        assert isinstance(value, _SCALARS[go_type]), where
    elif go_type.startswith(("uint", "int")):
        assert isinstance(value, int), where
        assert not isinstance(value, bool), where
        assert value >= 0 or not go_type.startswith("uint"), where
    elif go_type == "CIDRVIP":
        assert isinstance(value, dict | str), where  # both forms decode (api.go)
    else:
        decodes_struct(value, structs[go_type], structs, where)


def decodes_struct(
    value: Any, fields: dict[str, str], structs: dict[str, dict[str, str]], where: str
) -> None:
    assert isinstance(value, dict), where
    # Go matches keys case-insensitively; a key istioctl does not know is skipped.
    lower = {k.lower(): t for k, t in fields.items()}
    for key, item in value.items():
        field = lower.get(key.lower())
        if field is not None:
            decodes(item, field, structs, f"{where}.{key}")


def sample_dump() -> dict[str, Any]:
    """Every section of a meshctl dump, each record with every field meshctl fills."""
    ip = ipaddress.ip_address
    web = Workload(
        uid="Kubernetes//Pod/shop/web-1",
        name="web-1",
        namespace="shop",
        service_account="web",
        workload_ips=(ip("10.1.0.5"),),
        protocol=Protocol.HBONE,
        network="net1",
        node="n1",
        workload_name="web",
        canonical_name="web",
        canonical_revision="v1",
        authorization_policies=("shop/only-web",),
        healthy=False,
        services={"shop/web.shop.svc.cluster.local": {80: 8080}, "shop/gone.shop": {1: 2}},
        extra={
            "waypoint": {"destination": "net1/10.96.0.10", "hboneMtlsPort": 15008},
            "locality": {"region": "r", "zone": "z", "subzone": ""},
            "applicationTunnel": {"protocol": "PROXY", "port": 15088},
            "hostname": "web.example",
            "capacity": 3,
        },
    )
    svc = Service(
        name="web",
        namespace="shop",
        hostname="web.shop.svc.cluster.local",
        vips=(("net1", ip("10.96.0.9")),),
        ports={80: 8080},
        subject_alt_names=("spiffe://cluster.local/ns/shop/sa/web",),
    )
    policy = Policy(
        name="only-web",
        namespace="shop",
        scope=Scope.WORKLOAD_SELECTOR,
        action=Action.ALLOW,
        rules=(
            (
                (
                    RbacMatch(
                        namespaces=(StringMatch(kind="exact", value="shop"),),
                        principals=(StringMatch(kind="presence"),),
                        service_accounts=(("shop", "web"),),
                        source_ips=(ipaddress.ip_network("10.0.0.0/8"),),
                        destination_ports=(8080,),
                    ),
                ),
            ),
        ),
    )
    facts = channel.certificate_facts(
        "0a", "2026-12-06T00:00:00+00:00", "2026-12-07T00:00:00+00:00", []
    )
    pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    summary = ztunnel_dump.identity_certs(
        "spiffe://cluster.local/ns/shop/sa/web", "Available", [facts], pem, [facts], pem
    )
    flow = {
        "direction": "inbound",
        "src": {"addr": "10.1.0.6:40000", "workload": "shop/db-0", "identity": None},
        "dst": {"addr": "10.1.0.5:8080", "workload": "shop/web-1", "identity": None},
        "hboneAddr": None,
        "service": "web.shop.svc.cluster.local",
        "mutualTls": True,
        "bytesReceived": 0,
        "bytesSent": 0,
        "durationSeconds": 0.0,
    }
    pod = {
        "info": {"name": "web-1", "namespace": "shop", "serviceAccount": "web"},
        "state": "Up",
        "connections": ztunnel_dump.pod_connections([flow], "shop", "web-1"),  # type: ignore[list-item]
    }
    dump: dict[str, Any] = {
        **ztunnel_dump.state_sections([web], [svc], [policy]),
        "certificates": [summary],
        "workloadState": {web.uid: pod},
    }
    return json.loads(json.dumps(dump))  # as it travels


def test_every_field_istioctl_declares_decodes_into_its_go_type(configdump_dir: Path) -> None:
    structs = go_structs((configdump_dir / "api.go").read_text())
    dump = sample_dump()
    assert {"ZtunnelWorkload", "ZtunnelService", "ZtunnelPolicy", "CertsDump"} <= set(structs)
    for section, go_type in (
        ("workloads", "[]*ZtunnelWorkload"),
        ("services", "[]*ZtunnelService"),
        ("policies", "[]*ZtunnelPolicy"),
        ("certificates", "[]*CertsDump"),
        ("workloadState", "map[string]WorkloadState"),
    ):
        assert dump[section], section
        decodes(dump[section], go_type, structs, section)
    # And the facts istioctl's tables print are where it looks for them.
    (svc,) = dump["services"]
    assert (
        svc["endpoints"]["Kubernetes//Pod/shop/web-1"]["workloadUid"] == dump["workloads"][0]["uid"]
    )
    assert dump["workloads"][0]["status"] == "Unhealthy"
    assert dump["stagedServices"] == {
        "shop/gone.shop": {
            "Kubernetes//Pod/shop/web-1": {
                "workloadUid": "Kubernetes//Pod/shop/web-1",
                "port": {"1": 2},
                "status": "Unhealthy",
            }
        }
    }
    (pod,) = dump["workloadState"].values()
    assert pod["connections"]["inbound"][0]["protocol"] == "HBONE"


def test_istioctls_struct_reader_sees_the_fields_of_api_go(configdump_dir: Path) -> None:
    structs = go_structs((configdump_dir / "api.go").read_text())
    assert structs["Cert"] == {
        "pem": "string",
        "serialNumber": "string",
        "validFrom": "string",
        "expirationTime": "string",
    }
    assert structs["ZtunnelWorkload"]["workloadIps"] == "[]string"


def test_proxy_config_renders_a_real_ztunnels_dump(real_dump: dict[str, Any]) -> None:
    from meshctl.core.proxystatus import configdump

    workloads = configdump.section(real_dump, "workloads")
    assert len(workloads) == len(real_dump["workloads"])
    ratings = next(r for r in workloads if r["NAME"].startswith("ratings-v1"))
    assert ratings["IDENTITY"] == "spiffe://cluster.local/ns/bookinfo/sa/bookinfo-ratings"
    services = {r["NAME"]: r for r in configdump.section(real_dump, "services")}
    assert services["namespace-istio-waypoint"]["VIPS"] == "10.96.65.117"
    assert services["namespace-istio-waypoint"]["ENDPOINTS"] == "1"
    policies = configdump.section(real_dump, "policies")
    assert {r["NAME"] for r in policies} == {"allow-nothing", "allow-waypoint"}
    certs = configdump.section(real_dump, "certs")
    first = real_dump["certificates"][0]["certChain"][0]
    assert certs[0]["SERIAL"] == format(int(first["serialNumber"]), "x")
