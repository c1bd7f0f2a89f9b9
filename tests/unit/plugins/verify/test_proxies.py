"""``verify --proxy``: which pods are checked, the pod checks run once per pod with that pod's
context, one row each, and exit 3 when any pod fails."""

from __future__ import annotations

import threading
from typing import Any

from meshctl_plugins.verify import proxies
from meshctl_plugins.verify.cli import run_checks

from meshctl.core.k8s.install.checks import Check, Result


def pod(name: str, *, sidecar: bool = False, ambient: str | None = None, phase: str = "Running"):
    annotations = {"ambient.istio.io/redirection": ambient} if ambient else {}
    containers = [{"name": "istio-proxy"}] if sidecar else []
    return {
        "metadata": {"namespace": "shop", "name": name, "annotations": annotations},
        "spec": {"initContainers": containers, "containers": [{"name": "main"}]},
        "status": {"phase": phase},
    }


def test_meshed_pods_are_running_sidecar_or_ambient_ones_pending_included():
    pods = [
        pod("b", sidecar=True),
        pod("a", ambient="enabled"),
        pod("c", ambient="pending"),
        pod("d"),
        pod("e", sidecar=True, phase="Pending"),
    ]
    assert proxies.meshed(pods) == [
        ("shop", "a", "ambient"),
        ("shop", "b", "sidecar"),
        ("shop", "c", "ambient"),
    ]


class Ctx:
    def __init__(self, workload: str) -> None:
        self.workload = workload
        self.memo: dict[Any, Any] = {}


def test_each_pod_gets_its_own_context_and_a_failure_is_its_row_and_exit_3():
    seen: list[str] = []
    lock = threading.Lock()

    def identity(ctx: Any) -> Result:
        with lock:
            seen.append(ctx.workload)
        if ctx.workload.endswith("/bad"):
            return Result.fail("the proxy holds no certificate", hint="see its log")
        return Result.ok(f"spiffe://cluster.local/ns/shop/sa/{ctx.workload.split('/')[1]}")

    def mtls(ctx: Any) -> Result:
        return Result.warn("no mTLS connection seen yet", hint="send traffic")

    checks = [
        Check(category="data", description="holds its identity", run=identity, workload=True),
        Check(category="data", description="talks mTLS", run=mtls, workload=True),
    ]
    pods = [("shop", "bad", "sidecar"), ("shop", "good", "ambient")]
    results = proxies.check_pods(pods, checks, Ctx, run_checks)
    assert sorted(seen) == ["shop/bad", "shop/good"]
    records = proxies.rows(results)
    assert [(r["name"], r["result"]) for r in records] == [("bad", "error"), ("good", "warning")]
    assert proxies.code(results) == 3
    text = proxies.table(records)
    lines = text.splitlines()
    assert lines[0].split() == ["NAMESPACE", "POD", "MODE", "STATUS", "MESSAGE"]
    assert "✘ error" in lines[1]
    assert "holds its identity: the proxy holds no certificate (Hint: see its log)" in lines[1]
    assert "⚠ warning" in lines[2]


def test_all_pods_healthy_is_exit_0_and_no_pods_says_so():
    ok = Check(category="d", description="ok", run=lambda ctx: Result.ok("fine"), workload=True)
    results = proxies.check_pods([("shop", "a", "sidecar")], [ok], Ctx, run_checks)
    assert proxies.code(results) == 0
    assert "✔ success" in proxies.table(proxies.rows(results))
    assert proxies.code([]) == 0
    assert proxies.table([]) == "No meshed pods found.\n"
