"""Backend parity: libiptc in-process and iptables-legacy-restore install the very same tables."""

from __future__ import annotations

import pytest

from tests.netns.capture_support import Meshctl, save

pytestmark = pytest.mark.netns

CONFIGS = {
    "default": [],
    "tproxy-dns-interfaces": [
        "-m",
        "TPROXY",
        "--redirect-dns",
        "--capture-all-dns",
        "-c",
        "eth1",
        "-k",
        "k1",
        "--drop-invalid",
        "-o",
        "22,80,443",
    ],
    "cidrs-ports-owners": ["-i", "10.0.0.0/8", "-x", "10.1.0.0/16", "-q", "3306", "-u", "1,2"],
    "ambient-dns": ["--mode", "ambient", "--redirect-dns", "-k", "virt0"],
    "dual-stack-dns": ["--dual-stack", "--redirect-dns", "--dns-servers", "10.96.0.10,fd00::10"],
}


@pytest.fixture
def meshctl(capsys, monkeypatch, tmp_path):
    return Meshctl(capsys, monkeypatch, tmp_path)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_iptc_and_legacy_restore_give_identical_legacy_save_output(netns_factory, meshctl, name):
    args = CONFIGS[name]
    by_iptc, by_restore = netns_factory("iptc"), netns_factory("rest")
    meshctl.ok("iptables", "apply", "--netns", by_iptc.name, "--backend", "iptc", *args)
    meshctl.ok("iptables", "apply", "--netns", by_restore.name, "--backend", "legacy", *args)
    for v6 in (False, True):
        iptc_tables = save(by_iptc, "iptc", v6=v6)
        restore_tables = save(by_restore, "legacy", v6=v6)
        assert iptc_tables == restore_tables
    assert "MESH_" in save(by_iptc, "iptc")
    # and each backend reads the other's work back as in sync
    meshctl.ok("iptables", "check", "--netns", by_iptc.name, "--backend", "legacy", *args)
    meshctl.ok("iptables", "check", "--netns", by_restore.name, "--backend", "iptc", *args)


def test_iptc_switching_namespaces_in_one_process_never_uses_a_stale_table_handle(
    netns_factory, meshctl
):
    first, second = netns_factory("one"), netns_factory("two")
    meshctl.ok("iptables", "apply", "--netns", first.name, "--backend", "iptc")
    meshctl.ok("iptables", "apply", "--netns", second.name, "--backend", "iptc", "-p", "15101")
    meshctl.ok("iptables", "clean", "--netns", first.name, "--backend", "iptc")
    assert "MESH_" not in save(first, "iptc")
    assert "--to-ports 15101" in save(second, "iptc")
    meshctl.ok("iptables", "check", "--netns", second.name, "--backend", "iptc", "-p", "15101")
