"""iptables backends for the current network namespace, and choosing one.

Invariants:
- A backend reads a namespace's tables into the rule model and writes a change with
  ``render.transition`` semantics (only ``MESH_*`` chains and our jumps are touched):
  ``legacy``/``nft`` feed ``iptables-{legacy,nft}-restore --noflush`` (a dry ``--test`` run first,
  so a bad change fails before any table is committed); ``iptc`` is libiptc in-process.
- Backends are never mixed in one namespace: ``select`` refuses a backend when meshctl's chains
  already live in the other one (legacy and nft keep separate tables, and both would apply).
- ``auto`` picks the kind that already holds meshctl's chains, else the kind that holds any
  rules (legacy first, as istio-iptables does), else the host's default ``iptables``.
- A node's own tables (``host_kind``) follow the node's kubelet and kube-proxy instead, as
  kubernetes-sigs/iptables-wrappers decides: the kind holding kubelet's hint chains
  (``KUBE-IPTABLES-HINT``, ``KUBE-KUBELET-CANARY``), else the kind holding more rules; never
  both kinds on one host.
- Detection runs in-process (``/proc`` + libiptc for legacy, nf_tables netlink for nft) so that
  the ``iptc`` path never forks.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from meshctl.core.capture.parse import RuleParseError, parse
from meshctl.core.capture.render import transition
from meshctl.core.capture.rules import Family, RuleSet, is_ours
from meshctl.errors import NetError, UserError

log = logging.getLogger(__name__)

BACKENDS = ("auto", "nft", "legacy", "iptc")
# Chains kubelet creates in the tables it uses (kubernetes-sigs/iptables-wrappers reads the
# same two to tell which kind a node's Kubernetes components write).
HINT_CHAINS = frozenset({"KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"})
_TIMEOUT = 30.0
_NFPROTO = {Family.IPV4: 2, Family.IPV6: 10}  # nf_tables families of iptables-nft's tables


class Backend(Protocol):
    name: str
    variant: str  # "legacy" or "nft": the kernel tables it works on

    def read(self, family: Family) -> RuleSet: ...

    def write(self, family: Family, installed: RuleSet, desired: RuleSet) -> str: ...


def _binary(variant: str, family: Family, tool: str) -> str:
    prefix = "iptables" if family is Family.IPV4 else "ip6tables"
    return f"{prefix}-{variant}-{tool}"


class RestoreBackend:
    """``iptables-{legacy,nft}-save`` to read, ``-restore --noflush`` to write."""

    def __init__(self, variant: str) -> None:
        self.name = variant
        self.variant = variant

    def read(self, family: Family) -> RuleSet:
        argv = [_binary(self.variant, family, "save")]
        text = _run(argv)
        try:
            return parse(text, family)
        except RuleParseError as exc:
            raise NetError(
                f"cannot understand {argv[0]} output: {exc.message}",
                hint="a rule uses syntax meshctl does not parse; report it with the save output",
            ) from exc

    def write(self, family: Family, installed: RuleSet, desired: RuleSet) -> str:
        text = transition(installed, desired)
        if text:
            restore = _binary(self.variant, family, "restore")
            log.debug("%s --noflush input:\n%s", restore, text)
            # Each table commits on its own: with several, a dry run first makes sure a later
            # table cannot fail after an earlier one was committed. One table is atomic as is.
            if sum(line.startswith("*") for line in text.splitlines()) > 1:
                _run([restore, "--noflush", "--wait", "5", "--test"], stdin=text)
            _run([restore, "--noflush", "--wait", "5"], stdin=text)
        return text


def available(variant: str) -> bool:
    return shutil.which(_binary(variant, Family.IPV4, "restore")) is not None


def _run(argv: list[str], stdin: str | None = None) -> str:
    try:
        done = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=_TIMEOUT, check=False
        )
    except FileNotFoundError as exc:
        raise NetError(
            f"{argv[0]} not found",
            hint="install the iptables package, or use --backend iptc (legacy, in-process)",
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise NetError(
            f"{argv[0]} did not finish within {_TIMEOUT:.0f} s",
            hint="another process may hold the xtables lock",
        ) from exc
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith("Try")]
        raise NetError(f"{argv[0]} failed: {' / '.join(lines[:3]) or f'exit {done.returncode}'}",
                       hint=_hint(done.stderr))  # fmt: skip
    return done.stdout


def _hint(stderr: str) -> str:
    text = stderr.lower()
    if "permission denied" in text or "operation not permitted" in text:
        return "run as root (CAP_NET_ADMIN)"
    if "table does not exist" in text or "can't initialize" in text or "unable to init" in text:
        return (
            "the kernel lacks this table (iptable_nat/ip6table_nat?) or it matches the other "
            "backend: try --backend nft or --backend legacy"
        )
    if "no chain/target/match" in text or "couldn't load" in text:
        return (
            "a netfilter extension is missing in the kernel (xt_REDIRECT, xt_owner, xt_TPROXY, "
            "xt_CT, xt_conntrack ...): load it on the node"
        )
    if "lock file" in text:
        # iptables-legacy opens /run/xtables.lock (XTABLES_LOCKFILE) even to write another
        # namespace's tables; a container with a read-only root has nowhere to create it.
        return (
            "iptables-legacy needs a writable xtables lock file: mount the host's "
            "/run/xtables.lock into the container (hostPath, FileOrCreate), as kube-proxy does"
        )
    if "xtables lock" in text:
        return "another iptables process holds the xtables lock; retry"
    return "rerun with --debug to see the exact restore input"


@dataclass(frozen=True, slots=True)
class Presence:
    """What a kind of tables (legacy or nft) holds in the current namespace."""

    rules: bool  # any rule or user chain at all
    ours: frozenset[Family]  # the families with a MESH_* chain
    hinted: bool = False  # kubelet's hint chains: the kind the node's own components use
    count: int = 0  # rules in all (the tie-breaker when no hint says which kind is the node's)

    @property
    def has_ours(self) -> bool:
        return bool(self.ours)


def legacy_presence(families: tuple[Family, ...]) -> Presence:
    from meshctl.net import libiptc

    rules = False
    hinted = False
    count = 0
    ours: set[Family] = set()
    for family in families:
        if not libiptc.existing_tables(family):
            continue
        try:
            state = libiptc.IptcBackend().read(family)
        except NetError:
            if not available("legacy"):
                raise
            state = RestoreBackend("legacy").read(family)
        chains = [c for t in state.tables for c in t.chains]
        rules = rules or any(c.rules or c.policy is None for c in chains)
        hinted = hinted or any(c.name in HINT_CHAINS for c in chains)
        count += sum(len(c.rules) for c in chains)
        if any(is_ours(c.name) for c in chains):
            ours.add(family)
    return Presence(rules, frozenset(ours), hinted, count)


def nft_presence(families: tuple[Family, ...]) -> Presence:
    """iptables-nft's tables live in nf_tables families ``ip``/``ip6``; read them by netlink."""
    from meshctl.net.nftables_probe import table_families

    wanted = {_NFPROTO[f]: f for f in families}
    # A fresh pod namespace has no tables at all: answer that without importing pyroute2.
    if not wanted.keys() & set(table_families()):
        return Presence(False, frozenset())
    from pyroute2.nftables.main import NFTables

    try:
        with NFTables(nfgen_family=0) as nft:
            chains = [
                (wanted[c["nfgen_family"]], str(c.get_attr("NFTA_CHAIN_NAME")))
                for c in nft.get_chains()
                if c["nfgen_family"] in wanted
            ]
            rules = [r for r in nft.get_rules() if r["nfgen_family"] in wanted]
    except OSError as exc:  # no nf_tables in this kernel: nothing can be there
        log.debug("nf_tables unavailable: %s", exc)
        return Presence(False, frozenset())
    base = {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}
    return Presence(
        bool(rules) or any(name not in base for _, name in chains),
        frozenset(family for family, name in chains if is_ours(name)),
        any(name in HINT_CHAINS for _, name in chains),
        len(rules),
    )


