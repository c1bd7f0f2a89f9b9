"""trace: where one connection goes through the rules, decided without a kernel."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshctl.config import resolve
from meshctl.core.capture.parse import parse
from meshctl.core.capture.plan import plan
from meshctl.core.capture.rules import Family, RuleSet
from meshctl.core.capture.settings import CaptureSettings
from meshctl.core.capture.trace import Connection, TraceError, format_trace, trace

POD = "10.244.1.5"


def rules(family=Family.IPV4, **flags) -> RuleSet:
    return plan(resolve(CaptureSettings, flags=flags, env={})).ruleset(family)


def out(dst, port, *, uid=1000, gid=None, iface="eth0", proto="tcp", src=POD, mark=0):
    return Connection(
        "out",
        proto,
        ipaddress.ip_address(src),
        40000,
        ipaddress.ip_address(dst),
        port,
        uid=uid,
        gid=uid if gid is None else gid,
        out_interface=iface,
        mark=mark,
    )


def inbound(port, *, src="10.244.2.7", iface="eth0", dst=POD):
    return Connection(
        "in",
        "tcp",
        ipaddress.ip_address(src),
        40000,
        ipaddress.ip_address(dst),
        port,
        in_interface=iface,
    )


def test_app_traffic_is_redirected_to_the_outbound_port():
    result = trace(rules(), out("10.96.0.10", 80))
    assert (result.verdict, result.port) == ("redirected", 15001)
    assert result.final.dst_port == 15001
    assert str(result.final.dst) == "127.0.0.1"


def test_the_proxys_own_traffic_is_exempt_and_the_report_says_so():
    result = trace(rules(), out("10.96.0.10", 80, uid=1337))
    assert result.verdict == "not captured"
    assert "uid 1337 exempt" in result.reason
    assert "uid 1337 exempt" in format_trace(result)


def test_gid_alone_is_enough_for_the_exemption():
    assert trace(rules(), out("10.96.0.10", 80, uid=1000, gid=1337)).verdict == "not captured"


@pytest.mark.parametrize(
    ("flags", "dst", "port", "why"),
    [
        ({"outbound_ports_exclude": "5432"}, "10.96.0.10", 5432, "outbound port excluded"),
        ({"outbound_cidrs_exclude": "10.96.0.0/12"}, "10.96.0.10", 80, "10.96.0.0/12 is excluded"),
        ({"outbound_cidrs": "10.0.0.0/8"}, "192.168.1.1", 80, "no meshctl rule applies"),
        ({}, "127.0.0.1", 8080, "loopback"),
    ],
)
def test_exclusions_bypass_capture(flags, dst, port, why):
    iface = "lo" if dst.startswith("127.") else "eth0"
    result = trace(rules(**flags), out(dst, port, iface=iface, src=dst if iface == "lo" else POD))
    assert result.verdict == "not captured"
    assert why in result.reason


def test_outbound_ports_include_captures_regardless_of_destination():
    result = trace(rules(outbound_cidrs="", outbound_ports="3306"), out("192.168.1.1", 3306))
    assert (result.verdict, result.port) == ("redirected", 15001)


def test_inbound_goes_to_15006_except_15008_and_excluded_ports():
    assert trace(rules(), inbound(8080)).port == 15006
    assert trace(rules(), inbound(15008)).verdict == "not captured"
    assert "excluded" in trace(rules(), inbound(15021)).reason


def test_proxy_calling_its_own_pod_via_a_vip_hairpins_to_the_inbound_listener():
    result = trace(rules(), out(POD, 8080, uid=1337, iface="lo"))
    assert (result.verdict, result.port) == ("redirected", 15006)


def test_dns_reaches_the_dns_proxy_over_udp_and_tcp():
    flags = {"redirect_dns": True, "dns_servers": "10.96.0.10"}
    assert trace(rules(**flags), out("10.96.0.10", 53, proto="udp")).port == 15053
    assert trace(rules(**flags), out("10.96.0.10", 53)).port == 15053
    # a resolver that is not in the list is not captured over UDP
    assert trace(rules(**flags), out("8.8.8.8", 53, proto="udp")).verdict == "not captured"


def test_tproxy_keeps_the_destination_and_marks_the_packet():
    result = trace(rules(interception_mode="TPROXY"), inbound(8080))
    assert (result.verdict, result.port) == ("tproxy", 15006)
    assert result.final.mark == 1337
    assert str(result.final.dst) == POD


def test_ambient_redirects_app_traffic_but_not_the_node_proxys_marked_traffic():
    assert trace(rules(mode="ambient"), out("10.96.0.10", 80)).port == 15001
    marked = trace(rules(mode="ambient"), out("10.96.0.10", 80, mark=0x539))
    assert marked.verdict == "not captured"
    assert trace(rules(mode="ambient"), inbound(8080)).port == 15006


def test_ipv6_outbound_is_redirected_with_ipv6_rules():
    conn = out("fd00::10", 443, src="fd00::5")
    result = trace(rules(Family.IPV6, dual_stack=True), conn)
    assert (result.verdict, result.port) == ("redirected", 15001)
    assert str(result.final.dst) == "::1"


def test_every_visited_rule_is_reported_with_why_it_did_not_match():
    result = trace(rules(), out("10.96.0.10", 80))
    misses = [s for s in result.steps if not s.matched]
    assert misses
    assert all(s.detail for s in misses)
    assert any("out-interface eth0 is not lo" in s.detail for s in misses)


def test_unmodelled_matches_raise_a_typed_error():
    ruleset = parse("*nat\n-A OUTPUT -m set --match-set x dst -j ACCEPT\nCOMMIT\n")
    with pytest.raises(TraceError, match="-m set"):
        trace(ruleset, out("10.0.0.1", 80))


def test_a_jump_loop_is_reported_not_followed_forever():
    ruleset = parse("*nat\n:MESH_A - [0:0]\n-A OUTPUT -j MESH_A\n-A MESH_A -j MESH_A\nCOMMIT\n")
    with pytest.raises(TraceError, match="jump loop"):
        trace(ruleset, out("10.0.0.1", 80))


_connections = st.builds(
    out,
    st.sampled_from(["10.96.0.10", POD, "127.0.0.1", "8.8.8.8"]),
    st.sampled_from([53, 80, 15001, 15006, 15008, 15021, 3306]),
    uid=st.sampled_from([0, 1000, 1337]),
    iface=st.sampled_from(["eth0", "lo"]),
    proto=st.sampled_from(["tcp", "udp"]),
)


@settings(max_examples=200)
@given(
    _connections,
    st.sampled_from(["REDIRECT", "TPROXY"]),
    st.booleans(),
)
def test_the_proxy_uid_is_never_sent_to_its_own_outbound_port(conn, mode, dns):
    flags = {"interception_mode": mode, "redirect_dns": dns, "capture_all_dns": dns}
    result = trace(rules(**flags), conn)
    if conn.uid == 1337:
        assert result.port != 15001
