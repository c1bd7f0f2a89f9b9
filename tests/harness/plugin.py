"""The pytest plugin: privileged-test gating, the CI no-skip rule, and the netns fixtures.

Rule: a test marked ``netns``, ``kube``, ``node``, ``packaging`` or ``shells`` may skip on a
developer's laptop (not root, no kube-apiserver build, no frozen build, no zsh) with a reason, but
when ``CI=true`` such a skip is reported as a failure, so a privileged suite can never pass by not
running.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Generator, Iterator

import pytest

from tests.harness import netns as netns_mod

PRIVILEGED_MARKERS = ("netns", "kube", "node", "packaging", "shells")


MARKERS = {
    "netns": "needs root and real network namespaces (fails instead of skipping when CI=true)",
    "kube": "needs the real kube-apiserver + etcd harness (fails instead of skipping when CI=true)",
    "node": "needs the real single-node cluster (fails instead of skipping when CI=true)",
    "shells": "runs real zsh and fish (.ci/run installs them; fails instead of skipping in CI)",
    "slow": "takes more than a few seconds (frozen-binary build, cold fixtures)",
    "hostile": "the hostile-input tier (tests/hostile): every reader and server fed the corpus",
    "packaging": "needs packaging's outputs or tools: the frozen build (MESHCTL_FROZEN_BINARY, "
    "MESHCTL_FROZEN_TREE), Go and gcc -static (fails instead of skipping when CI=true)",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        # A run stopped with SIGTERM (CI's timeout, a user's kill) unwinds as Ctrl-C does:
        # context managers' finally blocks and fixture teardowns run (pytest tears fixtures
        # down at session finish after an interrupt), so no namespace, veth or process of a
        # test outlives the run. The default action would end the process with none of that.
        global _RUNNER  # noqa: PLW0603 (the one process whose SIGTERM unwinds the run)
        _RUNNER = os.getpid()
        signal.signal(signal.SIGTERM, _interrupt)


_RUNNER = 0  # the pytest process that installed the handler


def _interrupt(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
    if os.getpid() != _RUNNER:
        # A fork of the run (pyroute2's netns helper, a test's own fork) inherits the handler;
        # unwinding there would run the session's teardowns in a copy and stop the shared
        # apiserver under the real run. It dies as SIGTERM's default makes it.
        os.kill(os.getpid(), signum)
        return
    raise KeyboardInterrupt(f"signal {signum}")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def netns_unavailable_reason() -> str | None:
    """Why network-namespace tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "netns tests need root (create namespaces, veths, iptables)"
    if shutil.which("ip") is None:
        return "netns tests need iproute2's 'ip' command (apt-get install iproute2)"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    privileged = [m for m in PRIVILEGED_MARKERS if item.get_closest_marker(m)]
    if report.skipped and privileged and in_ci() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (
            f"{'/'.join(privileged)} test skipped under CI=true, which counts as a failure: "
            f"{reason}"
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("netns"):
        reason = netns_unavailable_reason()
        if reason:
            pytest.skip(reason)
    if item.get_closest_marker("shells"):
        missing = [shell for shell in ("zsh", "fish") if shutil.which(shell) is None]
        if missing:
            pytest.skip(f"needs {' and '.join(missing)} (apt-get install {' '.join(missing)})")


@pytest.fixture
def netns_factory() -> Iterator[netns_mod.NetnsFactory]:
    """Call it to get fresh namespaces (``lo`` up); all are removed after the test."""
    factory = netns_mod.NetnsFactory()
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def netns(netns_factory: netns_mod.NetnsFactory) -> netns_mod.Netns:
    """One throwaway network namespace with ``lo`` up."""
    return netns_factory("t")


@pytest.fixture
def node() -> Iterator[netns_mod.Node]:
    """A node namespace with bridge br0 and two pods on it (pods grow with ``node.add_pod``)."""
    with netns_mod.node_with_pods(2) as built:
        yield built
