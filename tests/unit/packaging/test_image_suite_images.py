"""packaging/image/build.py's images of the Gateway API conformance suite: the programs
tests/kube/build.sh cached, tagged with exactly the names the suite's manifests use."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

IMAGE_DIR = Path(__file__).resolve().parents[3] / "packaging" / "image"
ECHO = "registry.k8s.io/gateway-api/echo-basic"


def load_builder() -> ModuleType:
    name = "meshctl_image_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, IMAGE_DIR / "build.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


build = load_builder()
SUITE = build.pinned("gateway-api", "sigs.k8s.io/gateway-api/conformance")
COREDNS = build.pinned("coredns", "github.com/coredns/coredns")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A test cache as build.sh leaves it: the programs and the manifests' image list."""
    monkeypatch.setenv("MESHCTL_TEST_CACHE", str(tmp_path))
    suite = tmp_path / "gateway-api" / SUITE
    suite.mkdir(parents=True)
    (suite / "echo-basic").write_bytes(b"\x7fELF echo")
    (suite / "image-refs").write_text(
        f"registry.k8s.io/coredns/coredns:{COREDNS}\n"
        "registry.k8s.io/gateway-api/echo-advanced:v1.5.1\n"
        f"{ECHO}:v1.5.1\n{ECHO}:v1.6.0-dev.2\n{ECHO}:v1.6.0-dev.3\n"
    )
    coredns = tmp_path / "coredns" / COREDNS
    coredns.mkdir(parents=True)
    (coredns / "coredns").write_bytes(b"\x7fELF dns")
    return tmp_path


def test_the_wrapper_modules_pin_versions():
    assert SUITE.startswith("v1.")
    assert COREDNS.startswith("v1.")


def test_echo_basic_answers_to_every_name_the_manifests_use(cache: Path):
    image = build.echo_basic_image()
    assert image.refs == (f"{ECHO}:v1.5.1", f"{ECHO}:v1.6.0-dev.2", f"{ECHO}:v1.6.0-dev.3")
    assert image.entrypoint == ("/echo-basic",)
    assert image.user == "65532:65532"
    (layer,) = image.layers
    program = next(e for e in layer.entries if e.path == "/echo-basic")
    assert Path(program.source) == cache / "gateway-api" / SUITE / "echo-basic"
    assert program.mode == 0o755
    assert SUITE in layer.comment


def test_coredns_is_tagged_as_the_base_manifests_run_it(cache: Path):
    image = build.coredns_image()
    assert image.refs == (f"registry.k8s.io/coredns/coredns:{COREDNS}",)
    assert image.entrypoint == ("/coredns",)


def test_coredns_of_another_version_than_the_manifests_is_refused(cache: Path):
    refs = cache / "gateway-api" / SUITE / "image-refs"
    refs.write_text(f"registry.k8s.io/coredns/coredns:v0.0.1\n{ECHO}:v1.5.1\n")
    with pytest.raises(build.BuildError, match=re.escape(f"tests/kube/coredns pins {COREDNS}")):
        build.coredns_image()


def test_a_missing_program_names_the_build_step(cache: Path):
    (cache / "gateway-api" / SUITE / "echo-basic").unlink()
    with pytest.raises(build.BuildError, match=re.escape("run 'bash tests/kube/build.sh' first")):
        build.echo_basic_image()
