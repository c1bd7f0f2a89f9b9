"""apply / check / clean for real, per backend, in throwaway namespaces (never the host's).

Each backend goes through: apply -> apply again (no change) -> check passes -> tamper -> check
exits 3 with a diff -> clean leaves no MESH_ chain (foreign rules intact) -> apply again.
"""

from __future__ import annotations

import pytest

from tests.netns.capture_support import (
    BACKENDS,
    IPTABLES,
    Meshctl,
    legacy_tables,
    nft_ruleset,
    save,
)

pytestmark = pytest.mark.netns

FOREIGN = ["-t", "nat", "-A", "PREROUTING", "-p", "udp", "--dport", "9999", "-j", "ACCEPT"]


@pytest.fixture
def meshctl(capsys, monkeypatch, tmp_path):
    return Meshctl(capsys, monkeypatch, tmp_path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_reapply_check_tamper_clean_reapply(netns, meshctl, backend):
    netns.run([IPTABLES[backend], *FOREIGN])
    at = ["--netns", netns.name, "--backend", backend]

    _, err = meshctl.ok("iptables", "apply", *at)
    assert f"with backend {backend}" in err
    first = save(netns, backend)
    assert "-A OUTPUT -j MESH_OUTPUT" in first

    _, err = meshctl.ok("iptables", "apply", *at)
    assert "already applied" in err
    assert save(netns, backend) == first

    _, err = meshctl.ok("iptables", "check", *at)
    assert "in sync" in err

    netns.run([IPTABLES[backend], "-t", "nat", "-D", "MESH_OUTPUT", "1"])
    code, out, err = meshctl("iptables", "check", *at)
    assert code == 3
    assert "+-A MESH_OUTPUT -s 127.0.0.6/32 -o lo -j RETURN" in out
    assert "Hint: run 'meshctl iptables apply'" in err

    _, err = meshctl.ok("iptables", "clean", *at)
    assert "removed meshctl capture" in err
    cleaned = save(netns, backend)
    assert "MESH_" not in cleaned
    assert "-A PREROUTING -p udp -m udp --dport 9999 -j ACCEPT" in cleaned

    meshctl.ok("iptables", "apply", *at)
    assert save(netns, backend) == first
    meshctl.ok("iptables", "check", *at)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_changed_config_reconciles_and_stale_rules_go(netns, meshctl, backend):
    at = ["--netns", netns.name, "--backend", backend]
    meshctl.ok("iptables", "apply", *at, "-o", "22", "--redirect-dns", "--capture-all-dns")
    assert "MESH_OUTPUT_DNS" in save(netns, backend)
    meshctl.ok("iptables", "apply", *at)
    after = save(netns, backend)
    assert "MESH_OUTPUT_DNS" not in after
    assert "--dport 22" not in after
    meshctl.ok("iptables", "check", *at)
    # the old settings are now the drift
    code, out, _ = meshctl("iptables", "check", *at, "-o", "22")
    assert code == 3
    assert "--dport 22 -j RETURN" in out


def test_dual_stack_applies_ipv6_rules_and_turning_it_off_removes_them(netns, meshctl):
    at = ["--netns", netns.name, "--backend", "legacy"]
    meshctl.ok("iptables", "apply", *at, "--dual-stack")
    assert "-A MESH_OUTPUT -s ::6/128 -o lo -j RETURN" in save(netns, "legacy", v6=True)
    assert "inet6 ::6/128" in netns.run(["ip", "-6", "addr", "show", "lo"]).stdout
    meshctl.ok("iptables", "check", *at, "--dual-stack")
    meshctl.ok("iptables", "apply", *at)
    assert "MESH_" not in save(netns, "legacy", v6=True)
    assert "MESH_OUTPUT" in save(netns, "legacy")


@pytest.mark.parametrize("backend", ["nft", "iptc"])
def test_tproxy_policy_routing_is_applied_checked_and_cleaned(netns, meshctl, backend):
    at = ["--netns", netns.name, "--backend", backend]
    meshctl.ok("iptables", "apply", *at, "-m", "TPROXY")
    rules = netns.run(["ip", "rule"]).stdout
    assert "fwmark 0x539 lookup 133 proto 77" in rules
    assert "local default dev lo" in netns.run(["ip", "route", "show", "table", "133"]).stdout
    meshctl.ok("iptables", "check", *at, "-m", "TPROXY")

    netns.run(["ip", "rule", "del", "fwmark", "0x539", "lookup", "133"])
    code, out, _ = meshctl("iptables", "check", *at, "-m", "TPROXY")
    assert code == 3
    assert "+ ip rule add fwmark 0x539 lookup 133" in out
    meshctl.ok("iptables", "apply", *at, "-m", "TPROXY")
    meshctl.ok("iptables", "check", *at, "-m", "TPROXY")

    meshctl.ok("iptables", "clean", *at)
    assert "proto 77" not in netns.run(["ip", "rule"]).stdout
    assert netns.run(["ip", "route", "show", "table", "133"]).stdout.strip() == ""


def test_ambient_rules_and_return_route_apply_cleanly(netns, meshctl):
    at = ["--netns", netns.name, "--mode", "ambient", "--redirect-dns"]
    meshctl.ok("iptables", "apply", *at)
    assert "fwmark 0x111/0xfff lookup 100 proto 77" in netns.run(["ip", "rule"]).stdout
    assert "32764:" in netns.run(["ip", "rule"]).stdout
    meshctl.ok("iptables", "check", *at)
    meshctl.ok("iptables", "clean", "--netns", netns.name)
    assert "proto 77" not in netns.run(["ip", "rule"]).stdout


def test_auto_uses_the_backend_that_already_has_rules(netns, meshctl):
    netns.run(["iptables-legacy", *FOREIGN])
    _, err = meshctl.ok("iptables", "apply", "--netns", netns.name)
    assert "with backend legacy" in err
    assert "MESH_OUTPUT" in save(netns, "legacy")
    assert "MESH_" not in save(netns, "nft")


def test_auto_in_an_empty_namespace_uses_the_hosts_default(netns, meshctl):
    from meshctl.net.iptables import host_default

    _, err = meshctl.ok("iptables", "apply", "--netns", netns.name)
    expected = "legacy" if host_default() in ("legacy", "iptc") else "nft"
    assert f"with backend {expected}" in err


def test_backends_are_never_mixed(netns, meshctl):
    meshctl.ok("iptables", "apply", "--netns", netns.name, "--backend", "nft")
    for other in ("legacy", "iptc"):
        code, _, err = meshctl("iptables", "apply", "--netns", netns.name, "--backend", other)
        assert code == 1
        assert "would mix backends" in err
    assert legacy_tables(netns) == ""  # the refusal created no legacy table either


def test_clean_auto_repairs_a_namespace_where_both_backends_hold_mesh_chains(netns, meshctl):
    meshctl.ok("iptables", "apply", "--netns", netns.name, "--backend", "nft")
    netns.run(["iptables-legacy", "-t", "nat", "-N", "MESH_STRAY"])
    code, _, err = meshctl("iptables", "apply", "--netns", netns.name)
    assert code == 1
    assert "both the legacy and the nft tables" in err
    meshctl.ok("iptables", "clean", "--netns", netns.name)
    assert "MESH_" not in save(netns, "nft")
    assert "MESH_" not in save(netns, "legacy")


def test_dry_run_prints_the_change_and_changes_nothing(netns, meshctl):
    out, err = meshctl.ok("iptables", "apply", "--netns", netns.name, "--dry-run", "-m", "TPROXY")
    assert "-A MESH_TPROXY ! -d 127.0.0.1/32 -p tcp -j TPROXY --on-port 15006" in out
    assert "# routing: + ip rule add fwmark 0x539 lookup 133" in out
    assert "dry run" in err
    assert legacy_tables(netns) == ""
    assert "MESH_" not in nft_ruleset(netns)
    assert "proto 77" not in netns.run(["ip", "rule"]).stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-i", "10.0.0.0/33"], "flag -i/--istio-service-cidr: invalid value '10.0.0.0/33'"),
        (["-p", "65536"], "flag -p/--envoy-port: invalid value '65536'"),
        (["-u", "istio-proxy"], "flag -u/--proxy-uid: invalid value 'istio-proxy'"),
        (["-m", "NAT"], "flag -m/--istio-inbound-interception-mode: invalid value 'NAT'"),
    ],
)
def test_bad_input_names_the_flag_and_value_exits_2_and_applies_nothing(
    netns, meshctl, args, needle
):
    code, out, err = meshctl("iptables", "apply", "--netns", netns.name, *args)
    assert code == 2
    assert needle in err
    assert out == ""
    assert legacy_tables(netns) == ""
    assert nft_ruleset(netns) == ""


