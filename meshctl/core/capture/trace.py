"""Pure evaluation of one connection's first packet through a rule set, and its readable report.

Invariants:
- No kernel: the packet walks the model the way netfilter walks the kernel's tables: raw, then
  mangle, then nat of the hook (OUTPUT for a locally generated connection, PREROUTING for one
  arriving on an interface); jumps push, RETURN pops, a built-in chain that ends accepts.
- Every rule visited is reported, matched or not, with the first condition that failed; the
  verdict says where the connection goes and why (the note of the deciding rule).
- Only what meshctl's rule sets use is modelled; any other match or target raises
  ``TraceError`` rather than guessing.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypedDict

from meshctl.core.capture.render import rule_text
from meshctl.core.capture.rules import Criterion, Match, Option, Rule, RuleSet, Table
from meshctl.errors import MeshctlError

Direction = Literal["out", "in"]
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

HOOKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "out": ("OUTPUT", ("raw", "mangle", "nat")),
    "in": ("PREROUTING", ("raw", "mangle", "nat")),
}
_RULE_WIDTH = 64
_MAX_STEPS = 10_000  # a jump loop cannot exist in a kernel; a hand-made model could have one


class TraceError(MeshctlError):
    """The rule set uses something the evaluator does not model."""


@dataclass(frozen=True, slots=True)
class Connection:
    """The first packet of a connection, as netfilter sees it at the hook."""

    direction: Direction
    protocol: str
    src: Address
    src_port: int
    dst: Address
    dst_port: int
    uid: int | None = None
    gid: int | None = None
    in_interface: str | None = None
    out_interface: str | None = None
    mark: int = 0
    connmark: int = 0
    ctstate: str = "NEW"

    def summary(self) -> str:
        def ep(addr: Address, port: int) -> str:
            return f"[{addr}]:{port}" if addr.version == 6 else f"{addr}:{port}"

        if self.direction == "out":
            where = f"locally generated, out via {self.out_interface}"
            who = f", uid {self.uid} gid {self.gid}" if self.uid is not None else ""
        else:
            where, who = f"arriving on {self.in_interface}", ""
        marks = f", mark {hex(self.mark)}" if self.mark else ""
        return (
            f"{self.protocol} {ep(self.src, self.src_port)} -> {ep(self.dst, self.dst_port)} "
            f"({where}{who}{marks})"
        )


@dataclass(frozen=True, slots=True)
class Step:
    table: str
    chain: str
    index: int  # 1-based, as ``iptables -L --line-numbers``
    rule: Rule
    matched: bool
    detail: str  # the failing condition, or what the matched rule did


class StepFacts(TypedDict):
    table: str
    chain: str
    index: int
    rule: str  # as iptables-save writes it
    matched: bool
    detail: str


class TraceFacts(TypedDict):
    """A trace as ``meshctl iptables trace -o json|yaml`` prints it."""

    connection: str
    steps: list[StepFacts]
    verdict: str
    port: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class Trace:
    connection: Connection
    steps: tuple[Step, ...]
    verdict: str  # "redirected", "tproxy", "not captured", "dropped"
    port: int | None  # where a capture sends it
    reason: str
    final: Connection = field(compare=False)

    def to_dict(self) -> TraceFacts:
        return {
            "connection": self.connection.summary(),
            "steps": [
                {
                    "table": s.table,
                    "chain": s.chain,
                    "index": s.index,
                    "rule": rule_text(s.rule),
                    "matched": s.matched,
                    "detail": s.detail,
                }
                for s in self.steps
            ],
            "verdict": self.verdict,
            "port": self.port,
            "reason": self.reason,
        }


@dataclass(slots=True)
class _State:
    conn: Connection
    verdict: str = "not captured"
    port: int | None = None
    reason: str = "no meshctl rule applies to it"
    steps: list[Step] = field(default_factory=list)
    done: bool = False


def trace(ruleset: RuleSet, conn: Connection) -> Trace:
    """Walk ``conn`` through ``ruleset`` and report every rule it meets and where it ends up."""
    hook, tables = HOOKS[conn.direction]
    state = _State(conn)
    for name in tables:
        table = ruleset.table(name)
        if table is None or table.chain(hook) is None or state.done:
            continue
        _walk(table, hook, state)
    return Trace(conn, tuple(state.steps), state.verdict, state.port, state.reason, state.conn)


def _walk(table: Table, hook: str, state: _State) -> None:
    stack: list[tuple[str, int]] = []
    chain_name, index = hook, 0
    for _ in range(_MAX_STEPS):
        chain = table.chain(chain_name)
        rules = chain.rules if chain is not None else ()
        if index >= len(rules):
            if not stack:
                return  # end of the built-in chain: its policy (ACCEPT) applies
            chain_name, index = stack.pop()
            continue
        rule = rules[index]
        failed = _first_failure(rule, state.conn)
        target = rule.target
        if failed is not None or target is None:
            state.steps.append(
                Step(table.name, chain_name, index + 1, rule, False, failed or "no target")
            )
            index += 1
            continue
        detail, outcome = _target(table, target, rule, state)
        state.steps.append(Step(table.name, chain_name, index + 1, rule, True, detail))
        if outcome == "jump":
            if not target.goto:
                stack.append((chain_name, index + 1))
            chain_name, index = target.name, 0
        elif outcome == "return":
            if not stack:
                return
            chain_name, index = stack.pop()
        elif outcome == "stop-table":
            return
        elif outcome == "stop":
            state.done = True
            return
        else:
            index += 1
    raise TraceError(f"more than {_MAX_STEPS} rule visits in table {table.name}: a jump loop")


def _target(  # noqa: PLR0911 (one return per target kind)
    table: Table, target: Any, rule: Rule, state: _State
) -> tuple[str, str]:
    """Apply a matched rule's target; return (detail, what happens next)."""
    name = target.name
    conn = state.conn
    if table.chain(name) is not None:
        return f"-> {name}", "jump"
    if name == "RETURN":
        if rule.note:
            state.reason = rule.note
        return _with_note("return", rule), "return"
    if name == "ACCEPT":
        if rule.note:
            state.reason = rule.note
        return _with_note("accept, leaves the table", rule), "stop-table"
    if name == "DROP":
        state.verdict, state.reason, state.port = "dropped", rule.note or "dropped", None
        return "drop", "stop"
    if name == "REDIRECT":
        port = int(_opt(target, "to-ports").split("-")[0].split(":")[0])
        local: Address = (
            ipaddress.ip_address("127.0.0.1" if conn.dst.version == 4 else "::1")
            if conn.direction == "out"
            else conn.dst
        )
        state.conn = replace(conn, dst=local, dst_port=port)
        state.verdict, state.port = "redirected", port
        state.reason = rule.note or f"REDIRECT to {port}"
        return f"redirect to port {port}", "stop"
    if name == "TPROXY":
        port = int(_opt(target, "on-port"))
        value, mask = _mark(_opt(target, "tproxy-mark"))
        state.conn = replace(conn, mark=(conn.mark & ~mask) ^ value)
        state.verdict, state.port = "tproxy", port
        state.reason = rule.note or f"TPROXY to {port}"
        return f"tproxy to port {port}, mark {hex(value)}", "stop-table"
    if name == "MARK":
        value, mask = _mark(_opt(target, "set-xmark"))
        state.conn = replace(conn, mark=(conn.mark & ~mask) ^ value)
        return f"mark now {hex(state.conn.mark)}", "next"
    if name == "CONNMARK":
        return _connmark(target, state), "next"
    if name == "CT":
        return f"conntrack zone {_opt(target, 'zone')}", "next"
    raise TraceError(f"trace does not model target {name}")


