"""``meshctl install`` on the real node, as the install node tests drive it.

Owns the values a test install uses (the node's imported meshctl image, never pulled, one
control plane replica), running the CLI against the node's kubeconfig, reading ``verify -o json``
into checks by name, listing every object of ours, and starting from a cluster without the
control plane's CRDs other node tests applied directly (the node is shared by the session).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from . import workloads as wl
from .cli import run_meshctl
from .node import TestNode

OURS = "install.meshctl.io/component"  # the label install puts on every object it applies
SYSTEM_NS = "meshctl-system"


class Mesh:
    def __init__(
        self,
        node: TestNode,
        profile: str = "default",
        extra: Sequence[str] = (),
        *,
        image: str | None = None,
        pull_policy: str = "Never",
    ) -> None:
        self.node = node
        # Default: the image the node imported (never pulled); a registry's name is pulled.
        self.image = image or node.image("meshctl")
        self.pull_policy = pull_policy
        self.profile = profile
        self.extra = list(extra)  # more --set KEY=VALUE pairs of this install

    def run(self, *args: str, timeout: float = 420) -> Any:
        return run_meshctl(
            "--kubeconfig", str(self.node.cluster.kubeconfig), *args, timeout=timeout
        )

    @property
    def values(self) -> list[str]:
        return [
            "--profile", self.profile,
            "--set", f"image={self.image}", "--set", f"imagePullPolicy={self.pull_policy}",
            "--set", "components.controlplane.replicas=1",
            *self.extra,
        ]  # fmt: skip

    def install(self, *args: str) -> Any:
        return self.run("install", "-y", *self.values, "--readiness-timeout", "4m", *args)

    def verify(self, *args: str) -> tuple[int, dict[str, dict[str, Any]], str]:
        done = self.run("verify", "-o", "json", *args, timeout=120)
        assert "Traceback" not in done.stderr, done.stderr
        report = json.loads(done.stdout)
        checks = {
            f"{category['categoryName']}: {c['description']}": c
            for category in report["categories"]
            for c in category["checks"]
        }
        return done.returncode, checks, done.stdout


@contextlib.contextmanager
def installed(mesh: Mesh) -> Iterator[Mesh]:
    """``mesh`` installed (from a cluster without the CRDs other tests applied), purged after;
    a failed install fails the test with the mesh's namespace described."""
    remove_crds_other_tests_applied(mesh.node)
    done = mesh.install()
    try:
        if done.returncode != 0:
            with mesh.node.cluster.api_client() as api:
                described = wl.describe_namespace(api, SYSTEM_NS)
            pytest.fail(f"install: {done.returncode}\n{done.stderr}\n{described}")
        yield mesh
    finally:
        mesh.run("uninstall", "-y", "--purge", timeout=300)


def failing(checks: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: c for name, c in checks.items() if c["result"] == "error"}


def ours(node: TestNode) -> list[str]:
    """Every object carrying our label, across all listable resource types."""
    kinds = node.cluster.kubectl_run("api-resources", "--verbs=list", "-o", "name")
    assert kinds.returncode == 0, kinds.stderr
    wanted = ",".join(
        k for k in kinds.stdout.split() if k not in ("events", "events.events.k8s.io")
    )
    found: set[str] = set()
    selectors = (OURS, "app.kubernetes.io/managed-by=meshctl", "app.kubernetes.io/part-of=meshctl")
    for selector in selectors:
        listed = node.cluster.kubectl_run(
            "get", wanted, "-A", "-l", selector, "-o", "name", "--ignore-not-found"
        )
        assert listed.returncode == 0, listed.stderr
        found.update(line for line in listed.stdout.splitlines() if line)
    return sorted(found)


def remove_crds_other_tests_applied(node: TestNode) -> None:
    """The node is shared by the session: the control plane and ambient node tests apply the
    control plane's CRDs directly (not through install), which install rightly calls foreign.
    Install starts from a cluster without them, as a user's would."""
    # By name: the plugins install as meshctl_plugins, which this harness's type check lacks.
    crds = importlib.import_module("meshctl_plugins.controlplane.crds")
    with node.cluster.api_client() as api:
        ext = k8s.ApiextensionsV1Api(api)
        names = [body["metadata"]["name"] for body in crds.objects()]
        for name in names:
            try:
                crd = ext.read_custom_resource_definition(name)
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            if OURS not in (crd.metadata.labels or {}):
                ext.delete_custom_resource_definition(name)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            left = {c.metadata.name for c in ext.list_custom_resource_definition().items}
            if not left & set(names):
                return
            time.sleep(0.5)
        raise AssertionError(f"CRDs still present after delete: {sorted(left & set(names))}")
