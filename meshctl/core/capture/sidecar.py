"""Sidecar capture (REDIRECT or TPROXY): the rule set istio-iptables installs, with MESH_ names.

Invariants:
- For default settings the rules are Istio's (same matches, order and targets): nat
  ``PREROUTING -p tcp -j MESH_INBOUND``, ``OUTPUT -j MESH_OUTPUT``; MESH_INBOUND returns the
  tunnel port 15008 and the excluded ports, then jumps to MESH_IN_REDIRECT (-> 15006);
  MESH_OUTPUT returns excluded ports, 127.0.0.6 on lo, then per proxy uid and gid the triple
  {loopback hairpin to MESH_IN_REDIRECT, other loopback RETURN, proxy's own traffic RETURN},
  ``-d 127.0.0.1/32`` RETURN, excluded CIDRs, then MESH_REDIRECT (-> 15001).
- Rules are emitted in istio-iptables' order (``tools/istio-iptables/pkg/capture/run.go``);
  within a chain that order is the evaluation order.
- Deliberate differences, all so that meshctl owns only ``MESH_*`` chains: where Istio puts
  non-jump rules straight into a built-in chain (excluded/kube-virt interfaces, TPROXY marks), they
  go into a hook chain (``MESH_PRERT`` / mangle ``MESH_OUTPUT``) that the built-in chain jumps to,
  and excluded-interface RETURNs of nat OUTPUT open MESH_OUTPUT (which OUTPUT jumps to
  unconditionally). In TPROXY mode the tunnel port is exempt too ("15008 is never captured").
"""

from __future__ import annotations

from dataclasses import dataclass

from meshctl.core.capture.parse import rule
from meshctl.core.capture.rules import Family, Rule, RuleSet, RuleSetBuilder
from meshctl.core.capture.settings import (
    ALL,
    DNS_CAPTURE_PORT,
    TPROXY_OUTBOUND_MARK,
    Address,
    CaptureSettings,
    Network,
    Wildcard,
    of_family,
)

INBOUND = "MESH_INBOUND"
REDIRECT = "MESH_REDIRECT"
IN_REDIRECT = "MESH_IN_REDIRECT"
OUTPUT = "MESH_OUTPUT"
OUTPUT_DNS = "MESH_OUTPUT_DNS"
DIVERT = "MESH_DIVERT"
TPROXY = "MESH_TPROXY"
DROP = "MESH_DROP"
# Hook chains holding what Istio would put into a built-in chain directly.
HOOK_CHAINS = {"PREROUTING": "MESH_PRERT", "OUTPUT": "MESH_OUTPUT"}

_FULL_MASK = "0xffffffff"
_MULTIPORT_MAX = 15  # the multiport match takes at most 15 ports


def port_matches(protocol: str, ports: tuple[int, ...], *, negated: bool = False) -> list[str]:
    """``-m tcp --dport P`` for one port, ``-m multiport --dports A,B`` for more (15 a rule)."""
    bang = "! " if negated else ""
    if len(ports) == 1:
        return [f"-m {protocol} {bang}--dport {ports[0]}"]
    chunks = [ports[i : i + _MULTIPORT_MAX] for i in range(0, len(ports), _MULTIPORT_MAX)]
    return [f"-m multiport {bang}--dports {','.join(map(str, c))}" for c in chunks]


class _Hooks:
    """What Istio would append to built-in chains, in order; folded into our chains on build."""

    def __init__(self) -> None:
        self.rules: dict[tuple[str, str], list[Rule]] = {}

    def __call__(self, table: str, chain: str) -> list[Rule]:
        return self.rules.setdefault((table, chain), [])

    def install(self, builder: RuleSetBuilder) -> None:
        for (table, chain), rules in self.rules.items():
            if all(
                r.jump is not None and r.target is not None and not r.target.goto for r in rules
            ):
                builder.add(table, chain, *rules)
                continue
            hook = HOOK_CHAINS[chain]
            if builder.chain(table, hook):
                raise AssertionError(f"hook chain {table}/{hook} is already in use")
            builder.add(table, chain, rule(f"-j {hook}", f"all of meshctl's {table} {chain} rules"))
            builder.add(table, hook, *rules)


