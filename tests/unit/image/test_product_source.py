"""meshctl.image.product: where ``image build`` takes meshctl from, and the errors (with the fix)
when it cannot freeze itself."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from meshctl.errors import MeshctlError
from meshctl.image import product


def test_an_unfrozen_meshctl_has_no_own_source():
    assert not getattr(sys, "frozen", False)
    assert product.own_source() is None


def test_freezing_without_pyinstaller_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "PyInstaller" else real(name, *a),
    )
    with pytest.raises(MeshctlError) as caught:
        product.freeze()
    assert "PyInstaller is not installed" in caught.value.message
    assert caught.value.hint is not None
    assert "[build]" in caught.value.hint


def test_freezing_outside_a_checkout_says_what_to_run_instead(tmp_path: Path):
    with pytest.raises(MeshctlError) as caught:
        product.freeze(tmp_path)
    assert "source checkout" in caught.value.message
    assert "--tree DIR" in (caught.value.hint or "")


def test_a_directory_without_a_tree_manifest_is_named_with_the_fix(tmp_path: Path):
    with pytest.raises(MeshctlError) as caught:
        product.build(product.Source("tree", tmp_path))
    assert "not a frozen one-dir tree" in caught.value.message
    assert "packaging/build.sh" in (caught.value.hint or "")
