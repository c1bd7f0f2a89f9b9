"""istioctl for the dump tests (tests/harness/istio.py): a cached build is used as is; a missing
one is a skip, and under CI=true a failure."""

from __future__ import annotations

import stat

import pytest

from tests.harness import istio


def test_a_cached_istioctl_is_used_without_building(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHCTL_TEST_CACHE", str(tmp_path))
    binary = istio.istioctl_path()
    assert binary.parent == tmp_path / "istioctl" / istio.ISTIO_MODULE.partition("@")[2]
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(istio.subprocess, "run", lambda *a, **k: pytest.fail("built again"))
    assert istio.istioctl_binary() == binary


@pytest.mark.parametrize(
    ("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)]
)
def test_a_missing_istioctl_skips_or_fails_under_ci(monkeypatch, ci, outcome):
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(istio, "build_istioctl", lambda: "no go here (test)")
    with pytest.raises(outcome, match="no go here"):
        istio.istioctl_binary()
