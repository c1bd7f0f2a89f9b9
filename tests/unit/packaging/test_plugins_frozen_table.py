"""A frozen build reads the plugin table taken at build time instead of scanning entry points."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshctl import plugins


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This process as a frozen build whose ``meshctl`` package lives in ``tmp_path``."""
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(plugins, "__file__", str(tmp_path / "plugins.pyc"))
    return tmp_path / plugins.FROZEN_TABLE


def test_the_frozen_table_answers_as_the_scan_does_without_importlib_metadata(frozen, monkeypatch):
    scanned = plugins.discover()  # no table yet: the scan
    assert {"version", "cni", "ztunnel-dataplane"} <= set(scanned)
    frozen.write_text(plugins.frozen_table_json())
    monkeypatch.setattr(plugins, "_scan", lambda: pytest.fail("scanned despite the table"))
    assert plugins.discover() == scanned
    assert plugins.find("ztunnel-dataplane") == scanned["ztunnel-dataplane"]
    assert plugins.find("no-such-plugin") is None


def test_a_broken_table_falls_back_to_the_scan(frozen):
    frozen.write_text('[{"name": "x"}]')
    assert plugins.discover() == plugins._scan()


def test_unfrozen_the_table_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setattr(plugins, "__file__", str(tmp_path / "plugins.py"))
    (tmp_path / plugins.FROZEN_TABLE).write_text("[]")
    assert "version" in plugins.discover()
