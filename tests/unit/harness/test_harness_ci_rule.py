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


NODE_CONFTEST = """
import tests.harness.node as node

def pytest_configure(config):
    # A machine whose cgroups cannot run kubelet, as the node's own check reports it.
    node.host_unfit_reason = lambda: "cgroups: no cpu, memory and pids hierarchies (test)"
"""

NODE_TEST = """
import pytest

@pytest.mark.node
def test_on_the_node(kube_node):
    kube_node.cluster
"""


# Under CI the skip comes from the node plugin's setup hook: the setup fails (an error).
@pytest.mark.parametrize(("ci", "errors", "skipped"), [("true", 1, 0), ("", 0, 1)])
def test_an_unfit_node_is_one_clear_skip_or_a_ci_failure(
    pytester, monkeypatch, ci, errors, skipped
):
    monkeypatch.setenv("CI", ci)
    pytester.makeconftest(NODE_CONFTEST)
    pytester.makepyfile(NODE_TEST)
    result = pytester.runpytest(
        "-rs", "-p", "tests.harness.plugin", "-p", "tests.harness.kube", "-p", "tests.harness.node"
    )
    result.assert_outcomes(errors=errors, skipped=skipped)
    result.stdout.fnmatch_lines(["*cgroups: no cpu, memory and pids hierarchies (test)*"])
