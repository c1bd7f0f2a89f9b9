"""Installer goldens: our entry merged into real node configs, and cleanup giving them back.

Runs the installer's file work in-process on temp dirs (the daemon around it is tested in
tests/cli/test_cni_installer.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from meshctl_plugins.cni.installer import Installer, InstallSettings

from meshctl.core.k8s.cni import netconf
from tests.harness.golden import assert_golden, orphans

DATA = Path(__file__).parent / "testdata"
CASES = {
    # input file -> (file the runtime uses afterwards, its mode)
    "dbnet.conflist": ("dbnet.conflist", 0o644),
    "10-bridge.conf": ("10-bridge.conflist", 0o600),
    "with-old-entry.conflist": ("with-old-entry.conflist", 0o640),
}


def node(tmp_path: Path, name: str, mode: int) -> tuple[Installer, Path]:
    conf = tmp_path / "net.d"
    conf.mkdir()
    shutil.copy(DATA / name, conf / name)
    (conf / name).chmod(mode)
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("test-token\n")
    (sa / "ca.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    settings = InstallSettings(
        cni_bin_dir=str(tmp_path / "bin"),
        cni_conf_dir=str(conf),
        run_dir=str(tmp_path / "run"),
        service_account_dir=str(sa),
        kube_server="https://127.0.0.1:6443",
    )
    installer = Installer(settings, binary=b"#!/bin/sh\nexit 0\n")
    return installer, conf


def _golden_text(raw: bytes, run_dir: Path) -> str:
    # The temp run dir varies per test; the golden names it RUN_DIR.
    return raw.decode().replace(str(run_dir), "RUN_DIR")


@pytest.mark.parametrize("name", sorted(CASES))
def test_merge_matches_golden_and_cleanup_restores_bytes(tmp_path: Path, name: str):
    written, mode = CASES[name]
    installer, conf = node(tmp_path, name, mode)
    original = (conf / name).read_bytes()

    changed = installer.install()

    assert any(c.startswith("config ") for c in changed)
    merged = (conf / written).read_bytes()
    assert_golden(DATA / f"{name}.golden", _golden_text(merged, tmp_path / "run"))
    names = sorted(p.name for p in conf.iterdir())
    assert names == [written], "a wrapped .conf must not stay beside its list"
    assert (conf / written).stat().st_mode & 0o777 == mode
    data = json.loads(merged)
    assert [p["type"] for p in data["plugins"]].count("meshctl-cni") == 1
    assert data["plugins"][-1]["type"] == "meshctl-cni"
    assert installer.status().ready
    assert installer.install() == [], "installing twice must change nothing"

    installer.cleanup()

    assert sorted(p.name for p in conf.iterdir()) == [name]
    if name == "with-old-entry.conflist":
        # Its original held a stale entry of ours (an installer that died without cleaning up):
        # putting that back would chain a plugin that is gone. Cleanup removes every entry of
        # ours; the rest is the node's, in its order.
        assert_golden(DATA / f"{name}.clean.golden", (conf / name).read_text())
        assert b"meshctl-cni" not in (conf / name).read_bytes()
    else:
        assert (conf / name).read_bytes() == original
    assert (conf / name).stat().st_mode & 0o777 == mode
    assert not installer.settings.binary_path.exists()
    assert not installer.settings.kubeconfig_path.exists()


def test_cleanup_keeps_another_writers_change_and_drops_only_our_entry(tmp_path: Path):
    installer, conf = node(tmp_path, "dbnet.conflist", 0o644)
    installer.install()
    data = json.loads((conf / "dbnet.conflist").read_bytes())
    data["plugins"].insert(1, {"type": "portmap", "capabilities": {"portMappings": True}})
    (conf / "dbnet.conflist").write_bytes(netconf.render(data))

    installer.cleanup()

    after = json.loads((conf / "dbnet.conflist").read_bytes())
    assert [p["type"] for p in after["plugins"]] == ["bridge", "portmap", "tuning"]


def test_reformatted_config_is_still_restored_byte_for_byte(tmp_path: Path):
    installer, conf = node(tmp_path, "dbnet.conflist", 0o644)
    original = (conf / "dbnet.conflist").read_bytes()
    installer.install()
    compact = json.dumps(json.loads((conf / "dbnet.conflist").read_bytes()))
    (conf / "dbnet.conflist").write_text(compact)

    installer.cleanup()

    assert (conf / "dbnet.conflist").read_bytes() == original


def test_lexically_first_valid_file_is_the_one_merged(tmp_path: Path):
    installer, conf = node(tmp_path, "dbnet.conflist", 0o644)
    (conf / "00-broken.conf").write_text("{not json")
    (conf / "01-notype.conflist").write_text('{"name": "x", "plugins": [{"foo": 1}]}')
    (conf / "README").write_text("ignored")
    installer.install()
    assert "meshctl-cni" in (conf / "dbnet.conflist").read_text()
    assert (conf / "00-broken.conf").read_text() == "{not json"


def test_no_orphan_goldens():
    wanted = {f"{n}.golden" for n in CASES} | {"with-old-entry.conflist.clean.golden"}
    assert orphans(DATA, wanted) == []