def host_default() -> str:
    """``legacy`` or ``nft``: what the host's ``iptables`` command is (Debian alternatives)."""
    found = shutil.which("iptables")
    if found is None:
        return "iptc"
    real = Path(found).resolve().name
    return "legacy" if "legacy" in real else "nft"


def make(name: str) -> Backend:
    if name == "iptc":
        from meshctl.net.libiptc import IptcBackend

        return IptcBackend()
    if name not in ("legacy", "nft"):
        raise UserError(
            f"--backend: invalid value {name!r}", hint=f"use one of: {', '.join(BACKENDS)}"
        )
    if not available(name):
        alt = "--backend iptc" if name == "legacy" else "--backend legacy or --backend iptc"
        raise NetError(f"{_binary(name, Family.IPV4, 'restore')} not found", hint=f"use {alt}")
    return RestoreBackend(name)


def _legacy_backend() -> Backend:
    """The legacy tables through the restore binary when installed, else in-process."""
    return make("legacy") if available("legacy") else make("iptc")


@dataclass(frozen=True, slots=True)
class Choice:
    """The backend for a namespace, and the families whose tables hold meshctl chains there
    (for any other family, "installed" is known to be empty without reading it)."""

    backend: Backend
    ours: frozenset[Family]


def select(choice: str, families: tuple[Family, ...]) -> Choice:
    """The backend for this namespace (see the module invariants)."""
    if choice not in BACKENDS:
        raise UserError(
            f"--backend: invalid value {choice!r}", hint=f"use one of: {', '.join(BACKENDS)}"
        )
    legacy = legacy_presence(families)
    nft = nft_presence(families)
    if choice == "auto":
        if legacy.has_ours and nft.has_ours:
            raise NetError(
                "meshctl chains exist in both the legacy and the nft tables of this namespace",
                hint="remove both with 'meshctl iptables clean', then apply again",
            )
        if legacy.has_ours or (not nft.has_ours and legacy.rules):
            return Choice(_legacy_backend(), legacy.ours)
        if nft.has_ours or nft.rules:
            return Choice(make("nft"), nft.ours)
        if host_default() in ("legacy", "iptc"):
            return Choice(_legacy_backend(), frozenset())
        return Choice(make("nft"), frozenset())
    mine, other, other_name = (nft, legacy, "legacy") if choice == "nft" else (legacy, nft, "nft")
    if other.has_ours:
        raise NetError(
            f"meshctl chains already live in the {other_name} tables of this namespace; "
            f"--backend {choice} would mix backends",
            hint=f"use --backend auto, or remove them first with "
            f"'meshctl iptables clean --backend {other_name}'",
        )
    return Choice(make(choice), mine.ours)


