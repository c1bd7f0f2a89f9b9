"""The rule sets: Istio's default rules with MESH_ names; invariants every configuration keeps."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from meshctl.config import resolve
from meshctl.core.capture.parse import parse_rule
from meshctl.core.capture.plan import plan
from meshctl.core.capture.render import rule_text
from meshctl.core.capture.rules import Family, RuleSet, is_builtin, is_ours
from meshctl.core.capture.settings import CaptureSettings


def build(family=Family.IPV4, **flags) -> RuleSet:
    return plan(resolve(CaptureSettings, flags=flags, env={})).ruleset(family)


def chain_rules(ruleset: RuleSet, table: str, chain: str) -> list[str]:
    found = ruleset.table(table)
    got = found.chain(chain) if found else None
    return [rule_text(r) for r in got.rules] if got else []


# What istio-iptables installs for the injector's default arguments
# (-p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x "" -b '*' -d 15090,15021,15020), spelled as
# iptables-save prints it, with ISTIO_ -> MESH_.
ISTIO_DEFAULT = {
    ("nat", "PREROUTING"): ["-p tcp -j MESH_INBOUND"],
    ("nat", "OUTPUT"): ["-j MESH_OUTPUT"],
    ("nat", "MESH_INBOUND"): [
        "-p tcp -m tcp --dport 15008 -j RETURN",
        "-p tcp -m multiport --dports 15090,15021,15020 -j RETURN",
        "-p tcp -j MESH_IN_REDIRECT",
    ],
    ("nat", "MESH_REDIRECT"): ["-p tcp -j REDIRECT --to-ports 15001"],
    ("nat", "MESH_IN_REDIRECT"): ["-p tcp -j REDIRECT --to-ports 15006"],
    ("nat", "MESH_OUTPUT"): [
        "-s 127.0.0.6/32 -o lo -j RETURN",
        (
            "! -d 127.0.0.1/32 -o lo -p tcp -m tcp ! --dport 15008 -m owner --uid-owner 1337 "
            "-j MESH_IN_REDIRECT"
        ),
        "-o lo -m owner ! --uid-owner 1337 -j RETURN",
        "-m owner --uid-owner 1337 -j RETURN",
        (
            "! -d 127.0.0.1/32 -o lo -p tcp -m tcp ! --dport 15008 -m owner --gid-owner 1337 "
            "-j MESH_IN_REDIRECT"
        ),
        "-o lo -m owner ! --gid-owner 1337 -j RETURN",
        "-m owner --gid-owner 1337 -j RETURN",
        "-d 127.0.0.1/32 -j RETURN",
        "-j MESH_REDIRECT",
    ],
}


def test_default_rules_equal_istios_default_rules():
    ruleset = build()
    got = {
        (t.name, c.name): [rule_text(r) for r in c.rules] for t in ruleset.tables for c in t.chains
    }
    assert got == ISTIO_DEFAULT


def test_dns_capture_adds_istios_dns_chain_and_conntrack_zones():
    ruleset = build(redirect_dns=True, dns_servers="10.96.0.10")
    out = chain_rules(ruleset, "nat", "MESH_OUTPUT")
    assert out.index("-j MESH_OUTPUT_DNS") == out.index("-d 127.0.0.1/32 -j RETURN") - 1
    assert chain_rules(ruleset, "nat", "MESH_OUTPUT_DNS") == [
        "-d 10.96.0.10/32 -p tcp -m tcp --dport 53 -j REDIRECT --to-ports 15053",
        "-d 10.96.0.10/32 -p udp -m udp --dport 53 -j REDIRECT --to-ports 15053",
    ]
    assert chain_rules(ruleset, "raw", "OUTPUT") == ["-j MESH_OUTPUT_DNS"]
    assert chain_rules(ruleset, "raw", "MESH_INBOUND") == [
        "-s 10.96.0.10/32 -p udp -m udp --sport 53 -j CT --zone 1"
    ]
    # uid hairpin skips 53 too; the gid one only the tunnel port (as istio-iptables does)
    assert "-m multiport ! --dports 53,15008 -m owner --uid-owner 1337" in " ".join(out)
    assert "-m tcp ! --dport 15008 -m owner --gid-owner 1337" in " ".join(out)


def test_tproxy_marks_and_diverts_in_mangle_and_keeps_15008_exempt():
    ruleset = build(interception_mode="TPROXY")
    assert chain_rules(ruleset, "mangle", "MESH_TPROXY") == [
        (
            "! -d 127.0.0.1/32 -p tcp -j TPROXY --on-port 15006 --on-ip 0.0.0.0 "
            "--tproxy-mark 0x539/0xffffffff"
        )
    ]
    inbound = chain_rules(ruleset, "mangle", "MESH_INBOUND")
    assert inbound[0] == "-p tcp -m tcp --dport 15008 -j RETURN"
    assert inbound[-2:] == [
        "-p tcp -m conntrack --ctstate RELATED,ESTABLISHED -j MESH_DIVERT",
        "-p tcp -j MESH_TPROXY",
    ]
    assert chain_rules(ruleset, "mangle", "PREROUTING") == ["-j MESH_PRERT"]
    assert chain_rules(ruleset, "nat", "PREROUTING") == []  # no nat inbound in TPROXY mode


def test_ambient_rules_follow_istios_in_pod_redirection():
    ruleset = build(mode="ambient")
    assert chain_rules(ruleset, "nat", "MESH_OUTPUT")[-1] == (
        "! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001"
    )
    assert chain_rules(ruleset, "nat", "MESH_PRERT")[-1] == (
        "! -d 127.0.0.1/32 -p tcp -m tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff "
        "-j REDIRECT --to-ports 15006"
    )
    assert chain_rules(ruleset, "mangle", "MESH_PRERT") == [
        "-m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff"
    ]


def test_ipv6_rule_set_uses_ipv6_loopback_and_passthrough():
    ruleset = build(Family.IPV6, dual_stack=True, outbound_cidrs="10.0.0.0/8,fd00::/8")
    out = chain_rules(ruleset, "nat", "MESH_OUTPUT")
    assert "-s ::6/128 -o lo -j RETURN" in out
    assert "-d ::1/128 -j RETURN" in out
    assert "-d fd00::/8 -j MESH_REDIRECT" in out
    assert not any("10.0.0.0/8" in r for r in out)  # IPv4 CIDRs stay in the IPv4 set


def test_excluded_interfaces_go_to_a_hook_chain_never_straight_into_prerouting():
    ruleset = build(exclude_interfaces="eth1")
    assert chain_rules(ruleset, "nat", "PREROUTING") == ["-j MESH_PRERT"]
    assert chain_rules(ruleset, "nat", "MESH_PRERT") == [
        "-i eth1 -j RETURN",
        "-p tcp -j MESH_INBOUND",
    ]
    assert chain_rules(ruleset, "nat", "MESH_OUTPUT")[0] == "-o eth1 -j RETURN"


def test_many_excluded_ports_split_into_multiport_rules_of_fifteen():
    ruleset = build(outbound_ports_exclude=",".join(str(p) for p in range(1000, 1020)))
    tcp = [r for r in chain_rules(ruleset, "nat", "MESH_OUTPUT") if r.startswith("-p tcp -m multi")]
    assert [len(r.split("--dports ")[1].split(" ")[0].split(",")) for r in tcp] == [15, 5]


_knobs = st.fixed_dictionaries(
    {},
    optional={
        "mode": st.sampled_from(["sidecar", "ambient"]),
        "interception_mode": st.sampled_from(["REDIRECT", "TPROXY"]),
        "inbound_ports": st.sampled_from(["*", "", "80,443"]),
        "inbound_ports_exclude": st.sampled_from(["", "22", "15090,15021,15020"]),
        "outbound_cidrs": st.sampled_from(["*", "", "10.0.0.0/8,fd00::/8", "127.0.0.1/32"]),
        "outbound_cidrs_exclude": st.sampled_from(["", "10.96.0.0/12", "fd00:1::/32"]),
        "outbound_ports": st.sampled_from(["", "3306"]),
        "outbound_ports_exclude": st.sampled_from(["", "22,80"]),
        "exclude_interfaces": st.sampled_from(["", "eth1"]),
        "kube_virt_interfaces": st.sampled_from(["", "k1,k2"]),
        "proxy_uid": st.sampled_from(["1337", "1,2"]),
        "redirect_dns": st.booleans(),
        "capture_all_dns": st.booleans(),
        "dns_servers": st.sampled_from(["", "10.96.0.10,fd00::10"]),
        "dual_stack": st.booleans(),
        "drop_invalid": st.booleans(),
    },
)


def _settings_or_none(flags):
    if flags.get("mode") == "ambient":
        flags.pop("interception_mode", None)
    return resolve(CaptureSettings, flags=flags, env={})


@settings(max_examples=150)
@given(_knobs)
def test_every_configuration_keeps_the_ownership_invariants(flags):
    for ruleset in plan(_settings_or_none(flags)).rulesets:
        assert ruleset == ruleset.ours(), "everything built is meshctl's (MESH_ chains + jumps)"
        for table in ruleset.tables:
            names = {c.name for c in table.chains}
            for chain in table.chains:
                assert is_builtin(table.name, chain.name) or is_ours(chain.name)
                for rule in chain.rules:
                    if is_builtin(table.name, chain.name):
                        assert rule.jump is not None, "built-in chains only jump into MESH_"
                    if rule.jump is not None:
                        assert rule.jump in names, "every jump has its chain"
                    assert parse_rule(rule_text(rule)) == rule, "canonical spelling"


@settings(max_examples=50)
@given(_knobs)
def test_ipv6_rules_exist_exactly_when_dual_stack(flags):
    built = plan(_settings_or_none(flags))
    assert (Family.IPV6 in built.families) == bool(flags.get("dual_stack"))
