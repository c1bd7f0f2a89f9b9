"""The node side of ambient capture: kubelet probes to enrolled pods leave as 169.254.7.127.

Owns the host-netns rules of Istio's probe scheme (``cni/pkg/iptables`` host rules, with MESH_
names): ``nat POSTROUTING -j MESH_POSTRT``, and in ``MESH_POSTRT`` one rule per enrolled pod IP
that source-NATs TCP the node itself originates (``-m owner --socket-exists``: a local socket,
i.e. the kubelet's probe, never forwarded pod traffic) to the probe address, which the in-pod
rules let pass uncaptured. Istio keeps the pod IPs in an ipset; one rule per IP in our own chain
gives the same packets the same treatment and can be listed, checked and removed as rules.
Invariants: only ``MESH_POSTRT`` and the jump to it are ever ours in the node's tables; no pod
IP means no rules at all (not an empty chain).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from meshctl.core.capture.parse import rule
from meshctl.core.capture.rules import Chain, Family, RuleSet, RuleSetBuilder, Table
from meshctl.core.capture.settings import PROBE_SNAT_IPV4, PROBE_SNAT_IPV6

CHAIN = "MESH_POSTRT"


def build(
    pod_ips: Iterable[str],
    family: Family,
    *,
    snat_ipv4: str = PROBE_SNAT_IPV4,
    snat_ipv6: str = PROBE_SNAT_IPV6,
) -> RuleSet:
    """The host rules for the enrolled pods' ``pod_ips`` of ``family`` (sorted, deduplicated)."""
    version = 4 if family is Family.IPV4 else 6
    addresses = sorted(
        {a for a in map(ipaddress.ip_address, pod_ips) if a.version == version},
        key=lambda a: a.packed,
    )
    snat = snat_ipv4 if family is Family.IPV4 else snat_ipv6
    width = 32 if family is Family.IPV4 else 128
    b = RuleSetBuilder(family)
    if addresses:
        b.add("nat", "POSTROUTING", rule(f"-j {CHAIN}", "meshctl's ambient host rules"))
    for address in addresses:
        b.add(
            "nat",
            CHAIN,
            rule(
                f"-d {address}/{width} -p tcp -m owner --socket-exists -j SNAT --to-source {snat}",
                f"kubelet probe to enrolled pod {address}: from {snat}",
            ),
        )
    return b.build()


def scoped(installed: RuleSet) -> RuleSet:
    """The part of ``installed`` (a node's tables, ``ours()``) that this module owns."""
    tables = []
    for table in installed.tables:
        if table.name != "nat":
            continue
        chains = []
        for chain in table.chains:
            if chain.name == CHAIN:
                chains.append(chain)
            elif chain.name == "POSTROUTING":
                jumps = tuple(r for r in chain.rules if r.jump == CHAIN)
                if jumps:
                    chains.append(Chain(chain.name, jumps))
        if chains:
            tables.append(Table(table.name, tuple(chains)))
    return RuleSet(installed.family, tuple(tables)).canonical()