@dataclass(frozen=True, slots=True)
class _Family:
    """The per-family spellings and selections one build uses."""

    family: Family
    version: int
    host: str  # "/32" or "/128"
    lo: str  # the loopback destination never captured
    passthrough: str  # the proxy's inbound passthrough source (127.0.0.6 / ::6)
    any_ip: str
    include: Wildcard | list[Network]  # outbound CIDRs of this family, or ALL
    servers: list[Address]  # DNS resolvers of this family

    @classmethod
    def of(cls, s: CaptureSettings, family: Family) -> _Family:
        v4 = family is Family.IPV4
        version = 4 if v4 else 6
        return cls(
            family=family,
            version=version,
            host="/32" if v4 else "/128",
            lo=str(s.outbound_ipv4_loopback_cidr) if v4 else "::1/128",
            passthrough="127.0.0.6/32" if v4 else "::6/128",
            any_ip="0.0.0.0" if v4 else "::",  # noqa: S104 (TPROXY's --on-ip, not a bind)
            include=ALL if s.outbound_cidrs == ALL else of_family(s.outbound_cidrs, version),
            servers=of_family(s.dns_servers, version),
        )


def build(s: CaptureSettings, family: Family) -> RuleSet:
    """The sidecar rule set for ``family`` (IPv4 rules use IPv4 CIDRs/resolvers only, and so on).

    The steps run in istio-iptables' order; each appends to the chains it owns.
    """
    f = _Family.of(s, family)
    b = RuleSetBuilder(family)
    hook = _Hooks()
    _interfaces(s, b, hook)
    _redirect_chains(s, b, hook)
    if s.inbound_ports != ():
        _inbound(s, f, b, hook)
    hook("nat", "OUTPUT").append(rule(f"-j {OUTPUT}", "all locally generated traffic"))
    _outbound(s, f, b, hook)
    if s.tproxy:
        _tproxy_marks(s, f, b, hook)
    hook.install(b)
    return b.build()


def _interfaces(s: CaptureSettings, b: RuleSetBuilder, hook: _Hooks) -> None:
    """Excluded interfaces return everywhere; kube-virt interfaces are not inbound traffic."""
    out = b.chain("nat", OUTPUT)
    for iface in s.exclude_interfaces:
        why = f"interface {iface} is excluded from capture"
        hook("nat", "PREROUTING").append(rule(f"-i {iface} -j RETURN", why))
        out.append(rule(f"-o {iface} -j RETURN", why))
        if s.tproxy:
            hook("mangle", "PREROUTING").append(rule(f"-i {iface} -j RETURN", why))
            hook("mangle", "OUTPUT").append(rule(f"-o {iface} -j RETURN", why))
    for iface in s.kube_virt_interfaces:
        hook("nat", "PREROUTING").insert(
            0, rule(f"-i {iface} -j RETURN", f"kube-virt interface {iface}: not inbound traffic")
        )


def _redirect_chains(s: CaptureSettings, b: RuleSetBuilder, hook: _Hooks) -> None:
    if s.drop_invalid:
        hook("mangle", "PREROUTING").append(
            rule(f"-m conntrack --ctstate INVALID -j {DROP}", "conntrack state INVALID")
        )
        b.add("mangle", DROP, rule("-j DROP", "invalid packets are dropped, not reset"))
    if not s.tproxy:
        b.add("nat", INBOUND, _tunnel_exempt(s))
    b.add(
        "nat",
        REDIRECT,
        rule(
            f"-p tcp -j REDIRECT --to-ports {s.proxy_port}",
            f"outbound capture: to the proxy's outbound port {s.proxy_port}",
        ),
    )
    b.add(
        "nat",
        IN_REDIRECT,
        rule(
            f"-p tcp -j REDIRECT --to-ports {s.inbound_capture_port}",
            f"inbound capture: to the proxy's inbound port {s.inbound_capture_port}",
        ),
    )


