"""The ambient agent's kernel steps in real namespaces: which tables a node's rules go to, and
removing a pod's rules where iptables-legacy cannot open its lock file.

A node's probe SNAT goes to the kind of tables its kubelet and kube-proxy write (their hint
chains first, else the kind with more rules), never both; rules an older agent left in the other
kind move. A pod's rules are removed in-process, so a read-only root filesystem (no
``/run/xtables.lock``, reproduced with iptables' own ``XTABLES_LOCKFILE``) cannot leave a pod
redirected to ports nobody listens on.
"""

from __future__ import annotations

import pytest

from meshctl.core.capture.plan import plan
from meshctl.core.capture.settings import settings_from_args
from meshctl.errors import NetError
from meshctl.net import capture, iptables
from meshctl.net.netns import NetnsRef
from tests.harness.cni import mesh_rules

pytestmark = pytest.mark.netns

POD_IP = "10.77.0.9"
SNAT = f"-A MESH_POSTRT -d {POD_IP}/32 -p tcp -m owner --socket-exists -j SNAT --to-source"


def _save(netns, variant: str) -> str:
    return netns.run([f"iptables-{variant}-save"]).stdout


def _kind(netns) -> str:
    with netns.entered():
        return iptables.host_kind(capture.FAMILIES)


def _probe(netns, ips: list[str]) -> str:
    with netns.entered():
        return capture.apply_host_probe(ips, target=None, backend="auto").backend


def test_kubelets_nft_hint_chain_puts_the_node_rules_in_nft_only(netns):
    # A legacy table with more rules must not win over kubelet's own mark.
    for port in range(3):
        netns.run(["iptables-legacy", "-t", "filter", "-A", "INPUT", "-p", "udp",
                   "--dport", str(9000 + port), "-j", "ACCEPT"])  # fmt: skip
    netns.run(["iptables-nft", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"])
    assert _kind(netns) == "nft"
    assert _probe(netns, [POD_IP]) == "nft"
    assert SNAT in _save(netns, "nft")
    assert "MESH_" not in _save(netns, "legacy")
    assert _probe(netns, []) == "nft"
    assert "MESH_" not in _save(netns, "nft")  # no pod: no chain at all


def test_kubelets_legacy_canary_puts_them_in_legacy_and_moves_an_older_choice(netns):
    netns.run(["iptables-legacy", "-t", "mangle", "-N", "KUBE-KUBELET-CANARY"])
    # An older agent wrote the node's rules into nft.
    with netns.entered():
        capture.apply_host_probe([POD_IP], target=None, backend="nft")
    assert SNAT in _save(netns, "nft")
    assert _kind(netns) == "legacy"
    _probe(netns, [POD_IP])
    assert SNAT in _save(netns, "legacy")
    assert "MESH_" not in _save(netns, "nft")


def test_without_hints_the_kind_with_more_rules_wins(netns):
    netns.run(["iptables-nft", "-t", "filter", "-A", "INPUT", "-p", "udp", "--dport", "53",
               "-j", "ACCEPT"])  # fmt: skip
    assert _kind(netns) == "nft"
    for port in (1, 2):
        netns.run(["iptables-legacy", "-t", "filter", "-A", "INPUT", "-p", "udp",
                   "--dport", str(port), "-j", "ACCEPT"])  # fmt: skip
    assert _kind(netns) == "legacy"


def _captured(netns) -> NetnsRef:
    ref = NetnsRef(netns.name, netns.path)
    rules = plan(settings_from_args(["--mode", "ambient"]))
    capture.apply(rules, target=ref, backend="iptc")
    assert any("MESH_PRERT" in line for line in mesh_rules(netns.name))
    return ref


def test_a_pods_rules_are_removed_in_process_where_the_lock_file_cannot_be_opened(
    netns, monkeypatch, tmp_path
):
    ref = _captured(netns)
    # What a container with a read-only root sees: iptables-legacy cannot create its lock.
    monkeypatch.setenv("XTABLES_LOCKFILE", str(tmp_path / "read-only" / "xtables.lock"))
    with pytest.raises(NetError) as failed:
        capture.clean(target=ref, backend="auto")  # through iptables-legacy-restore
    assert "lock file" in failed.value.message
    assert "/run/xtables.lock" in (failed.value.hint or "")
    assert mesh_rules(netns.name) != []
    capture.clean(target=ref, backend="auto", in_process=True)
    assert mesh_rules(netns.name) == []