def test_bad_env_var_is_named_and_nothing_is_applied(netns, meshctl, monkeypatch):
    monkeypatch.setenv("PROXY_UID", "-5")
    code, _, err = meshctl("iptables", "apply", "--netns", netns.name)
    assert code == 2
    assert "env PROXY_UID: invalid value '-5'" in err
    assert nft_ruleset(netns) == ""
    assert legacy_tables(netns) == ""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rule_the_kernel_rejects_leaves_the_previous_rules_untouched(netns, meshctl, backend):
    at = ["--netns", netns.name, "--backend", backend]
    meshctl.ok("iptables", "apply", *at)
    before = save(netns, backend)
    # A syntactically valid group name that does not exist: only iptables itself can refuse it.
    code, _, err = meshctl("iptables", "apply", *at, "--outbound-owner-groups-exclude", "nogroupxq")
    assert code == 1
    assert "Error:" in err
    assert save(netns, backend) == before
    meshctl.ok("iptables", "check", *at)


def test_a_failure_after_the_rules_were_written_rolls_them_back(netns, meshctl):
    # IPv6 off in the namespace: the IPv6 local route of TPROXY fails after both families'
    # iptables rules were committed; apply must undo them and the policy rules it added.
    netns.run(["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])
    netns.run(["sysctl", "-qw", "net.ipv6.conf.lo.disable_ipv6=1"])
    code, _, err = meshctl(
        "iptables",
        "apply",
        "--netns",
        netns.name,
        "--backend",
        "legacy",
        "-m",
        "TPROXY",
        "--dual-stack",
    )
    assert code == 1
    assert "rolled back" in err
    assert "MESH_" not in save(netns, "legacy")
    assert "MESH_" not in save(netns, "legacy", v6=True)
    assert "proto 77" not in netns.run(["ip", "rule"]).stdout
