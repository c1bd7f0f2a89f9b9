"""Ambient in-pod capture: the rules a node proxy (ztunnel) needs inside a pod's network namespace.

Invariants (Istio's in-pod redirection, ``cni/pkg/iptables``, with MESH_ names):
- Built-in chains only jump to ``MESH_PRERT`` / ``MESH_OUTPUT`` (mangle and nat; raw too with DNS).
- The node proxy's own sockets carry mark 0x539/0xfff and are never redirected; connections it
  accepted get connmark 0x111/0xfff, restored on the way out, so replies follow the policy route
  (fwmark 0x111/0xfff -> table 100 -> local) back to the proxy (see ``routing``).
- Inbound TCP (except the tunnel port 15008 and loopback) -> 15006, outbound TCP -> 15001, DNS
  (udp and tcp 53) -> 15053, kubelet probes from the SNAT address 169.254.7.127 pass untouched.
"""

from __future__ import annotations

from meshctl.core.capture.parse import rule
from meshctl.core.capture.rules import Family, RuleSet, RuleSetBuilder
from meshctl.core.capture.settings import (
    AMBIENT_CONN_MARK,
    AMBIENT_MARK_MASK,
    AMBIENT_PROXY_MARK,
    DNS_CAPTURE_PORT,
    CaptureSettings,
)

PRERT = "MESH_PRERT"
OUTPUT = "MESH_OUTPUT"
_FULL_MASK = "0xffffffff"


def build(s: CaptureSettings, family: Family) -> RuleSet:
    v4 = family is Family.IPV4
    lo = "127.0.0.1/32" if v4 else "::1/128"
    probe = f"{s.probe_snat_ipv4}/32" if v4 else f"{s.probe_snat_ipv6}/128"
    proxy_mark = f"{hex(AMBIENT_PROXY_MARK)}/{hex(AMBIENT_MARK_MASK)}"
    conn_mark = f"{hex(AMBIENT_CONN_MARK)}/{hex(AMBIENT_MARK_MASK)}"
    not_proxy = f"-m mark ! --mark {proxy_mark}"
    dns = s.redirect_dns

    b = RuleSetBuilder(family)
    b.add("mangle", "PREROUTING", rule(f"-j {PRERT}", "meshctl's mangle PREROUTING rules"))
    b.add("mangle", "OUTPUT", rule(f"-j {OUTPUT}", "meshctl's mangle OUTPUT rules"))
    b.add("nat", "OUTPUT", rule(f"-j {OUTPUT}", "meshctl's nat OUTPUT rules"))
    if dns:
        b.add("raw", "PREROUTING", rule(f"-j {PRERT}", "DNS conntrack zones"))
        b.add("raw", "OUTPUT", rule(f"-j {OUTPUT}", "DNS conntrack zones"))
    b.add("nat", "PREROUTING", rule(f"-j {PRERT}", "meshctl's nat PREROUTING rules"))

    nat_pre = b.chain("nat", PRERT)
    nat_out = b.chain("nat", OUTPUT)
    for iface in s.kube_virt_interfaces:
        nat_pre.extend(
            (
                rule(
                    f"-i {iface} -p tcp -j REDIRECT --to-ports {s.proxy_port}",
                    f"virtual interface {iface}: treated as outbound, to {s.proxy_port}",
                ),
                rule(f"-i {iface} -p tcp -j RETURN", f"virtual interface {iface}: done"),
            )
        )
    b.add(
        "mangle",
        PRERT,
        rule(
            f"-m mark --mark {proxy_mark} -j CONNMARK --set-xmark {conn_mark}",
            f"the node proxy's packet (mark {proxy_mark}): connmark {conn_mark}",
        ),
    )
    nat_pre.append(
        rule(f"-s {probe} -p tcp -m tcp -j ACCEPT", "kubelet probe (SNAT source): not captured")
    )
    nat_out.append(
        rule(f"-d {probe} -p tcp -m tcp -j ACCEPT", "reply to a kubelet probe: not captured")
    )
    nat_pre.append(
        rule(
            f"! -d {lo} -p tcp -m tcp ! --dport {s.inbound_tunnel_port} {not_proxy} "
            f"-j REDIRECT --to-ports {s.inbound_capture_port}",
            f"inbound capture: to the node proxy's inbound port {s.inbound_capture_port}",
        )
    )
    b.add(
        "mangle",
        OUTPUT,
        rule(
            f"-m connmark --mark {conn_mark} -j CONNMARK --restore-mark "
            f"--nfmask {_FULL_MASK} --ctmask {_FULL_MASK}",
            "replies of proxied connections take the return route",
        ),
    )
    if dns:
        nat_out.extend(
            (
                rule(
                    f"! -o lo -p udp {not_proxy} -m udp --dport 53 "
                    f"-j REDIRECT --to-ports {DNS_CAPTURE_PORT}",
                    f"DNS over UDP to the DNS proxy on {DNS_CAPTURE_PORT}",
                ),
                rule(
                    f"! -d {lo} -p tcp -m tcp --dport 53 {not_proxy} "
                    f"-j REDIRECT --to-ports {DNS_CAPTURE_PORT}",
                    f"DNS over TCP to the DNS proxy on {DNS_CAPTURE_PORT}",
                ),
            )
        )
        b.add(
            "raw",
            OUTPUT,
            rule(
                f"-p udp -m mark --mark {proxy_mark} -m udp --dport 53 -j CT --zone 1",
                "node proxy -> upstream resolver: conntrack zone 1",
            ),
        )
        b.add(
            "raw",
            PRERT,
            rule(
                f"-p udp {not_proxy} -m udp --sport 53 -j CT --zone 1",
                "resolver -> node proxy: conntrack zone 1",
            ),
        )
    nat_out.extend(
        (
            rule(
                f"-p tcp -m mark --mark {conn_mark} -j ACCEPT",
                "reply of a connection the node proxy delivered",
            ),
            rule(f"! -d {lo} -o lo -j ACCEPT", "app to itself over loopback: not captured"),
            rule(
                f"! -d {lo} -p tcp {not_proxy} -j REDIRECT --to-ports {s.proxy_port}",
                f"outbound capture: to the node proxy's outbound port {s.proxy_port}",
            ),
        )
    )
    return b.build()
