"""packaging/image/build.py's ``istio-cni`` image: Istio's CNI agent and plugin as build.sh
--istio-cni cached them, laid out as the istio-cni chart expects, built only when named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.packaging.test_image_suite_images import load_builder

build = load_builder()
VERSION = build.istio_module_version()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MESHCTL_TEST_CACHE", str(tmp_path))
    built = tmp_path / "istio-cni" / VERSION
    built.mkdir(parents=True)
    (built / "install-cni").write_bytes(b"\x7fELF agent")
    (built / "istio-cni").write_bytes(b"\x7fELF plugin")
    return tmp_path


def test_the_version_is_the_pinned_istio_modules():
    pin = (build.ROOT / "tests" / "harness" / "istio.py").read_text()
    assert f'ISTIO_MODULE = "istio.io/istio@{VERSION}"' in pin


def test_agent_on_path_plugin_where_it_copies_from_and_host_proc_its_own(cache: Path):
    image = build.istio_cni_image()
    assert image.refs == (f"localhost/istio-install-cni:{VERSION}",)
    entries = {e.path: e for layer in image.layers for e in layer.entries}
    assert entries["/usr/local/bin/install-cni"].mode == 0o755
    assert entries["/opt/cni/bin/istio-cni"].mode == 0o755  # the agent's CNIBinDir
    assert entries["/host/proc"].kind == "symlink"
    assert entries["/host/proc"].target == "/proc"
    assert any(p.endswith("/iptables-legacy-restore") for p in entries)  # rules in the pods
    assert image.entrypoint == ("/usr/local/bin/install-cni",)


def test_missing_binaries_name_the_build_command(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("MESHCTL_TEST_CACHE", str(tmp_path))
    with pytest.raises(build.BuildError, match=re.escape("bash tests/kube/build.sh --istio-cni")):
        build.istio_cni_image()


def test_built_only_when_named():
    assert "istio-cni" in build.IMAGES
    assert build.default_names() == ["meshctl", "pause", "testapp", "echo-basic", "coredns"]