def holders(families: tuple[Family, ...], *, in_process: bool = False) -> list[Backend]:
    """Every backend kind holding meshctl chains here (for ``clean --backend auto``).

    ``in_process``: legacy tables through libiptc even where the restore binary is installed
    (a namespace only we write, such as an ambient pod's: no xtables lock to take)."""
    out = []
    if legacy_presence(families).has_ours:
        out.append(make("iptc") if in_process else _legacy_backend())
    if nft_presence(families).has_ours:
        out.append(make("nft"))
    return out


def host_kind(families: tuple[Family, ...]) -> str:
    """``legacy`` or ``nft``: the kind of tables this (node's) namespace's own Kubernetes
    components write, decided as kubernetes-sigs/iptables-wrappers does (see the module)."""
    legacy = legacy_presence(families)
    nft = nft_presence(families)
    if nft.hinted:
        return "nft"
    if legacy.hinted:
        return "legacy"
    if legacy.count != nft.count:
        return "legacy" if legacy.count > nft.count else "nft"
    default = host_default()
    return "legacy" if default == "iptc" else default


def host_backend(kind: str) -> Backend:
    """The writer of ``kind`` on a node: legacy through the restore binary when installed (it
    takes the node's xtables lock, which kube-proxy's legacy writes take too), else libiptc."""
    return _legacy_backend() if kind == "legacy" else make("nft")
