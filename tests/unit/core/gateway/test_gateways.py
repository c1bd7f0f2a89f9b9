"""GatewayClass and Gateway status: listener validity, references, conflicts, readiness."""

from __future__ import annotations

from meshctl.core.gateway.gateways import CertificateFacts
from meshctl.core.gateway.matching import Request, match

from .cluster import (
    GROUP,
    condition,
    gateway,
    gateway_class,
    grant,
    https,
    listener,
    listener_status,
    route,
    run,
    service,
    status,
)


def test_our_gateway_class_is_accepted_and_others_are_left_alone():
    other = gateway_class("theirs", controllerName="example.io/other")
    result = run(gateway_class(), other)
    conditions = status(result, "GatewayClass", "meshctl", namespace="")["conditions"]
    assert condition(conditions, "Accepted") == ("True", "Accepted")
    assert [u.name for u in result.statuses if u.kind == "GatewayClass"] == ["meshctl"]


def test_a_class_with_parameters_is_not_accepted_nor_are_its_gateways():
    result = run(gateway_class(parametersRef={"group": "x", "kind": "Y", "name": "z"}), gateway())
    conditions = status(result, "GatewayClass", "meshctl", namespace="")["conditions"]
    assert condition(conditions, "Accepted") == ("False", "InvalidParameters")
    assert condition(status(result, "Gateway", "gw")["conditions"], "Accepted") == (
        "False",
        "Invalid",
    )
    assert ("infra", "gw") not in result.gateways


def test_gateways_of_other_classes_get_no_status_and_no_table():
    result = run(gateway_class(), gateway(gatewayClassName="other"))
    assert not [u for u in result.statuses if u.kind == "Gateway"]
    assert not result.gateways


def test_unsupported_protocols_leave_the_gateway_accepted_with_listeners_not_valid():
    result = run(gateway_class(), gateway(listener(), listener("udp", 9000, "UDP")))
    gw = status(result, "Gateway", "gw")
    assert condition(gw["conditions"], "Accepted") == ("True", "ListenersNotValid")
    udp = listener_status(result, "udp")
    assert condition(udp["conditions"], "Accepted") == ("False", "UnsupportedProtocol")
    assert udp["supportedKinds"] == []
    assert [p.port for p in result.gateways[("infra", "gw")].ports] == [80]


def test_two_tcp_listeners_on_a_port_conflict_whatever_their_hostnames():
    result = run(
        gateway_class(),
        gateway(
            listener("a", 9000, "TCP", hostname="a.example.com"),
            listener("b", 9000, "TCP", hostname="b.example.com"),
            listener("c", 9001, "TCP", hostname="c.example.com"),
        ),
    )
    for name in ("a", "b"):
        conditions = listener_status(result, name)["conditions"]
        assert condition(conditions, "Conflicted") == ("True", "HostnameConflict")
    c = listener_status(result, "c")
    assert c["supportedKinds"] == [{"group": "gateway.networking.k8s.io", "kind": "TCPRoute"}]
    table = result.gateways[("infra", "gw")]
    assert [(p.port, p.protocol) for p in table.ports] == [(9001, "TCP")]
    assert table.ports[0].listeners[0].listener.hostname == "*"  # ignored on TCP


def test_a_gateway_with_no_valid_listener_is_not_accepted():
    result = run(gateway_class(), gateway(listener("udp", 53, "UDP")))
    assert condition(status(result, "Gateway", "gw")["conditions"], "Accepted") == (
        "False",
        "ListenersNotValid",
    )
    assert ("infra", "gw") not in result.gateways


