"""The test node's cleanup never touches what was there before it (the machine's CNI files)."""

from __future__ import annotations

from pathlib import Path

from tests.harness import nodehost


def test_only_entries_created_since_the_snapshot_are_removed(tmp_path: Path):
    conf, fresh = tmp_path / "net.d", tmp_path / "created"
    conf.mkdir()
    (conf / "05-machine.conflist").write_text("{}")  # the machine's own, before the start
    before = nodehost.path_entries([str(conf), str(fresh)])
    assert before == {str(conf): ["05-machine.conflist"], str(fresh): None}
    (conf / "10-meshctl-test-node.conflist").write_text("{}")
    (conf / "leftover-dir").mkdir()
    (conf / "leftover-dir" / "x").write_text("x")
    (conf / "dangling").symlink_to(tmp_path / "nowhere")
    fresh.mkdir()
    (fresh / "y").write_text("y")

    nodehost.remove_new_paths(before)

    assert sorted(p.name for p in conf.iterdir()) == ["05-machine.conflist"]
    assert (conf / "05-machine.conflist").read_text() == "{}"
    assert not fresh.exists()
    nodehost.remove_new_paths(before)  # idempotent: a second cleanup finds nothing to do


def snapshot(**changes) -> nodehost.HostSnapshot:
    base = {
        "sysctls": {"kernel/panic": "1", "net/ipv4/ip_forward": "0"},
        "nft_tables": [],
        "iptables": {"iptables-nft": []},
        "paths": {"/etc/cni/net.d": None},
        "cgroups": {"memory": ["system"]},
        "links": ["eth0", "lo"],
    }
    return nodehost.HostSnapshot.from_json({**base, **changes})


def test_snapshot_differences_name_each_change():
    before = snapshot()
    after = snapshot(
        sysctls={"kernel/panic": "10", "net/ipv4/ip_forward": "0"},
        nft_tables=[["ip", "kube-proxy"]],
        iptables={"iptables-nft": ["filter/KUBE-FIREWALL"]},
        paths={"/etc/cni/net.d": ["10-meshctl-test-node.conflist"]},
        links=["eth0", "lo", "mtnode0"],
    )
    assert before.differences(before) == []
    assert before.differences(after) == [
        "nft_tables: added ['ip', 'kube-proxy']",
        "links: added mtnode0",
        "sysctl kernel/panic: '1' -> '10'",
        "iptables iptables-nft: [] -> ['filter/KUBE-FIREWALL']",
        "paths /etc/cni/net.d: None -> ['10-meshctl-test-node.conflist']",
    ]
    assert nodehost.HostSnapshot.from_json(after.to_json()) == after


def test_the_guard_accepts_only_bridge_to_bridge_and_drops_the_rest():
    ruleset = nodehost.guard_ruleset("mtnode0")
    assert "hook forward priority -200; policy drop;" in ruleset
    assert 'iifname "mtnode0" oifname "mtnode0" accept' in ruleset
    assert ruleset.count("accept") == 1
