"""Golden rule sets: ``meshctl iptables render`` and its derived cleanup, per configuration.

Each case runs the CLI in-process with Istio's flags (no kernel) and compares the output with
``testdata/<name>.golden``; ``MESHCTL_REFRESH_GOLDEN=1`` rewrites them. A golden no case produces
fails too, so renamed or removed cases cannot leave stale files behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from meshctl.cli import main
from tests.harness.cli import isolate_capture_settings
from tests.harness.golden import assert_golden, orphans, refreshing

DATA = Path(__file__).parent / "testdata"

# name -> istio-iptables style arguments. Defaults are what Istio's injector passes.
CASES: dict[str, list[str]] = {
    "default": [],
    "empty": ["-b", "", "-i", ""],
    "inbound-ports-include": ["-b", "80,8080"],
    "inbound-wildcard-exclude": ["-b", "*", "-d", "22,80,443"],
    "inbound-no-excludes": ["-d", ""],
    "outbound-cidrs": ["-i", "10.0.0.0/8,172.16.0.0/12"],
    "outbound-cidrs-exclude": ["-x", "10.96.0.0/12,169.254.169.254"],
    "outbound-ports-include": ["-q", "3306,5432"],
    "outbound-ports-exclude": ["-o", "22,80,443"],
    "outbound-ports-exclude-many": ["-o", ",".join(str(p) for p in range(9000, 9020))],
    "custom-ports": ["-p", "15101", "-z", "15106", "-e", "15108"],
    "uid-gid": ["-u", "3,4", "-g", "1,2"],
    "tproxy": ["-m", "TPROXY"],
    "tproxy-inbound-ports": ["-m", "TPROXY", "-b", "80,443"],
    "tproxy-mark-table": ["-m", "TPROXY", "-t", "0x1234", "-r", "200"],
    "dns-servers": ["--redirect-dns", "--dns-servers", "10.96.0.10"],
    "dns-capture-all": ["--redirect-dns", "--capture-all-dns"],
    "dns-uid-gid": ["--redirect-dns", "--dns-servers", "127.0.0.53", "-u", "3,4", "-g", "1,2"],
    "exclude-interfaces": ["-c", "eth1,eth2"],
    "exclude-interfaces-tproxy": ["-c", "eth1", "-m", "TPROXY"],
    "kube-virt-interfaces": ["-k", "k6t-eth0"],
    "kube-virt-interfaces-cidrs": ["-k", "k6t-eth0,k6t-eth1", "-i", "10.0.0.0/8"],
    "drop-invalid": ["--drop-invalid"],
    "ipv6": ["--dual-stack"],
    "ipv6-cidrs": ["--dual-stack", "-i", "10.0.0.0/8,fd00::/8", "-x", "fd00:1::/32"],
    "ipv6-dns": ["--dual-stack", "--redirect-dns", "--dns-servers", "10.96.0.10,fd00::10"],
    "ipv6-tproxy": ["--dual-stack", "-m", "TPROXY"],
    "loopback-outbound-iprange": ["-i", "127.1.2.3/32"],
    "host-ipv4-loopback-cidr": ["--outbound-ipv4-loopback-cidr", "127.0.0.1/8"],
    "outbound-owner-groups": ["--outbound-owner-groups", "java,1234"],
    "outbound-owner-groups-exclude": ["--outbound-owner-groups-exclude", "888"],
    "ambient": ["--mode", "ambient"],
    "ambient-dns": ["--mode", "ambient", "--redirect-dns"],
    "ambient-ipv6-dns": ["--mode", "ambient", "--dual-stack", "--redirect-dns"],
    "ambient-virtual-interfaces": ["--mode", "ambient", "-k", "virt0"],
}

# Connections traced against the default sidecar rules (and TPROXY / ambient), as in the docs.
TRACES: dict[str, list[str]] = {
    "trace-outbound-app": ["--dst", "10.96.0.10:80", "--uid", "1000"],
    "trace-outbound-proxy": ["--dst", "10.96.0.10:80", "--uid", "1337"],
    "trace-inbound": ["--direction", "in", "--dst", "10.244.1.5:8080", "--src", "10.244.2.7"],
    "trace-inbound-excluded": ["--direction", "in", "--dst", "10.244.1.5:15021"],
    "trace-hairpin": ["--dst", "10.244.1.5:8080", "--uid", "1337", "--iface", "lo"],
    "trace-dns": [
        "--dst",
        "10.96.0.10:53",
        "--protocol",
        "udp",
        "--redirect-dns",
        "--capture-all-dns",
    ],
    "trace-tproxy-inbound": ["-m", "TPROXY", "--direction", "in", "--dst", "10.244.1.5:8080"],
    "trace-ambient-outbound": ["--mode", "ambient", "--dst", "10.96.0.10:80"],
    "trace-ambient-proxy": ["--mode", "ambient", "--dst", "10.96.0.10:80", "--mark", "0x539"],
    "trace-ipv6": ["--dual-stack", "--dst", "[fd00::10]:443"],
}


@pytest.fixture
def run(capsys, monkeypatch, tmp_path):
    """``meshctl ARGS`` in-process with no capture env vars and no settings file."""
    isolate_capture_settings(monkeypatch, tmp_path)

    def invoke(*args: str) -> str:
        code = main(list(args))
        out, err = capsys.readouterr()
        assert code == 0, err
        return out

    return invoke


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_rules_and_cleanup_match_golden(run, name):
    args = CASES[name]
    shown = " ".join(repr(a) if not a or " " in a else a for a in args)
    text = (
        f"# meshctl iptables render {shown}".rstrip()
        + "\n"
        + run("iptables", "render", *args)
        + "# ---- derived cleanup (meshctl iptables render --cleanup) ----\n"
        + run("iptables", "render", "--cleanup", *args)
    )
    assert_golden(DATA / f"{name}.golden", text)


@pytest.mark.parametrize("name", sorted(TRACES))
def test_trace_output_matches_golden(run, name):
    args = TRACES[name]
    text = f"# meshctl iptables trace {' '.join(args)}\n" + run("iptables", "trace", *args)
    assert_golden(DATA / f"{name}.golden", text)


def test_there_are_at_least_twenty_rule_configurations():
    assert len(CASES) >= 20


def test_no_golden_file_is_left_without_a_case():
    if refreshing():
        pytest.skip("refreshing goldens; orphans are reported on the next normal run")
    produced = [f"{n}.golden" for n in (*CASES, *TRACES)]
    assert orphans(DATA, produced) == []
