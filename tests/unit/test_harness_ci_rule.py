"""The CI rule of the test harness: under CI=true a skipped privileged test is a failure."""

from __future__ import annotations

import pytest

INNER = """
import pytest

@pytest.mark.netns
def test_privileged():
    pytest.skip("no root here")

@pytest.mark.kube
def test_cluster():
    pytest.skip("no apiserver")

@pytest.mark.packaging
def test_frozen():
    pytest.skip("no frozen build")

def test_plain():
    pytest.skip("optional")
"""


@pytest.mark.parametrize(("ci", "failed", "skipped"), [("true", 3, 1), ("", 0, 4)])
def test_privileged_skips_fail_only_in_ci(pytester, monkeypatch, ci, failed, skipped):
    monkeypatch.setenv("CI", ci)
    pytester.makepyfile(INNER)
    result = pytester.runpytest("-p", "tests.harness.plugin")
    result.assert_outcomes(failed=failed, skipped=skipped)
    if failed:
        result.stdout.fnmatch_lines(["*skipped under CI=true, which counts as a failure*"])