def test_same_port_and_hostname_conflict_both_listeners_and_neither_serves():
    result = run(
        gateway_class(),
        gateway(
            listener("a", hostname="x.example.com"),
            listener("b", hostname="x.example.com"),
            listener("c", hostname="y.example.com"),
        ),
    )
    for name in ("a", "b"):
        conditions = listener_status(result, name)["conditions"]
        assert condition(conditions, "Conflicted") == ("True", "HostnameConflict")
        assert condition(conditions, "Accepted") == ("False", "HostnameConflict")
        assert condition(conditions, "Programmed") == ("False", "Invalid")
    assert condition(listener_status(result, "c")["conditions"], "Conflicted") == (
        "False",
        "NoConflicts",
    )
    [port] = result.gateways[("infra", "gw")].ports
    assert [lr.listener.name for lr in port.listeners] == ["c"]


def test_different_protocols_on_one_port_conflict():
    result = run(gateway_class(), gateway(listener("plain", 8443), https("tls", 8443)))
    for name in ("plain", "tls"):
        conditions = listener_status(result, name)["conditions"]
        assert condition(conditions, "Conflicted") == ("True", "ProtocolConflict")


def test_a_missing_certificate_is_an_invalid_reference_and_the_listener_serves_nothing():
    result = run(gateway_class(), gateway(https()), route(), service(), certificates={})
    https_status = listener_status(result, "https")
    assert condition(https_status["conditions"], "ResolvedRefs") == (
        "False",
        "InvalidCertificateRef",
    )
    assert condition(https_status["conditions"], "Programmed") == ("False", "Invalid")
    assert https_status["attachedRoutes"] == 1  # attachment does not depend on the certificate
    assert result.gateways[("infra", "gw")].ports == ()


def test_an_invalid_certificate_or_a_non_secret_is_an_invalid_reference():
    bad = {("infra", "cert"): CertificateFacts(valid=False, message="no tls.key")}
    result = run(gateway_class(), gateway(https()), certificates=bad)
    conditions = listener_status(result, "https")["conditions"]
    assert condition(conditions, "ResolvedRefs") == ("False", "InvalidCertificateRef")
    assert "no tls.key" in next(c["message"] for c in conditions if c["type"] == "ResolvedRefs")
    kind = run(gateway_class(), gateway(https("https", 443, {"kind": "ConfigMap", "name": "cert"})))
    assert condition(listener_status(kind, "https")["conditions"], "ResolvedRefs") == (
        "False",
        "InvalidCertificateRef",
    )


def test_a_certificate_in_another_namespace_needs_a_reference_grant():
    ref = {"name": "cert", "namespace": "certs"}
    facts = {("certs", "cert"): CertificateFacts()}
    denied = run(gateway_class(), gateway(https("https", 443, ref)), certificates=facts)
    assert condition(listener_status(denied, "https")["conditions"], "ResolvedRefs") == (
        "False",
        "RefNotPermitted",
    )
    allow = grant("certs", [(GROUP, "Gateway", "infra")], [("", "Secret", "cert")])
    allowed = run(gateway_class(), gateway(https("https", 443, ref)), allow, certificates=facts)
    assert condition(listener_status(allowed, "https")["conditions"], "ResolvedRefs") == (
        "True",
        "ResolvedRefs",
    )
    [port] = allowed.gateways[("infra", "gw")].ports
    assert [str(c) for c in port.listeners[0].listener.certificates] == ["certs/cert"]


def test_a_grant_for_another_secret_or_another_namespace_does_not_allow():
    ref = {"name": "cert", "namespace": "certs"}
    facts = {("certs", "cert"): CertificateFacts()}
    for wrong in (
        grant("certs", [(GROUP, "Gateway", "infra")], [("", "Secret", "other")]),
        grant("certs", [(GROUP, "Gateway", "elsewhere")], [("", "Secret", "cert")]),
        grant("elsewhere", [(GROUP, "Gateway", "infra")], [("", "Secret", "cert")]),
    ):
        result = run(gateway_class(), gateway(https("https", 443, ref)), wrong, certificates=facts)
        assert condition(listener_status(result, "https")["conditions"], "ResolvedRefs") == (
            "False",
            "RefNotPermitted",
        )


