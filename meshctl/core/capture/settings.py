"""Capture settings: every knob of ``meshctl iptables`` with Istio's flag and env var names.

Invariants:
- ``CaptureSettings`` is built once at the edge (``meshctl.config.resolve``: flag > env > file >
  default) and is fully validated: every value is typed (ports ``int``, CIDRs ``ip_network``),
  and a value that cannot be used raises ``ConfigError`` (exit 2) naming the flag or env var and
  the value before anything touches a kernel.
- Defaults are what Istio's injector passes to ``istio-iptables`` for a default pod (capture all
  inbound except 15090/15021/15020, capture all outbound), not the bare binary's no-op defaults.
- Sidecar-only knobs are ignored in ambient mode, as Istio's in-pod rules ignore them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Final, Literal

from meshctl.config import resolve, setting
from meshctl.errors import ConfigError

# Istio's port and identity constants (the wire contract; see docs/iptables.md).
PROXY_PORT: Final = 15001
INBOUND_CAPTURE_PORT: Final = 15006
TUNNEL_PORT: Final = 15008
DNS_CAPTURE_PORT: Final = 15053
PROXY_UID: Final = 1337
PROBE_PORT: Final = 15002
TPROXY_MARK: Final = 1337
TPROXY_OUTBOUND_MARK: Final = 1338  # the proxy's own loopback traffic to the app (TPROXY mode)
TPROXY_ROUTE_TABLE: Final = 133
INJECTED_INBOUND_EXCLUDES: Final = (15090, 15021, 15020)
# Ambient in-pod redirection (Istio's cni/pkg/iptables): the node proxy marks its sockets 0x539,
# connections it must route back get connmark 0x111, looked up in table 100 at priority 32764.
AMBIENT_PROXY_MARK: Final = 0x539
AMBIENT_CONN_MARK: Final = 0x111
AMBIENT_MARK_MASK: Final = 0xFFF
AMBIENT_ROUTE_TABLE: Final = 100
AMBIENT_RULE_PRIORITY: Final = 32764
PROBE_SNAT_IPV4: Final = "169.254.7.127"
PROBE_SNAT_IPV6: Final = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff"

ALL: Final = "*"
Wildcard = Literal["*"]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

MODES = ("sidecar", "ambient")
INTERCEPTION_MODES = ("REDIRECT", "TPROXY")

# Linux interface names: at most 15 bytes; iptables accepts a trailing '+' as a wildcard.
_IFNAME = re.compile(r"[A-Za-z0-9_.@:-]{1,15}\+?")
_GROUP = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}|\d{1,10}")
_MAX_ID = 2**32 - 2  # (uid_t)-1 means "no change" to the kernel, never a real owner
# Routing tables 0 (unspec) and 253-255 (default, main, local) belong to the kernel.
_RESERVED_TABLES = frozenset({0, 253, 254, 255})


def _words(raw: object) -> list[str]:
    """A comma (or whitespace) separated flag/env value, or a YAML list, as stripped words."""
    if isinstance(raw, bool):
        raise TypeError("expected a value, not true/false")
    if isinstance(raw, list | tuple):
        return [w for item in raw for w in _words(item)]
    if isinstance(raw, int):
        return [str(raw)]
    if not isinstance(raw, str):
        raise TypeError(f"expected text, not {type(raw).__name__}")
    return [w for w in re.split(r"[,\s]+", raw.strip()) if w]


def parse_port(raw: object) -> int:
    words = _words(raw)
    if len(words) != 1:
        raise ValueError("expected one port number")
    return _port(words[0])


def _port(word: str) -> int:
    if not word.isdigit() or not 1 <= int(word) <= 65535:
        raise ValueError(f"{word!r} is not a port number (1-65535)")
    return int(word)


def parse_ports(raw: object) -> tuple[int, ...]:
    """``"15090,15021"`` -> ``(15090, 15021)``; duplicates dropped, order kept; ``""`` -> ``()``."""
    return tuple(dict.fromkeys(_port(w) for w in _words(raw)))


def parse_port_selection(raw: object) -> Wildcard | tuple[int, ...]:
    """``*`` (every port) or a port list; ``""`` means none."""
    words = _words(raw)
    if words == [ALL]:
        return ALL
    if ALL in words:
        raise ValueError("'*' cannot be combined with ports")
    return parse_ports(words)


def parse_cidrs(raw: object) -> tuple[Network, ...]:
    """CIDRs (or bare addresses = /32, /128), host bits cleared as iptables does; no ``*``."""
    out: list[Network] = []
    for word in _words(raw):
        if word == ALL:
            raise ValueError("'*' is not allowed here (it would exclude every destination)")
        try:
            out.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            raise ValueError(f"{word!r} is not an IP address or CIDR") from None
    return tuple(dict.fromkeys(out))


def parse_cidr_selection(raw: object) -> Wildcard | tuple[Network, ...]:
    words = _words(raw)
    if words == [ALL]:
        return ALL
    if ALL in words:
        raise ValueError("'*' cannot be combined with CIDRs")
    return parse_cidrs(words)


def parse_ipv4_cidr(raw: object) -> ipaddress.IPv4Network:
    (net,) = parse_cidrs(raw) or (None,)
    if not isinstance(net, ipaddress.IPv4Network):
        raise TypeError("expected one IPv4 CIDR such as 127.0.0.1/32")
    return net


def parse_addresses(raw: object) -> tuple[Address, ...]:
    out: list[Address] = []
    for word in _words(raw):
        try:
            out.append(ipaddress.ip_address(word))
        except ValueError:
            raise ValueError(f"{word!r} is not an IP address") from None
    return tuple(dict.fromkeys(out))


def parse_address(raw: object) -> Address:
    addresses = parse_addresses(raw)
    if len(addresses) != 1:
        raise ValueError("expected one IP address")
    return addresses[0]


def parse_ids(raw: object) -> tuple[int, ...]:
    """Numeric uids/gids, comma separated (Istio accepts lists: ``-u 1337,1338``)."""
    out = []
    for word in _words(raw):
        if not word.isdigit() or int(word) > _MAX_ID:
            raise ValueError(f"{word!r} is not a numeric id (0-{_MAX_ID})")
        out.append(int(word))
    if not out:
        raise ValueError("expected at least one numeric id")
    return tuple(dict.fromkeys(out))


def parse_interfaces(raw: object) -> tuple[str, ...]:
    words = _words(raw)
    for word in words:
        if not _IFNAME.fullmatch(word):
            raise ValueError(f"{word!r} is not an interface name (1-15 of A-Z a-z 0-9 _ . @ : -)")
    return tuple(dict.fromkeys(words))


def parse_groups(raw: object) -> tuple[str, ...]:
    words = _words(raw)
    for word in words:
        if not _GROUP.fullmatch(word):
            raise ValueError(f"{word!r} is not a group name or gid")
    return tuple(dict.fromkeys(words))


def parse_group_selection(raw: object) -> Wildcard | tuple[str, ...]:
    words = _words(raw)
    if words == [ALL]:
        return ALL
    return parse_groups(words)


def parse_mark(raw: object) -> int:
    words = _words(raw)
    if len(words) != 1:
        raise ValueError("expected one mark")
    try:
        value = int(words[0], 0)
    except ValueError:
        raise ValueError(f"{words[0]!r} is not a number (decimal or 0x hex)") from None
    if not 1 <= value <= 0xFFFFFFFF:
        raise ValueError("a mark is 1 to 0xffffffff")
    return value


def parse_route_table(raw: object) -> int:
    value = parse_mark(raw)
    if value in _RESERVED_TABLES:
        raise ValueError(
            f"table {value} is reserved by the kernel (0, 253 default, 254 main, 255 local)"
        )
    return value


def parse_mode(raw: object) -> str:
    words = _words(raw)
    if len(words) != 1 or words[0].lower() not in MODES:
        raise ValueError(f"expected one of {', '.join(MODES)}")
    return words[0].lower()


def parse_interception(raw: object) -> str:
    words = _words(raw)
    if len(words) != 1 or words[0].upper() not in INTERCEPTION_MODES:
        raise ValueError(f"expected one of {', '.join(INTERCEPTION_MODES)}")
    return words[0].upper()


def parse_bool(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


_PORT_HINT = "give a port number 1-65535, e.g. 15001"
_PORTS_HINT = "give comma separated ports 1-65535, e.g. 15090,15021"
_CIDRS_HINT = "give comma separated CIDRs, e.g. 10.96.0.0/12,fd00::/8 (or '*' where allowed)"
_IDS_HINT = "give numeric ids, e.g. 1337 (comma separated for several)"


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureSettings:
    """What to capture and where to send it (Istio's istio-iptables knobs, plus ``mode``)."""

    mode: str = setting(
        "sidecar",
        env="MESHCTL_CAPTURE_MODE",
        flag="--mode",
        parse=parse_mode,
        hint="use --mode sidecar (a proxy in the pod) or --mode ambient (a node proxy)",
    )
    proxy_port: int = setting(
        PROXY_PORT, env="ENVOY_PORT", flag="-p/--envoy-port", parse=parse_port, hint=_PORT_HINT
    )
    inbound_capture_port: int = setting(
        INBOUND_CAPTURE_PORT,
        env="INBOUND_CAPTURE_PORT",
        flag="-z/--inbound-capture-port",
        parse=parse_port,
        hint=_PORT_HINT,
    )
    inbound_tunnel_port: int = setting(
        TUNNEL_PORT,
        env="INBOUND_TUNNEL_PORT",
        flag="-e/--inbound-tunnel-port",
        parse=parse_port,
        hint=_PORT_HINT,
    )
    proxy_uid: tuple[int, ...] = setting(
        (PROXY_UID,), env="PROXY_UID", flag="-u/--proxy-uid", parse=parse_ids, hint=_IDS_HINT
    )
    # None: the same ids as proxy_uid (Istio's default).
    proxy_gid: tuple[int, ...] | None = setting(
        None, env="PROXY_GID", flag="-g/--proxy-gid", parse=parse_ids, hint=_IDS_HINT
    )
    interception_mode: str = setting(
        "REDIRECT",
        env="ISTIO_INBOUND_INTERCEPTION_MODE",
        flag="-m/--istio-inbound-interception-mode",
        parse=parse_interception,
        hint="use REDIRECT (default) or TPROXY",
    )
    inbound_ports: Wildcard | tuple[int, ...] = setting(  # noqa: RUF009 (setting() is a field())
        ALL,
        env="ISTIO_INBOUND_PORTS",
        flag="-b/--istio-inbound-ports",
        parse=parse_port_selection,
        hint="give '*' for all ports, or comma separated ports",
    )
    inbound_ports_exclude: tuple[int, ...] = setting(
        INJECTED_INBOUND_EXCLUDES,
        env="ISTIO_LOCAL_EXCLUDE_PORTS",
        flag="-d/--istio-local-exclude-ports",
        parse=parse_ports,
        hint=_PORTS_HINT,
    )
    outbound_cidrs: Wildcard | tuple[Network, ...] = setting(  # noqa: RUF009 (setting() is a field())
        ALL,
        env="ISTIO_SERVICE_CIDR",
        flag="-i/--istio-service-cidr",
        parse=parse_cidr_selection,
        hint=_CIDRS_HINT,
    )
    outbound_cidrs_exclude: tuple[Network, ...] = setting(
        (),
        env="ISTIO_SERVICE_EXCLUDE_CIDR",
        flag="-x/--istio-service-exclude-cidr",
        parse=parse_cidrs,
        hint=_CIDRS_HINT,
    )
    outbound_ports: tuple[int, ...] = setting(
        (),
        env="ISTIO_OUTBOUND_PORTS",
        flag="-q/--istio-outbound-ports",
        parse=parse_ports,
        hint=_PORTS_HINT,
    )
    outbound_ports_exclude: tuple[int, ...] = setting(
        (),
        env="ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE",
        flag="-o/--istio-local-outbound-ports-exclude",
        parse=parse_ports,
        hint=_PORTS_HINT,
    )
    exclude_interfaces: tuple[str, ...] = setting(
        (),
        env="ISTIO_EXCLUDE_INTERFACES",
        flag="-c/--istio-exclude-interfaces",
        parse=parse_interfaces,
        hint="give comma separated interface names, e.g. eth1",
    )
    kube_virt_interfaces: tuple[str, ...] = setting(
        (),
        env="KUBE_VIRT_INTERFACES",
        flag="-k/--kube-virt-interfaces",
        parse=parse_interfaces,
        hint="give comma separated interface names, e.g. k6t-eth0",
    )
    tproxy_mark: int = setting(
        TPROXY_MARK,
        env="ISTIO_INBOUND_TPROXY_MARK",
        flag="-t/--istio-inbound-tproxy-mark",
        parse=parse_mark,
        hint="give a mark 1-0xffffffff, e.g. 1337",
    )
    tproxy_route_table: int = setting(
        TPROXY_ROUTE_TABLE,
        env="ISTIO_INBOUND_TPROXY_ROUTE_TABLE",
        flag="-r/--istio-inbound-tproxy-route-table",
        parse=parse_route_table,
        hint="give a routing table number, e.g. 133",
    )
    redirect_dns: bool = setting(
        False,
        env=("REDIRECT_DNS", "ISTIO_META_DNS_CAPTURE"),
        flag="--redirect-dns",
        parse=parse_bool,
        hint="use true or false",
    )
    capture_all_dns: bool = setting(
        False,
        env="CAPTURE_ALL_DNS",
        flag="--capture-all-dns",
        parse=parse_bool,
        hint="use true or false",
    )
    # Resolvers whose port 53 is captured (without --capture-all-dns); the CLI fills this from
    # /etc/resolv.conf when it is not given, as istio-iptables does.
    dns_servers: tuple[Address, ...] = setting(
        (),
        env="MESHCTL_DNS_SERVERS",
        flag="--dns-servers",
        parse=parse_addresses,
        hint="give comma separated IP addresses, e.g. 10.96.0.10",
    )
    dual_stack: bool = setting(
        False,
        env=("DUAL_STACK", "ISTIO_DUAL_STACK", "ENABLE_INBOUND_IPV6"),
        flag="--dual-stack",
        parse=parse_bool,
        hint="use true or false",
    )
    drop_invalid: bool = setting(
        False,
        env=("DROP_INVALID", "INVALID_DROP"),
        flag="--drop-invalid",
        parse=parse_bool,
        hint="use true or false",
    )
    outbound_ipv4_loopback_cidr: ipaddress.IPv4Network = setting(  # noqa: RUF009 (setting() is a field())
        ipaddress.IPv4Network("127.0.0.1/32"),
        env="ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR",
        flag="--outbound-ipv4-loopback-cidr",
        parse=parse_ipv4_cidr,
        hint="give one IPv4 CIDR, e.g. 127.0.0.1/32",
    )
    outbound_owner_groups: Wildcard | tuple[str, ...] = setting(  # noqa: RUF009 (setting() is a field())
        ALL,
        env="ISTIO_OUTBOUND_OWNER_GROUPS",
        flag="--outbound-owner-groups",
        parse=parse_group_selection,
        hint="give '*' or comma separated group names or gids",
    )
    outbound_owner_groups_exclude: tuple[str, ...] = setting(
        (),
        env="ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE",
        flag="--outbound-owner-groups-exclude",
        parse=parse_groups,
        hint="give comma separated group names or gids",
    )
    probe_snat_ipv4: Address = setting(  # noqa: RUF009 (setting() is a field())
        ipaddress.IPv4Address(PROBE_SNAT_IPV4),
        env="HOST_PROBE_SNAT_IP",
        flag="--probe-snat-ip",
        parse=parse_address,
        hint="give an IPv4 address",
    )
    probe_snat_ipv6: Address = setting(  # noqa: RUF009 (setting() is a field())
        ipaddress.IPv6Address(PROBE_SNAT_IPV6),
        env="HOST_PROBE_SNAT_IPV6",
        flag="--probe-snat-ipv6",
        parse=parse_address,
        hint="give an IPv6 address",
    )

    def __post_init__(self) -> None:
        _check_combinations(self)

    @property
    def gids(self) -> tuple[int, ...]:
        return self.proxy_uid if self.proxy_gid is None else self.proxy_gid

    @property
    def tproxy(self) -> bool:
        return self.mode == "sidecar" and self.interception_mode == "TPROXY"

    @property
    def dns_enabled(self) -> bool:
        """DNS capture is on and has something to capture (istio-iptables disables it, with a
        warning, when neither capture-all nor any resolver is known)."""
        return self.redirect_dns and (self.capture_all_dns or bool(self.dns_servers))

    def describe(self) -> str:
        """A one-line summary for messages: ``sidecar REDIRECT, IPv4``."""
        kind = "ambient" if self.mode == "ambient" else f"sidecar {self.interception_mode}"
        extras = [
            *(["DNS"] if self.dns_enabled else []),
            "IPv4+IPv6" if self.dual_stack else "IPv4",
        ]
        return f"{kind}, {', '.join(extras)}"


def source_name(name: str) -> str:
    """``proxy_port`` -> ``-p/--envoy-port / ENVOY_PORT`` for cross-field error messages."""
    meta = next(f.metadata for f in fields(CaptureSettings) if f.name == name)
    env = meta["env"]
    envs = (env,) if isinstance(env, str) else tuple(env or ())
    return " / ".join([meta["flag"], *envs])


def _check_combinations(s: CaptureSettings) -> None:
    ports = {"proxy_port": s.proxy_port, "inbound_capture_port": s.inbound_capture_port}
    ports["inbound_tunnel_port"] = s.inbound_tunnel_port
    seen: dict[int, str] = {}
    for name, port in ports.items():
        if port in seen:
            raise ConfigError(
                f"{source_name(name)} and {source_name(seen[port])} are both {port}",
                hint="the outbound, inbound and tunnel ports must differ (15001, 15006, 15008)",
            )
        seen[port] = name
    if s.mode == "ambient" and s.interception_mode == "TPROXY":
        raise ConfigError(
            f"{source_name('interception_mode')}: TPROXY applies to --mode sidecar only",
            hint="ambient in-pod capture has one fixed redirect scheme; drop the TPROXY setting",
        )
    if s.outbound_owner_groups != ALL and s.outbound_owner_groups_exclude:
        raise ConfigError(
            f"{source_name('outbound_owner_groups')} and "
            f"{source_name('outbound_owner_groups_exclude')} are both set",
            hint="give either the groups to capture or the groups to exempt, not both",
        )


def nameservers(resolv_conf: str) -> tuple[Address, ...]:
    """The ``nameserver`` addresses of a resolv.conf text, in order (bad lines skipped, as the C
    resolver does)."""
    out: list[Address] = []
    for line in resolv_conf.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                out.append(ipaddress.ip_address(parts[1].split("%")[0]))
            except ValueError:
                continue
    return tuple(dict.fromkeys(out))


def of_family(items: Iterable[Any], version: int) -> list[Any]:
    """Addresses or networks of one IP version (4 or 6), order kept."""
    return [i for i in items if i.version == version]


def settings_from_args(args: Sequence[str]) -> CaptureSettings:
    """``CaptureSettings`` from ``meshctl iptables apply`` flags, parsed as that command does.

    The flag spellings are the fields' own (``-p``, ``--envoy-port``, ...) and the values go
    through the same ``meshctl.config.resolve`` and field parsers, with no env var and no settings
    file: the CNI plugin turns ``capture_args(annotations)`` into exactly the settings the init
    container's ``meshctl iptables apply <args>`` would build. Raises ``ConfigError``.
    """
    spellings = {
        spelling: f for f in fields(CaptureSettings) for spelling in f.metadata["flag"].split("/")
    }
    flags: dict[str, str | bool] = {}
    words = iter(args)
    for word in words:
        name, eq, inline = word.partition("=") if word.startswith("--") else (word, "", "")
        f = spellings.get(name)
        if f is None:
            raise ConfigError(
                f"unknown capture flag {word!r}", hint="see 'meshctl iptables apply --help'"
            )
        if f.type == "bool" and not eq:
            flags[f.name] = True  # a switch: its presence means on, as with the CLI
            continue
        value = inline if eq else next(words, None)
        if value is None:
            raise ConfigError(f"capture flag {name} needs a value", hint="e.g. -p 15001")
        flags[f.name] = value
    return resolve(CaptureSettings, flags=flags, env={})