def _with_note(action: str, rule: Rule) -> str:
    return f"{action}: {rule.note}" if rule.note else action


def _connmark(target: Any, state: _State) -> str:
    conn = state.conn
    nfmask = int(target.option("nfmask").arg(), 0) if target.option("nfmask") else 0xFFFFFFFF
    ctmask = int(target.option("ctmask").arg(), 0) if target.option("ctmask") else 0xFFFFFFFF
    if target.option("set-xmark") is not None:
        value, mask = _mark(_opt(target, "set-xmark"))
        state.conn = replace(conn, connmark=(conn.connmark & ~mask) ^ value)
        return f"connmark now {hex(state.conn.connmark)}"
    if target.option("save-mark") is not None:
        new = (conn.connmark & ~ctmask) ^ (conn.mark & nfmask)
        state.conn = replace(conn, connmark=new)
        return f"connmark now {hex(new)}"
    if target.option("restore-mark") is not None:
        new = (conn.mark & ~nfmask) ^ (conn.connmark & ctmask)
        state.conn = replace(conn, mark=new)
        return f"mark now {hex(new)}"
    raise TraceError("trace does not model this CONNMARK form")


def _opt(holder: Any, name: str) -> str:
    option: Option | None = holder.option(name)
    if option is None:
        raise TraceError(f"{holder.name} without --{name}")
    return option.arg()


def _mark(text: str) -> tuple[int, int]:
    value, _, mask = text.partition("/")
    return int(value, 0), int(mask, 0) if mask else 0xFFFFFFFF


def _first_failure(rule: Rule, conn: Connection) -> str | None:
    """Why ``rule`` does not match ``conn`` (its first failing condition), or None."""
    checks = (
        ("source", rule.source),
        ("destination", rule.destination),
        ("in-interface", rule.in_interface),
        ("out-interface", rule.out_interface),
        ("protocol", rule.protocol),
    )
    for what, crit in checks:
        if crit is not None:
            failure = _criterion(what, crit, conn)
            if failure is not None:
                return failure
    if rule.fragment is not None and not rule.fragment.negated:
        return "the first packet is not a fragment"
    for match in rule.matches:
        failure = _match(match, conn)
        if failure is not None:
            return failure
    return None