def test_unknown_route_kinds_are_refused_and_left_out_of_supported_kinds():
    kinds = [{"kind": "HTTPRoute"}, {"kind": "TCPRoute"}]
    result = run(gateway_class(), gateway(listener(allowedRoutes={"kinds": kinds})))
    entry = listener_status(result, "http")
    assert condition(entry["conditions"], "ResolvedRefs") == ("False", "InvalidRouteKinds")
    assert entry["supportedKinds"] == [{"group": GROUP, "kind": "HTTPRoute"}]


def test_programmed_follows_the_proxy_and_its_addresses():
    ready = run(gateway_class(), gateway())
    gw = status(ready, "Gateway", "gw")
    assert condition(gw["conditions"], "Programmed") == ("True", "Programmed")
    assert gw["addresses"] == [{"type": "IPAddress", "value": "10.96.0.10"}]
    pending = status(run(gateway_class(), gateway(), ready=False), "Gateway", "gw")
    assert condition(pending["conditions"], "Programmed") == ("False", "Pending")
    assert condition(pending["listeners"][0]["conditions"], "Programmed") == ("False", "Pending")
    unaddressed = status(run(gateway_class(), gateway(), addresses=()), "Gateway", "gw")
    assert condition(unaddressed["conditions"], "Programmed") == ("False", "AddressNotAssigned")
    assert unaddressed["addresses"] == []


def test_requested_addresses_are_not_supported():
    result = run(gateway_class(), gateway(addresses=[{"value": "1.2.3.4"}]))
    assert condition(status(result, "Gateway", "gw")["conditions"], "Accepted") == (
        "False",
        "UnsupportedAddress",
    )


def test_attached_routes_count_each_route_once_per_listener():
    result = run(
        gateway_class(),
        gateway(listener("a", hostname="a.example.com"), listener("b", 8080)),
        route("one"),
        route("two", parents=[{"name": "gw", "namespace": "infra", "sectionName": "b"}]),
        service(),
    )
    assert listener_status(result, "a")["attachedRoutes"] == 1
    assert listener_status(result, "b")["attachedRoutes"] == 2


def test_every_condition_carries_the_current_generation():
    result = run(gateway_class(), gateway(generation=7))
    gw = status(result, "Gateway", "gw")
    generations = {c["observedGeneration"] for c in gw["conditions"]}
    generations |= {c["observedGeneration"] for c in gw["listeners"][0]["conditions"]}
    assert generations == {7}


def test_https_routes_are_served_by_sni_listener_with_its_certificate():
    result = run(gateway_class(), gateway(https(hostname="*.example.com")), route(), service())
    decision = match(
        result.gateways[("infra", "gw")],
        Request(port=443, host="a.example.com", sni="a.example.com", scheme="https"),
    )
    assert decision.listener is not None
    assert [str(c) for c in decision.listener.certificates] == ["infra/cert"]
    assert decision.backends[0].label == "infra/svc:80"


def test_listeners_of_a_gateway_not_accepted_are_invalid_not_pending():
    result = run(gateway_class(), gateway(addresses=[{"value": "1.2.3.4"}]))
    assert condition(listener_status(result, "http")["conditions"], "Programmed") == (
        "False",
        "Invalid",
    )


def test_a_passthrough_listener_is_unsupported_without_certificate_complaints():
    passthrough = listener("tls", 443, "HTTPS", tls={"mode": "Passthrough"})
    conditions = listener_status(run(gateway_class(), gateway(passthrough)), "tls")["conditions"]
    assert condition(conditions, "Accepted") == ("False", "UnsupportedValue")
    assert condition(conditions, "ResolvedRefs") == ("True", "ResolvedRefs")


def test_a_listener_refused_for_its_tls_mode_takes_no_route_kind():
    terminate = listener("tls", 8443, "TLS", tls={"mode": "Terminate"})
    entry = listener_status(run(gateway_class(), gateway(terminate)), "tls")
    assert condition(entry["conditions"], "Accepted") == ("False", "UnsupportedValue")
    assert (entry["supportedKinds"], entry["attachedRoutes"]) == ([], 0)
