"""Our sidecar rules against istio-iptables' own expected output, configuration by configuration.

Istio's test suite keeps, for each of its iptables configurations, the exact commands
istio-iptables runs (``tools/istio-iptables/pkg/capture/testdata/<case>.golden``). The pinned
Istio module is fetched from the Go module proxy into the Go module cache (outside the repo,
once per machine) and every golden is compared with what our planner builds from the same
settings, per table and chain, after normalising spelling only: ``ISTIO_`` -> ``MESH_``, the
implicit ``-m tcp``/``-m udp`` of restore input, ``-N``/``-I``/``--to-port``, address forms.

Deliberate differences (docs/iptables.md) are folded before comparing, never ignored: what
Istio appends to a built-in chain sits in our hook chain the built-in chain jumps to
(``MESH_PRERT``, mangle ``MESH_OUTPUT``) and is inlined back; an excluded interface's RETURN
(which also opens nat ``MESH_OUTPUT``) is compared as a set of excluded interfaces; in TPROXY
mode we exempt the tunnel port in mangle too; a chain nothing jumps to is not created by us
(Istio always makes its four base chains).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshctl.core.capture.parse import parse
from meshctl.core.capture.plan import plan
from meshctl.core.capture.render import rule_text
from meshctl.core.capture.rules import Family, RuleSet
from meshctl.core.capture.settings import settings_from_args
from tests.harness.istio import istio_module_dir

GOLDENS = "tools/istio-iptables/pkg/capture/testdata"

# Istio's test configuration (capture/run_test.go: constructTestConfig) as our flags: nothing
# captured inbound or outbound, no excluded ports, no DNS servers, unless a case says so.
BASE = ["-p", "15001", "-z", "15006", "-e", "15008", "-u", "1337", "-g", "1337"]
BASE += ["-t", "1337", "-r", "133", "-b", "", "-i", "", "-d", ""]

# Each case of capture/run_test.go (getCommonTestCases) with its settings as our flags.
V6 = ["--dual-stack"]
UID_GID = ["-g", "1,2", "-u", "3,4"]
CASES: dict[str, list[str]] = {
    "empty": [],
    "ipv6-empty-inbound-ports": [*V6],
    "ip-range": [
        *["-x", "1.1.0.0/16", "-i", "9.9.0.0/16", "--redirect-dns"],
        *["--dns-servers", "127.0.0.53", *UID_GID],
    ],
    "tproxy": [
        *["-m", "TPROXY", "-b", "*", "-x", "1.1.0.0/16", "-i", "9.9.0.0/16", "--redirect-dns"],
        *["--dns-servers", "127.0.0.53", "-c", "not-istio-nic", *V6],
    ],
    "ipv6-inbound-ports": ["-b", "4000,5000", *V6],
    "ipv6-virt-interfaces": ["-b", "4000,5000", "-k", "eth0,eth1", *V6],
    "ipv6-ipnets": [
        *["-b", "4000,5000", "-d", "6000,7000,", "-k", "eth0,eth1"],
        *["-x", "2001:db8::/32", "-i", "2001:db8::/32", *V6],
    ],
    "ipv6-uid-gid": [
        *["-b", "4000,5000", "-d", "6000,7000", "-k", "eth0,eth1", *UID_GID],
        *["-x", "2001:db8::/32", "-i", "2001:db8::/32", *V6],
    ],
    "ipv6-outbound-ports": ["-q", "32000,31000", *V6],
    "kube-virt-interfaces": ["-k", "eth1,eth2", "-i", "*"],
    "ipnets": ["-i", "10.0.0.0/8"],
    "ipnets-with-kube-virt-interfaces": ["-k", "eth1,eth2", "-i", "10.0.0.0/8"],
    "inbound-ports-include": ["-b", "32000,31000"],
    "inbound-ports-wildcard": ["-b", "*"],
    "inbound-ports-tproxy": ["-b", "32000,31000", "-m", "TPROXY"],
    "inbound-ports-wildcard-tproxy": ["-b", "*", "-m", "TPROXY"],
    "dns-uid-gid": ["--redirect-dns", "--dns-servers", "127.0.0.53,::127.0.0.53", *UID_GID, *V6],
    "ipv6-dns-uid-gid": ["--redirect-dns", *UID_GID, *V6],
    "outbound-owner-groups": ["--outbound-owner-groups", "java,202"],
    "outbound-owner-groups-exclude": ["--outbound-owner-groups-exclude", "888,ftp"],
    "ipv6-dns-outbound-owner-groups": [
        "--redirect-dns",
        "--outbound-owner-groups",
        "java,202",
        *V6,
    ],
    "ipv6-dns-outbound-owner-groups-exclude": [
        *["--redirect-dns", "--outbound-owner-groups-exclude", "888,ftp", *V6],
    ],
    "outbound-ports-include": ["-q", "32000,31000"],
    "loopback-outbound-iprange": [
        *["-i", "127.1.2.3/32", "--redirect-dns", "--dns-servers", "127.0.0.53", *UID_GID],
    ],
    "basic-exclude-nic": ["-c", "not-istio-nic"],
    "drop-invalid": ["--drop-invalid"],
    "host-ipv4-loopback-cidr": ["--outbound-ipv4-loopback-cidr", "127.0.0.1/8"],
}

Chains = dict[tuple[str, str], list[str]]
_BUILTIN = {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}


@pytest.fixture(scope="module")
def goldens() -> Path:
    """Istio's golden directory, downloaded by the go command if this machine lacks it."""
    return istio_module_dir() / GOLDENS