def _tunnel_exempt(s: CaptureSettings) -> Rule:
    return rule(
        f"-p tcp -m tcp --dport {s.inbound_tunnel_port} -j RETURN",
        f"the HBONE tunnel port {s.inbound_tunnel_port} is never captured",
    )


def _inbound(s: CaptureSettings, f: _Family, b: RuleSetBuilder, hook: _Hooks) -> None:
    """Inbound capture: nat REDIRECT to the inbound port, or mangle TPROXY (address kept)."""
    mark = hex(s.tproxy_mark)
    table = "mangle" if s.tproxy else "nat"
    if s.tproxy:
        b.add(
            "mangle",
            DIVERT,
            rule(f"-j MARK --set-xmark {mark}/{_FULL_MASK}", f"mark {mark}: a proxied connection"),
            rule("-j ACCEPT", "established inbound connection: delivered to the proxy"),
        )
        b.add(
            "mangle",
            TPROXY,
            rule(
                f"! -d {f.lo} -p tcp -j TPROXY --on-port {s.inbound_capture_port} "
                f"--on-ip {f.any_ip} --tproxy-mark {mark}/{_FULL_MASK}",
                f"inbound capture: TPROXY to port {s.inbound_capture_port}, "
                "original destination kept",
            ),
        )
    hook(table, "PREROUTING").append(rule(f"-p tcp -j {INBOUND}", "inbound TCP"))
    if s.inbound_ports == ALL:
        excluded = s.inbound_ports_exclude
        for ports in port_matches("tcp", excluded) if excluded else []:
            b.add(table, INBOUND, rule(f"-p tcp {ports} -j RETURN", "inbound port excluded"))
        if s.tproxy:
            b.add(
                "mangle",
                INBOUND,
                rule(
                    f"-p tcp -m conntrack --ctstate RELATED,ESTABLISHED -j {DIVERT}",
                    "packet of an established connection",
                ),
                rule(f"-p tcp -j {TPROXY}", "every other inbound port is captured"),
            )
        else:
            b.add("nat", INBOUND, rule(f"-p tcp -j {IN_REDIRECT}", "inbound ports: all"))
        return
    for port in s.inbound_ports:
        if s.tproxy:
            b.add(
                "mangle",
                INBOUND,
                rule(
                    f"-p tcp -m tcp --dport {port} -m conntrack --ctstate "
                    f"RELATED,ESTABLISHED -j {DIVERT}",
                    f"established connection to captured port {port}",
                ),
                rule(f"-p tcp -m tcp --dport {port} -j {TPROXY}", f"inbound port {port}"),
            )
        else:
            b.add(
                "nat",
                INBOUND,
                rule(f"-p tcp -m tcp --dport {port} -j {IN_REDIRECT}", f"inbound port {port}"),
            )


def _owners(s: CaptureSettings) -> list[tuple[str, int]]:
    """("uid", n) for each proxy uid, then ("gid", n) for each gid: Istio's order."""
    return [("uid", uid) for uid in s.proxy_uid] + [("gid", gid) for gid in s.gids]


def _outbound(s: CaptureSettings, f: _Family, b: RuleSetBuilder, hook: _Hooks) -> None:
    """MESH_OUTPUT after the excluded-interface returns, in istio-iptables' order."""
    out = b.chain("nat", OUTPUT)
    dns = s.dns_enabled
    if s.outbound_ports_exclude:
        for protocol in ("tcp", "udp"):
            for ports in port_matches(protocol, s.outbound_ports_exclude):
                out.append(rule(f"-p {protocol} {ports} -j RETURN", "outbound port excluded"))
    out.append(
        rule(
            f"-s {f.passthrough} -o lo -j RETURN",
            f"source {f.passthrough.split('/', 1)[0]}: the proxy's inbound passthrough",
        )
    )
    _proxy_owner_rules(s, f, out)
    _owner_groups(s, out)
    if dns:
        _dns(s, b, hook, f.servers, f.host)
        if s.capture_all_dns or f.servers:
            out.append(rule(f"-j {OUTPUT_DNS}", "DNS capture"))
    out.append(rule(f"-d {f.lo} -j RETURN", f"destination {f.lo}: loopback is never captured"))
    for net in of_family(s.outbound_cidrs_exclude, f.version):
        out.append(rule(f"-d {net} -j RETURN", f"destination {net} is excluded"))
    for port in s.outbound_ports:
        out.append(
            rule(f"-p tcp -m tcp --dport {port} -j {REDIRECT}", f"outbound port {port} is captured")
        )
    _include(s, f, out, hook("nat", "PREROUTING"))