def _criterion(what: str, crit: Criterion, conn: Connection) -> str | None:
    if what in ("source", "destination"):
        addr = conn.src if what == "source" else conn.dst
        net = ipaddress.ip_network(crit.value, strict=False)
        hit = addr.version == net.version and addr in net
        shown = f"{what} {addr}"
        want = crit.value
    elif what in ("in-interface", "out-interface"):
        iface = conn.in_interface if what == "in-interface" else conn.out_interface
        if iface is None:
            return f"no {what} at this hook"
        value = crit.value
        hit = iface.startswith(value[:-1]) if value.endswith("+") else iface == value
        shown, want = f"{what} {iface}", value
    else:
        hit = crit.value in ("all", "0") or crit.value == conn.protocol
        shown, want = f"protocol {conn.protocol}", crit.value
    if hit != crit.negated:
        return None
    return f"{shown} is {'' if crit.negated else 'not '}{want}"


def _in_ports(port: int, spec: str) -> bool:
    for part in spec.split(","):
        low, _, high = part.partition(":")
        if int(low or 0) <= port <= int(high or low or 65535):
            return True
    return False


def _match(match: Match, conn: Connection) -> str | None:  # noqa: PLR0912 (one branch per module)
    module = match.module
    for option in match.options:
        name, arg = option.name, option.arg()
        if module in ("tcp", "udp", "multiport") and name in (
            "dport", "dports", "sport", "sports", "ports", "destination-port", "source-port",
        ):  # fmt: skip
            if module in ("tcp", "udp") and conn.protocol != module:
                return f"protocol {conn.protocol} is not {module}"
            ports = (
                [conn.src_port, conn.dst_port]
                if name == "ports"
                else [conn.dst_port if name.startswith("d") else conn.src_port]
            )
            hit = any(_in_ports(p, arg) for p in ports)
            label = "destination port" if name.startswith("d") else "source port"
            if name == "ports":
                label = "ports"
            shown = ",".join(map(str, ports))
        elif module == "tcp" and name == "tcp-flags":
            examined, _, flags = arg.partition(" ")
            # The first packet of a TCP connection carries SYN alone.
            hit = {f for f in examined.split(",") if f == "SYN"} == set(flags.split(",")) - {"NONE"}
            label, shown = "tcp flags", "SYN"
        elif module == "owner" and name in ("uid-owner", "gid-owner"):
            ident = conn.uid if name == "uid-owner" else conn.gid
            kind = name.split("-")[0]
            if ident is None:
                return f"no socket owner at this hook ({kind} unknown)"
            low, _, high = arg.partition("-")
            hit = low.isdigit() and int(low) <= ident <= int(high or low)
            label, shown = kind, str(ident)
        elif module == "owner" and name == "socket-exists":
            hit = conn.direction == "out"
            label, shown = "local socket", "yes" if hit else "none"
        elif module in ("mark", "connmark") and name == "mark":
            want, mask = _mark(arg)
            current = conn.mark if module == "mark" else conn.connmark
            hit = (current & mask) == want
            label, shown = module, hex(current)
        elif module in ("conntrack", "state") and name in ("ctstate", "state"):
            hit = conn.ctstate in arg.split(",")
            label, shown = "conntrack state", conn.ctstate
        elif module == "comment":
            continue
        else:
            raise TraceError(f"trace does not model -m {module} --{name}")
        if hit == option.negated:
            return f"{label} {shown} is {'' if option.negated else 'not '}{arg}"
    return None


def format_trace(result: Trace, *, title: str = "") -> str:
    """The report: the connection, every rule visited (✓ matched, ✗ not, and why), the verdict."""
    lines = [f"connection  {result.connection.summary()}"]
    if title:
        lines.append(f"capture     {title}")
    # Align the details after the rules; a rule longer than the cap gets its detail on the next
    # line instead of pushing every other detail off to the right.
    width = min(max((len(rule_text(s.rule)) for s in result.steps), default=0), _RULE_WIDTH)
    where = None
    for step in result.steps:
        if (step.table, step.chain) != where:
            where = (step.table, step.chain)
            lines.append("")
            lines.append(f"{step.table} {step.chain}")
        mark = "✓" if step.matched else "✗"
        text = rule_text(step.rule)
        if len(text) > width:
            lines.append(f"  {step.index:>2} {mark} {text}")
            lines.append(f"       {' ' * width}  {step.detail}")
        else:
            lines.append(f"  {step.index:>2} {mark} {text.ljust(width)}  {step.detail}")
    lines.append("")
    lines.append(f"verdict     {_verdict_line(result)}")
    return "\n".join(lines) + "\n"


def _verdict_line(result: Trace) -> str:
    if result.verdict == "redirected":
        return f"redirected to {result.port}: {result.reason}"
    if result.verdict == "tproxy":
        return (
            f"intercepted by TPROXY on {result.port} (original destination kept): {result.reason}"
        )
    if result.verdict == "dropped":
        return f"dropped: {result.reason}"
    return f"not captured, goes to {result.connection.dst} directly: {result.reason}"
