"""The ``meshctl iptables`` commands: render, apply, check, clean, trace, validate.

Invariants:
- Every command takes the same capture flags (Istio's names and short flags) and env vars;
  settings resolve flag > env > the ``iptables:`` section of the settings file > default, once,
  before anything touches a kernel, so bad input exits 2 with nothing applied.
- Data (rule text, diffs, traces) goes to stdout; what happened goes to stderr.
- This module only wires: rules come from ``meshctl.core.capture``, the kernel from ``meshctl.net``.
"""

from __future__ import annotations

import functools
import inspect
import ipaddress
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Annotated, Any

import typer

from meshctl import config, options, values
from meshctl.config import setting
from meshctl.core.capture import render as rendering
from meshctl.core.capture.plan import CapturePlan, plan
from meshctl.core.capture.rules import Family
from meshctl.core.capture.settings import PROBE_PORT, CaptureSettings
from meshctl.core.capture.trace import Connection, format_trace, trace
from meshctl.errors import CheckFailedError, MeshctlError, UserError
from meshctl.output import FORMATS, OutputFormat, render

log = logging.getLogger(__name__)

EXIT_VALIDATION_FAILED = 126  # Istio's validation container code; the CNI repair loop keys on it

app = options.command_app(
    help="Traffic capture rules (Istio's istio-iptables, with MESH_ chains).",
    no_args_is_help=True,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelTarget:
    """Where apply/check/clean act: which namespace, through which iptables backend."""

    netns: str | None = setting(None, env="NETWORK_NAMESPACE", flag="--netns")
    backend: str = setting(
        "auto",
        env="MESHCTL_IPTABLES_BACKEND",
        flag="--backend",
        choices=("auto", "nft", "legacy", "iptc"),
    )


# Why `-o` is not the output format here: istio-iptables' flags keep their spelling on every
# iptables command, so Istio's injected arguments run unchanged, and `-o` is one of them.
WHY_NOT_O = "-o is istio-iptables' flag for excluded outbound ports here"


def _capture(field: str, metavar: str | None, help: str) -> Any:  # noqa: A002 (click's name)
    """An option of every command that sets ``CaptureSettings.<field>``: Istio's flag names and
    env vars come from the field. The value stays raw here: ``config.resolve`` parses it with
    the field's parser, so a bad value names its flag or env var and the allowed range."""
    kind = bool | None if metavar is None else str | None
    option = options.from_setting(CaptureSettings, field, help=help, metavar=metavar, raw=True)
    return Annotated[kind, option]


# (parameter, annotation): each becomes an option of every command.
_CAPTURE_OPTIONS: list[tuple[str, Any]] = [
    ("mode", _capture("mode", "sidecar|ambient", "Capture for a sidecar (default) or ambient.")),
    ("proxy_port", _capture("proxy_port", "PORT", "Outbound capture port (15001).")),
    ("inbound_capture_port", _capture("inbound_capture_port", "PORT", "Inbound capture (15006).")),
    (
        "inbound_tunnel_port",
        _capture("inbound_tunnel_port", "PORT", "HBONE, never captured (15008)."),
    ),
    ("proxy_uid", _capture("proxy_uid", "UIDS", "Proxy uid(s), exempt (1337).")),
    ("proxy_gid", _capture("proxy_gid", "GIDS", "Proxy gid(s), exempt (the uids).")),
    (
        "interception_mode",
        _capture("interception_mode", "REDIRECT|TPROXY", "Inbound interception (REDIRECT)."),
    ),
    (
        "inbound_ports",
        _capture("inbound_ports", "PORTS", "Inbound ports: '*' (default), a list, or ''."),
    ),
    (
        "inbound_ports_exclude",
        _capture(
            "inbound_ports_exclude",
            "PORTS",
            "Inbound ports not captured with -b '*' (15090,15021,15020).",
        ),
    ),
    (
        "outbound_cidrs",
        _capture("outbound_cidrs", "CIDRS", "Outbound CIDRs: '*' (default), a list, or ''."),
    ),
    (
        "outbound_cidrs_exclude",
        _capture("outbound_cidrs_exclude", "CIDRS", "Outbound CIDRs not captured."),
    ),
    ("outbound_ports", _capture("outbound_ports", "PORTS", "Outbound ports always captured.")),
    (
        "outbound_ports_exclude",
        _capture("outbound_ports_exclude", "PORTS", "Outbound ports never captured (tcp+udp)."),
    ),
    ("exclude_interfaces", _capture("exclude_interfaces", "IFACES", "Interfaces never captured.")),
    (
        "kube_virt_interfaces",
        _capture("kube_virt_interfaces", "IFACES", "Interfaces whose inbound is outbound."),
    ),
    ("tproxy_mark", _capture("tproxy_mark", "MARK", "TPROXY mark (1337).")),
    ("tproxy_route_table", _capture("tproxy_route_table", "TABLE", "TPROXY routing table (133).")),
    ("redirect_dns", _capture("redirect_dns", None, "DNS to the proxy's 15053.")),
    (
        "capture_all_dns",
        _capture("capture_all_dns", None, "All port-53 traffic, not just resolv.conf's."),
    ),
    (
        "dns_servers",
        _capture("dns_servers", "IPS", "Resolvers to capture (default: /etc/resolv.conf)."),
    ),
    ("dual_stack", _capture("dual_stack", None, "IPv6 rules too.")),
    ("drop_invalid", _capture("drop_invalid", None, "Drop conntrack-INVALID packets.")),
    (
        "outbound_ipv4_loopback_cidr",
        _capture("outbound_ipv4_loopback_cidr", "CIDR", "Loopback never captured (127.0.0.1/32)."),
    ),
    (
        "outbound_owner_groups",
        _capture("outbound_owner_groups", "GROUPS", "Only these groups are captured ('*')."),
    ),
    (
        "outbound_owner_groups_exclude",
        _capture("outbound_owner_groups_exclude", "GROUPS", "Groups not captured."),
    ),
    (
        "probe_snat_ipv4",
        _capture("probe_snat_ipv4", "IP", "Ambient: kubelet probe source (169.254.7.127)."),
    ),
    ("probe_snat_ipv6", _capture("probe_snat_ipv6", "IP", "Ambient: IPv6 kubelet probe source.")),
]
NetnsOption = Annotated[
    str | None,
    options.from_setting(
        KernelTarget,
        "netns",
        "--netns",
        "--network-namespace",
        metavar="NAME|PATH",
        help="Network namespace to act in (default: this one).",
        raw=True,
    ),
]
_TARGET_OPTIONS: list[tuple[str, Any]] = [
    ("netns", NetnsOption),
    (
        "backend",
        Annotated[
            str | None,
            options.from_setting(
                KernelTarget, "backend", help="iptables backend (auto).", raw=True
            ),
        ],
    ),
]


def _with_options(
    extra: list[tuple[str, Any]], into: str
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Add ``extra`` options to a command; their raw values arrive as one mapping ``into``."""

    def decorate(func: Callable[..., None]) -> Callable[..., None]:
        sig = inspect.signature(func, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != into]
        added = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ann)
            for name, ann in extra
        ]
        names = [name for name, _ in extra]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            values = {name: kwargs.pop(name) for name in names}
            func(*args, **{into: values}, **kwargs)

        params = [*own, *added]
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        return wrapper

    return decorate


def capture_options(func: Callable[..., None]) -> Callable[..., None]:
    return _with_options(_CAPTURE_OPTIONS, "capture")(func)


def target_options(func: Callable[..., None]) -> Callable[..., None]:
    return _with_options(_TARGET_OPTIONS, "target")(func)


def _file_section(ctx: typer.Context) -> tuple[Mapping[str, object], str]:
    data, file_name = ctx.meta.get("meshctl.settings_file", ({}, "settings file"))
    return config.section(data, "iptables", file_name), file_name


def _settings(ctx: typer.Context, flags: Mapping[str, object]) -> CaptureSettings:
    if flags.get("outbound_ports_exclude") in FORMATS:  # `-o json`, as on other commands
        raise UserError(
            f"-o {flags['outbound_ports_exclude']}: -o takes ports here, it is istio-iptables' "
            "--istio-local-outbound-ports-exclude",
            hint=f"for the output format use --output {flags['outbound_ports_exclude']}",
        )
    section, file_name = _file_section(ctx)
    target_keys = {"netns", "backend", "network-namespace"}
    file = {k: v for k, v in section.items() if k not in target_keys}
    settings = config.resolve(CaptureSettings, flags=flags, file=file, file_name=file_name)
    if settings.redirect_dns and not settings.capture_all_dns and not settings.dns_servers:
        from meshctl.net.resolv import RESOLV_CONF, system_nameservers

        settings = replace(settings, dns_servers=system_nameservers())
        if not settings.dns_servers:
            log.warning(
                "DNS capture is on but %s lists no nameserver and --capture-all-dns is off: "
                "DNS is not captured",
                RESOLV_CONF,
            )
    return settings


def _target(ctx: typer.Context, flags: Mapping[str, object]) -> tuple[KernelTarget, Any]:
    from meshctl.net import netns

    section, file_name = _file_section(ctx)
    file = {k: v for k, v in section.items() if k in ("netns", "backend")}
    target = config.resolve(KernelTarget, flags=flags, file=file, file_name=file_name)
    return target, netns.resolve(target.netns)


def _where(target: KernelTarget) -> str:
    return f"netns {target.netns}" if target.netns else "the current netns"


def _family_header(family: Family, what: str) -> str:
    return f"# {family.label}: {rendering.command_prefix(family)}-restore --noflush ({what})\n"


@app.command("render")
@capture_options
def render_cmd(
    ctx: typer.Context,
    capture: Mapping[str, object],
    family: Annotated[
        str,
        options.choice(
            "--family", choices=("ipv4", "ipv6", "all"), help="Which rules (all: every enabled)."
        ),
    ] = "all",
    cleanup: Annotated[
        bool, typer.Option("--cleanup", help="Print the derived cleanup set instead.")
    ] = False,
    output_file: options.OutputFileOption = None,
) -> None:
    """Print the iptables-restore input for these settings (no kernel involved)."""
    built = plan(_settings(ctx, capture))
    families = _families(built, family)
    text = ""
    for fam in families:
        ruleset = built.ruleset(fam)
        body = rendering.cleanup(ruleset) if cleanup else rendering.render(ruleset)
        if len(families) > 1 or family != "all":
            text += _family_header(fam, "cleanup" if cleanup else "apply")
        text += body
    if not cleanup and not built.routing.is_empty():
        text += "# policy routing (meshctl applies it with netlink):\n"
        text += "".join(f"#   {line}\n" for line in built.routing.lines())
    options.write_output(text, output_file)


def _families(built: CapturePlan, choice: str) -> tuple[Family, ...]:
    if choice == "all":
        return built.families
    try:
        wanted = Family(choice)
    except ValueError:
        raise UserError(
            f"--family: invalid value {choice!r}", hint="use ipv4, ipv6 or all"
        ) from None
    if wanted not in built.families:
        raise UserError(
            f"--family {choice}: IPv6 rules are off", hint="add --dual-stack to render IPv6 rules"
        )
    return (wanted,)


@app.command("apply")
@capture_options
@target_options
def apply_cmd(
    ctx: typer.Context,
    capture: Mapping[str, object],
    target: Mapping[str, object],
    dry_run: options.DryRunOption = False,
) -> None:
    """Install the capture rules (twice changes nothing; a changed config reconciles)."""
    from meshctl.net import capture as kernel

    settings = _settings(ctx, capture)
    where, ref = _target(ctx, target)
    outcome = kernel.apply(plan(settings), target=ref, backend=where.backend, dry_run=dry_run)
    if dry_run:
        for family, text in outcome.changes.items():
            if text:
                typer.echo(_family_header(family, "would be applied"), nl=False)
                typer.echo(text, nl=False)
        for line in outcome.routing:
            typer.echo(f"# routing: {line}")
        _say(f"dry run: nothing changed in {_where(where)} (backend {outcome.backend})")
        return
    if not outcome.changed:
        _say(f"already applied in {_where(where)}: nothing changed (backend {outcome.backend})")
        return
    changed = [f.label for f, text in outcome.changes.items() if text]
    parts = [f"{', '.join(changed)} rules"] if changed else []
    parts += [f"{len(outcome.routing)} routing change(s)"] if outcome.routing else []
    _say(
        f"applied {settings.describe()} in {_where(where)} with backend {outcome.backend}: "
        f"{' and '.join(parts)}"
    )


@app.command("check")
@capture_options
@target_options
def check_cmd(
    ctx: typer.Context, capture: Mapping[str, object], target: Mapping[str, object]
) -> None:
    """Compare the installed rules with the desired ones; exit 3 and print a diff on drift."""
    from meshctl.net import capture as kernel

    settings = _settings(ctx, capture)
    where, ref = _target(ctx, target)
    drift = kernel.check(plan(settings), target=ref, backend=where.backend)
    if drift.in_sync:
        _say(f"in sync: {settings.describe()} in {_where(where)} (backend {drift.backend})")
        return
    for text in drift.diffs.values():
        typer.echo(text, nl=False)
    if drift.routing:
        typer.echo("--- installed (policy routing)\n+++ desired (policy routing)")
        for line in drift.routing:
            typer.echo(line)
    raise CheckFailedError(
        f"installed capture rules differ from the desired ones in {_where(where)} "
        f"(backend {drift.backend}); the diff is on stdout",
        hint="run 'meshctl iptables apply' with the same settings to reconcile",
    )


@app.command("clean")
@target_options
def clean_cmd(
    ctx: typer.Context,
    target: Mapping[str, object],
    dry_run: options.DryRunOption = False,
) -> None:
    """Remove every MESH_ chain and jump (and meshctl's policy routing), nothing else."""
    from meshctl.net import capture as kernel

    where, ref = _target(ctx, target)
    outcomes = kernel.clean(target=ref, backend=where.backend, dry_run=dry_run)
    removed = []
    for outcome in outcomes:
        for family, text in outcome.changes.items():
            if text:
                removed.append(f"{outcome.backend} {family.label}")
                if dry_run:
                    typer.echo(_family_header(family, f"{outcome.backend}, would be run"), nl=False)
                    typer.echo(text, nl=False)
        if outcome.routing:
            removed.append("policy routing")
            if dry_run:
                for line in outcome.routing:
                    typer.echo(f"# routing: {line}")
    verb = "would remove" if dry_run else "removed"
    if removed:
        _say(f"{verb} meshctl capture in {_where(where)}: {', '.join(removed)}")
    else:
        _say(f"nothing to clean in {_where(where)}")


@app.command("trace")
@capture_options
def trace_cmd(
    ctx: typer.Context,
    capture: Mapping[str, object],
    dst: Annotated[
        str,
        options.option("--dst", parse=values.ENDPOINT, help="Destination ([v6]:port for IPv6)."),
    ],
    src: Annotated[
        str | None, options.address("--src", help="Source IP (default: assumed).")
    ] = None,
    sport: Annotated[int, options.port("--sport", help="Source port.")] = 40000,
    uid: Annotated[
        int | None,
        options.option("--uid", parse=values.NUMERIC_ID, help="Owner uid (out; default 1000)."),
    ] = None,
    gid: Annotated[
        int | None,
        options.option("--gid", parse=values.NUMERIC_ID, help="Owner gid (default: the uid)."),
    ] = None,
    direction: Annotated[
        str,
        options.choice(
            "--direction", choices=("out", "in"), help="out (from the pod) or in (to the pod)."
        ),
    ] = "out",
    protocol: Annotated[
        str, options.choice("--protocol", choices=("tcp", "udp"), help="The protocol.")
    ] = "tcp",
    iface: Annotated[
        str | None,
        typer.Option(
            "--iface",
            metavar="IFACE",
            help="in: arriving interface (eth0); out: leaving one (auto).",
        ),
    ] = None,
    mark: Annotated[
        str, typer.Option("--mark", metavar="MARK", help="Packet mark, e.g. 0x539.")
    ] = "0",
    output: Annotated[OutputFormat, options.output(short=False, why_not_o=WHY_NOT_O)] = (
        OutputFormat.TABLE
    ),
    output_file: options.OutputFileOption = None,
) -> None:
    """Evaluate the rules for one connection (no kernel) and show every rule it meets."""
    settings = _settings(ctx, capture)
    conn = _connection(dst, src, sport, uid, gid, direction, protocol, iface, mark)
    family = Family.IPV4 if conn.dst.version == 4 else Family.IPV6
    built = plan(settings)
    if family not in built.families:
        raise UserError(
            f"--dst {dst}: IPv6 rules are off, so nothing would capture it",
            hint="add --dual-stack to trace IPv6 connections",
        )
    result = trace(built.ruleset(family), conn)
    verdict = f"{result.verdict}/{result.port}" if result.port else result.verdict
    text = format_trace(result, title=settings.describe())
    options.write_output(render(result.to_dict(), output, table=text, names=[verdict]), output_file)


def _connection(
    dst: str,
    src: str | None,
    sport: int,
    uid: int | None,
    gid: int | None,
    direction: str,
    protocol: str,
    iface: str | None,
    mark: str,
) -> Connection:
    address, port = _endpoint(dst)  # --direction, --protocol, --sport, --src: parsed already
    source = ipaddress.ip_address(src) if src else _assumed_source(address, direction)
    bad_mark = UserError(
        f"--mark: invalid value {mark!r}", hint="give a mark 0-0xffffffff, e.g. --mark 0x539"
    )
    try:
        mark_value = int(mark, 0)
    except ValueError:
        raise bad_mark from None
    if not 0 <= mark_value <= 0xFFFFFFFF:
        raise bad_mark
    if source.version != address.version:
        raise UserError(f"--src {src}: not the same IP version as --dst {dst}")
    if direction == "out":
        owner = 1000 if uid is None else uid
        out_iface = iface or ("lo" if address.is_loopback else "eth0")
        return Connection(
            "out", protocol, source, sport, address, port, uid=owner,
            gid=owner if gid is None else gid, out_interface=out_iface, mark=mark_value,
        )  # fmt: skip
    return Connection(
        "in", protocol, source, sport, address, port, in_interface=iface or "eth0", mark=mark_value
    )


def _endpoint(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    host, sep, port = text.rpartition(":")
    bad = UserError(
        f"--dst: invalid value {text!r}", hint="give IP:PORT, e.g. 10.96.0.10:80 or [fd00::1]:80"
    )
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise bad
    try:
        return ipaddress.ip_address(host.strip("[]")), int(port)
    except ValueError:
        raise bad from None


def _assumed_source(
    dst: ipaddress.IPv4Address | ipaddress.IPv6Address, direction: str
) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """A documentation address (RFC 5737 / RFC 3849) standing in for the unknown side."""
    if dst.is_loopback:
        return dst
    if dst.version == 4:
        return ipaddress.ip_address("192.0.2.10" if direction == "out" else "192.0.2.20")
    return ipaddress.ip_address("2001:db8::10" if direction == "out" else "2001:db8::20")


@app.command("validate")
@capture_options
def validate_cmd(
    ctx: typer.Context,
    capture: Mapping[str, object],
    netns: NetnsOption = None,
    probe_port: Annotated[
        int, options.port("--iptables-probe-port", help="Port the probe connects to.")
    ] = PROBE_PORT,
    probe_timeout: Annotated[
        float,
        options.duration(
            "--probe-timeout", positive=True, help="How long to wait for the redirect."
        ),
    ] = 5.0,
) -> None:
    """Prove capture works in this pod: a probe must be redirected (exit 126 if not)."""
    from meshctl.net import netns as netns_mod
    from meshctl.net.validation import validate

    settings = _settings(ctx, capture)
    if settings.mode != "sidecar":
        raise UserError(
            "validate checks sidecar capture; ambient capture is verified by the node proxy",
            hint="drop --mode ambient",
        )
    _, ref = _target(ctx, {"netns": netns, "backend": None})
    with netns_mod.entered(ref):
        result = validate(
            capture_ports=(settings.proxy_port, settings.inbound_capture_port),
            probe_port=probe_port,
            uid=settings.proxy_uid[0],
            gid=settings.gids[0],
            timeout=probe_timeout,
        )
    if not result.ok:
        raise MeshctlError(
            f"validation failed: {result.message}",
            hint=result.hint or None,
            exit_code=EXIT_VALIDATION_FAILED,
        )
    _say(f"validation passed: {result.message}")


def _say(message: str) -> None:
    typer.echo(message, err=True)