def _owner_groups(s: CaptureSettings, out: list[Rule]) -> None:
    """ISTIO_OUTBOUND_OWNER_GROUPS(_EXCLUDE): capture only some groups, or exempt some."""
    if s.outbound_owner_groups_exclude:
        for group in s.outbound_owner_groups_exclude:
            out.append(rule(f"-m owner --gid-owner {group} -j RETURN", f"group {group} is exempt"))
    elif s.outbound_owner_groups != ALL and s.outbound_owner_groups:
        none_of = " ".join(f"-m owner ! --gid-owner {g}" for g in s.outbound_owner_groups)
        out.append(rule(f"{none_of} -j RETURN", "only the listed owner groups are captured"))


def _include(s: CaptureSettings, f: _Family, out: list[Rule], prerouting: list[Rule]) -> None:
    """The captured destinations (kube-virt interfaces are inserted on top of PREROUTING)."""
    if f.include == ALL:
        out.append(rule(f"-j {REDIRECT}", "outbound capture: all destinations"))
        for iface in s.kube_virt_interfaces:
            prerouting.insert(
                0, rule(f"-i {iface} -j {REDIRECT}", f"kube-virt interface {iface}: outbound")
            )
        return
    for net in f.include:
        for iface in s.kube_virt_interfaces:
            prerouting.insert(
                0,
                rule(
                    f"-d {net} -i {iface} -j {REDIRECT}",
                    f"kube-virt interface {iface} to {net}: outbound",
                ),
            )
        out.append(rule(f"-d {net} -j {REDIRECT}", f"destination {net} is captured"))


def _proxy_owner_rules(s: CaptureSettings, f: _Family, out: list[Rule]) -> None:
    """Per proxy uid, then gid: hairpin to the inbound listener, app loopback, proxy exempt."""
    dns = s.dns_enabled
    tunnel = s.inbound_tunnel_port
    loopback_included = s.outbound_cidrs != ALL and any(
        n.network_address.is_loopback for n in s.outbound_cidrs
    )
    for kind, ident in _owners(s):
        # A uid-owned hairpin skips DNS too when DNS is captured (istio-iptables does this for
        # uids only): app -> agent DNS must not loop through the inbound listener.
        skip = (
            f"-m multiport ! --dports 53,{tunnel}"
            if dns and kind == "uid"
            else f"-m tcp ! --dport {tunnel}"
        )
        out.append(
            rule(
                f"! -d {f.lo} -o lo -p tcp {skip} -m owner --{kind}-owner {ident} -j {IN_REDIRECT}",
                f"the proxy ({kind} {ident}) calling its own pod via a service VIP: "
                "back to the inbound listener",
            )
        )
        if not loopback_included:
            local = "-p tcp -m tcp ! --dport 53 " if dns else ""
            out.append(
                rule(
                    f"-o lo {local}-m owner ! --{kind}-owner {ident} -j RETURN",
                    f"loopback traffic of the app ({kind} not {ident}) is not captured",
                )
            )
        out.append(
            rule(
                f"-m owner --{kind}-owner {ident} -j RETURN",
                f"{kind} {ident} exempt: the proxy's own traffic",
            )
        )