def test_every_istio_configuration_has_a_case(goldens: Path):
    assert sorted(p.stem for p in goldens.glob("*.golden")) == sorted(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_our_rules_equal_istio_iptables_for(goldens: Path, case: str):
    theirs = _istio_rulesets((goldens / f"{case}.golden").read_text())
    settings = settings_from_args([*BASE, *CASES[case]])
    ours = [plan(settings).ruleset(family) for family in (Family.IPV4, Family.IPV6)]
    assert len(theirs) in (1, 2)
    for family, their_set in zip((Family.IPV4, Family.IPV6), theirs, strict=False):
        expected = _comparable(_chains(their_set), ours=False)
        got = _comparable(_chains(ours[family == Family.IPV6]), ours=True)
        assert got == expected, f"{case} ({family.name})"
    if len(theirs) == 1:  # no IPv6 from Istio: none from us either
        assert not _comparable(_chains(ours[1]), ours=True)["rules"]


# -- Istio's goldens -> our model ------------------------------------------------------------------


def _istio_rulesets(text: str) -> list[RuleSet]:
    """The golden's restore inputs (IPv4, then IPv6 when enabled) as rule sets."""
    payloads: list[list[str]] = []
    tables: set[str] = set()
    for line in text.splitlines():
        if line in ("iptables-save", "ip6tables-save") or not line.strip():
            continue  # the commands run around the restores
        if line.startswith("* "):
            if line[2:] in tables or not payloads:  # a table again: the IPv6 input begins
                payloads.append([])
                tables = set()
            tables.add(line[2:])
        payloads[-1].append(line)
    families = (Family.IPV4, Family.IPV6)
    return [
        parse(_as_save(lines, fam), fam) for lines, fam in zip(payloads, families, strict=False)
    ]


def _as_save(lines: list[str], family: Family) -> str:
    """istio-iptables' restore input in iptables-save's spelling, inserts done in place."""
    out: list[str] = []
    chains: dict[str, list[str]] = {}
    for raw in lines:
        line = raw.replace("ISTIO_", "MESH_")
        if line.startswith("* "):
            out.extend(_flush(chains))
            out.append("*" + line[2:])
        elif line.startswith("-N "):
            chains.setdefault(line[3:], [])
            out.append(f":{line[3:]} - [0:0]")
        elif line.startswith(("-A ", "-I ")):
            words = line.split()
            chain = words[1]
            rule = _saved_spelling(words[3:] if words[0] == "-I" else words[2:], family)
            rules = chains.setdefault(chain, [])
            if words[0] == "-I":
                rules.insert(int(words[2]) - 1, rule)
            else:
                rules.append(rule)
        elif line == "COMMIT":
            out.extend(_flush(chains))
            out.append(line)
        else:
            raise AssertionError(f"unexpected line in an Istio golden: {line!r}")
    return "\n".join(out) + "\n"


def _flush(chains: dict[str, list[str]]) -> Iterator[str]:
    for chain, rules in chains.items():
        for rule in rules:
            yield f"-A {chain} {rule}"
    chains.clear()


def _saved_spelling(words: list[str], family: Family) -> str:
    """A rule as restore input says it, as iptables-save prints it back: implicit ``-m tcp``,
    marks in hex (``--set-mark`` is ``--set-xmark`` with a full mask), CONNMARK's and TPROXY's
    default options written out."""
    out: list[str] = []
    proto = ""
    loaded: set[str] = set()
    for i, word in enumerate(words):
        before = words[i - 1] if i else ""
        if before == "-p":
            proto = word
        if before == "-m":
            loaded.add(word)
        if word in ("--dport", "--sport") and proto and proto not in loaded:
            at = len(out) - 1 if out and out[-1] == "!" else len(out)
            out[at:at] = ["-m", proto]
            loaded.add(proto)
        spelled = word
        if before in ("--mark", "--set-mark", "--tproxy-mark"):
            value, _, mask = word.partition("/")
            spelled = hex(int(value, 0)) + (f"/{hex(int(mask, 0))}" if mask else "")
            if before == "--set-mark":
                spelled += "/0xffffffff"
        out.append({"--to-port": "--to-ports", "--set-mark": "--set-xmark"}.get(spelled, spelled))
    if out[-1] in ("--save-mark", "--restore-mark"):
        out += ["--nfmask", "0xffffffff", "--ctmask", "0xffffffff"]
    if "TPROXY" in out:  # iptables-save: --on-port, --on-ip (the default one too), --tproxy-mark
        at = out.index("TPROXY") + 1
        options = dict(zip(out[at::2], out[at + 1 :: 2], strict=True))
        any_ip = "0.0.0.0" if family == Family.IPV4 else "::"  # noqa: S104 (a rule, not a bind)
        out[at:] = ["--on-port", options["--on-port"], "--on-ip", options.get("--on-ip", any_ip)]
        out += ["--tproxy-mark", options["--tproxy-mark"]]
    return " ".join(out)


# -- comparison ------------------------------------------------------------------------------------


def _chains(ruleset: RuleSet) -> Chains:
    return {
        (table.name, chain.name): [_addresses(rule_text(rule)) for rule in chain.rules]
        for table in ruleset.tables
        for chain in table.chains
    }


def _addresses(rule: str) -> str:
    """Addresses as the kernel keeps them (``127.0.0.1/8`` is ``127.0.0.0/8``; IPv6 compressed)."""

    def canonical(m: re.Match[str]) -> str:
        return f"{m.group(1)} {ipaddress.ip_network(m.group(2), strict=False)}"

    return re.sub(r"(-[sd]) (\S+/\d+)", canonical, rule)


def _comparable(chains: Chains, *, ours: bool) -> dict[str, object]:
    """The chains reachable from the built-in ones, after folding the deliberate differences."""
    chains = {k: list(v) for k, v in chains.items()}
    if ours:
        _inline_hooks(chains)
    excluded = _take_exclusions(chains, ours=ours)
    rules = _reachable(chains)
    # A built-in chain left with only a jump to a chain that is now empty does nothing.
    for key, chain_rules in list(rules.items()):
        target = re.fullmatch(r"-j (\S+)", chain_rules[0]) if len(chain_rules) == 1 else None
        if key[1] in _BUILTIN and target and (key[0], target.group(1)) not in rules:
            del rules[key]
    return {"rules": rules, "excluded_interfaces": excluded}


def _inline_hooks(chains: Chains) -> None:
    """Our hook chains hold what Istio appends to the built-in chain that jumps to them; in
    TPROXY mode the tunnel port is exempt in mangle too."""
    for (table, chain), rules in list(chains.items()):
        hook = re.fullmatch(r"-j (MESH_PRERT|MESH_OUTPUT)", rules[0]) if len(rules) == 1 else None
        if chain in _BUILTIN and hook and (hook.group(1) == "MESH_PRERT" or table == "mangle"):
            chains[(table, chain)] = chains.pop((table, hook.group(1)))
    inbound = chains.get(("mangle", "MESH_INBOUND"), [])
    if inbound[:1] == ["-p tcp -m tcp --dport 15008 -j RETURN"]:
        del inbound[0]


def _take_exclusions(chains: Chains, *, ours: bool) -> set[tuple[str, str, str]]:
    """Remove the excluded interfaces' RETURN rules; they open the built-in chains (Istio) or
    those plus our nat MESH_OUTPUT."""
    excluded: set[tuple[str, str, str]] = set()
    for (table, chain), rules in chains.items():
        if chain not in _BUILTIN and not (ours and (table, chain) == ("nat", "MESH_OUTPUT")):
            continue
        keep = []
        for rule in rules:
            m = re.fullmatch(r"-([io]) (\S+) -j RETURN", rule)
            if m:
                excluded.add((table, m.group(1), m.group(2)))
            else:
                keep.append(rule)
        chains[(table, chain)] = keep
    return excluded


def _reachable(chains: Chains) -> Chains:
    """The non-empty chains a packet can reach from a built-in chain."""
    seen: set[tuple[str, str]] = set()
    todo = [key for key in chains if key[1] in _BUILTIN]
    while todo:
        key = todo.pop()
        if key in seen:
            continue
        seen.add(key)
        for rule in chains[key]:
            jump = re.search(r"-[jg] (\S+)", rule)
            if jump and (key[0], jump.group(1)) in chains:
                todo.append((key[0], jump.group(1)))
    return {k: v for k, v in chains.items() if k in seen and v}