def _tproxy_marks(s: CaptureSettings, f: _Family, b: RuleSetBuilder, hook: _Hooks) -> None:
    """TPROXY's marks: keep the proxy's mark on its connections, route replies back to it."""
    mark = hex(s.tproxy_mark)
    outbound_mark = hex(TPROXY_OUTBOUND_MARK)
    hook("mangle", "PREROUTING").append(
        rule(
            f"-p tcp -m mark --mark {mark} -j CONNMARK --save-mark "
            f"--nfmask {_FULL_MASK} --ctmask {_FULL_MASK}",
            "keep the proxy's mark on the connection",
        )
    )
    mangle_out = hook("mangle", "OUTPUT")
    mangle_out.append(
        rule(f"-o lo -p tcp -m mark --mark {mark} -j RETURN", f"already marked {mark}")
    )
    for kind, ident in _owners(s):
        mangle_out.append(
            rule(
                f"! -d {f.lo} -o lo -p tcp -m owner --{kind}-owner {ident} "
                f"-j MARK --set-xmark {outbound_mark}/{_FULL_MASK}",
                f"the proxy ({kind} {ident}) to the app over loopback: mark {outbound_mark}",
            )
        )
    mangle_out.append(
        rule(
            f"-p tcp -m connmark --mark {mark} -j CONNMARK --restore-mark "
            f"--nfmask {_FULL_MASK} --ctmask {_FULL_MASK}",
            "replies of proxied connections take the TPROXY route",
        )
    )
    # istio-iptables inserts these at positions 1-3 of ISTIO_INBOUND; the tunnel port goes first
    # (our addition: in TPROXY mode too, 15008 is never captured).
    b.chain("mangle", INBOUND)[0:0] = [
        _tunnel_exempt(s),
        rule(f"-p tcp -m mark --mark {mark} -j RETURN", f"mark {mark}: already diverted"),
        rule(
            f"-s {f.passthrough} -i lo -p tcp -j RETURN",
            "the proxy's inbound passthrough to the app",
        ),
        rule(
            f"-i lo -p tcp -m mark ! --mark {outbound_mark} -j RETURN",
            "app to itself over loopback",
        ),
    ]


def _dns(
    s: CaptureSettings, b: RuleSetBuilder, hook: _Hooks, servers: list[Address], host: str
) -> None:
    """DNS to 15053 (nat) and the conntrack zone split (raw) istio-iptables adds for DNS."""
    hook("raw", "OUTPUT").append(rule(f"-j {OUTPUT_DNS}", "DNS conntrack zones"))
    nat = b.chain("nat", OUTPUT_DNS)
    raw = b.chain("raw", OUTPUT_DNS)
    to = f"to the DNS proxy on {DNS_CAPTURE_PORT}"
    for protocol in ("tcp", "udp"):
        if s.capture_all_dns:
            nat.append(
                rule(
                    f"-p {protocol} -m {protocol} --dport 53 -j REDIRECT --to-ports "
                    f"{DNS_CAPTURE_PORT}",
                    f"DNS over {protocol.upper()} {to}",
                )
            )
        for server in [] if s.capture_all_dns else servers:
            nat.append(
                rule(
                    f"-d {server}{host} -p {protocol} -m {protocol} --dport 53 -j REDIRECT "
                    f"--to-ports {DNS_CAPTURE_PORT}",
                    f"DNS over {protocol.upper()} to resolver {server} {to}",
                )
            )
    owners = [("uid", i) for i in s.proxy_uid] + [("gid", i) for i in s.gids]
    for kind, ident in owners:
        raw.extend(
            (
                rule(
                    f"-p udp -m udp --dport 53 -m owner --{kind}-owner {ident} -j CT --zone 1",
                    "proxy -> upstream resolver: conntrack zone 1",
                ),
                rule(
                    f"-p udp -m udp --sport {DNS_CAPTURE_PORT} -m owner --{kind}-owner {ident} "
                    "-j CT --zone 2",
                    "DNS proxy -> app: conntrack zone 2",
                ),
            )
        )
    targets = [""] if s.capture_all_dns else [f"{server}{host}" for server in servers]
    if targets:
        hook("raw", "PREROUTING").append(rule(f"-j {INBOUND}", "DNS replies: conntrack zones"))
    for target in targets:
        dst, src = (f"-d {target} ", f"-s {target} ") if target else ("", "")
        raw.append(rule(f"{dst}-p udp -m udp --dport 53 -j CT --zone 2", "app -> resolver: zone 2"))
        b.add(
            "raw",
            INBOUND,
            rule(f"{src}-p udp -m udp --sport 53 -j CT --zone 1", "resolver -> proxy: zone 1"),
        )
