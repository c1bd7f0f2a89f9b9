"""The Gateway API conformance fixture end to end on the real node, before any gateway exists.

The suite's own binary (tests/kube/build.sh) runs against a GatewayClass that no controller
serves. Its setup waits for the class to be Accepted and, after applying its base manifests, for
their Gateways to be Accepted and Programmed: the test writes exactly those conditions (the
status a controller writes first) and nothing else, so the suite gets as far as a real gateway
would let it: the echo backends and CoreDNS from the locally built images Ready on the node, then
one core test that fails because nothing gives the Gateway an address, and a report that says so.
"""

from __future__ import annotations

import datetime
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.harness import gateway_conformance as gc
from tests.harness import workloads as wl
from tests.harness.node import TestNode

pytestmark = pytest.mark.node

GROUP, VERSION = "gateway.networking.k8s.io", "v1"
CLASS = "meshctl-unserved"
CONTROLLER = "meshctl.io/no-controller-serves-this"
CORE_TEST = "HTTPRouteSimpleSameNamespace"


def _condition(kind: str, reason: str, generation: int) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": "written by the fixture test: no controller serves this class",
        "lastTransitionTime": now,
        "observedGeneration": generation,
    }


@dataclass
class StatusOnly:
    """Accepts the class and marks the base Gateways Accepted + Programmed (no addresses, no data
    plane), and records the base pods once all of them are Ready."""

    node: TestNode
    stop: threading.Event = field(default_factory=threading.Event)
    marked: set[str] = field(default_factory=set)
    ready_pods: list[dict[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def run(self) -> None:
        with self.node.cluster.api_client() as api:
            custom, core = k8s.CustomObjectsApi(api), k8s.CoreV1Api(api)
            while not self.stop.wait(0.5):
                try:
                    self._mark(custom)
                    if not self.ready_pods:
                        self._record_ready(core)
                except ApiException as exc:
                    self.errors.append(f"{exc.status} {exc.reason}")

    def _mark(self, custom: k8s.CustomObjectsApi) -> None:
        gwc = custom.get_cluster_custom_object(GROUP, VERSION, "gatewayclasses", CLASS)
        generation = gwc["metadata"]["generation"]
        if f"class/{generation}" not in self.marked:
            body = {"status": {"conditions": [_condition("Accepted", "Accepted", generation)]}}
            custom.patch_cluster_custom_object_status(GROUP, VERSION, "gatewayclasses", CLASS, body)
            self.marked.add(f"class/{generation}")
        for ns in gc.BASE_NAMESPACES:
            for gw in custom.list_namespaced_custom_object(GROUP, VERSION, ns, "gateways")["items"]:
                name, generation = gw["metadata"]["name"], gw["metadata"]["generation"]
                key = f"{ns}/{name}/{generation}"
                if gw["spec"]["gatewayClassName"] != CLASS or key in self.marked:
                    continue
                conditions = [
                    _condition("Accepted", "Accepted", generation),
                    _condition("Programmed", "Programmed", generation),
                ]
                custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, ns, "gateways", name, {"status": {"conditions": conditions}}
                )
                self.marked.add(key)

    def _record_ready(self, core: k8s.CoreV1Api) -> None:
        pods = [p for ns in gc.BASE_NAMESPACES for p in core.list_namespaced_pod(ns).items]
        if not pods or not all(wl.pod_ready(p) for p in pods):
            return
        if {p.metadata.namespace for p in pods} != set(gc.BASE_NAMESPACES):
            return
        self.ready_pods = [
            {
                "pod": f"{p.metadata.namespace}/{p.metadata.name}",
                "image": p.spec.containers[0].image,
                "image_id": p.status.container_statuses[0].image_id,
            }
            for p in pods
        ]


@pytest.fixture
def unserved_class(kube_node: TestNode) -> Iterator[gc.Suite]:
    suite = gc.locate_suite()
    if isinstance(suite, str):
        pytest.skip(suite)
    with kube_node.cluster.api_client() as api:
        gc.install_crds(api, suite)
        custom = k8s.CustomObjectsApi(api)
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "GatewayClass",
            "metadata": {"name": CLASS},
            "spec": {"controllerName": CONTROLLER},
        }
        custom.create_cluster_custom_object(GROUP, VERSION, "gatewayclasses", body)
        try:
            yield suite
        finally:
            custom.delete_cluster_custom_object(GROUP, VERSION, "gatewayclasses", CLASS)
            gc.uninstall_crds(api, suite)


def _image_ids(kube_node: TestNode, role: str) -> set[str]:
    """What the kubelet may report as the imported image's id: its config or manifest digest."""
    archive = kube_node.archives[role]
    entry = json.loads((archive.parent / "images.json").read_text())[role]
    return {entry["config"], entry["digest"]}


def test_the_suite_runs_its_base_manifests_and_reports_an_unserved_class_failing(
    kube_node: TestNode, unserved_class: gc.Suite
):
    status = StatusOnly(kube_node)
    writer = threading.Thread(target=status.run, name="status-only", daemon=True)
    writer.start()
    try:
        run = gc.run_suite(
            kube_node,
            unserved_class,
            gc.SuiteOptions(
                gateway_class=CLASS,
                run_test=CORE_TEST,
                # Nothing will ever give the Gateway an address: fail that wait in 10 s, not 180.
                timeout_overrides={"GatewayMustHaveAddress": 10, "NamespacesMustBeReady": 180},
            ),
            timeout=600,
        )
    finally:
        status.stop.set()
        writer.join(timeout=10)
    print(f"suite ran {run.seconds:.0f}s, exit {run.returncode}: {run.log_path} {run.report_path}")
    if run.report is not None:
        print(run.report.summary())

    assert not run.timed_out, run.tail()
    assert run.returncode == 1, run.tail()  # tests failed; a crash or a flag error is another code
    output = run.output()
    assert "Test Setup: Applying base manifests" in output, run.tail()
    assert f"Gateways and Pods in {', '.join(gc.BASE_NAMESPACES)} namespaces ready" in output

    # Every base pod became Ready from the images the node imported, under the names the
    # manifests use (echo-basic:v1.5.1 and :v1.6.0-dev.3, coredns:v1.12.2).
    assert status.ready_pods, f"the base pods never were all Ready (errors: {status.errors})"
    images = {p["image"] for p in status.ready_pods}
    assert {i.rpartition(":")[0] for i in images} == {
        "registry.k8s.io/gateway-api/echo-basic",
        "registry.k8s.io/coredns/coredns",
    }
    for pod in status.ready_pods:
        role = "coredns" if "/coredns/" in pod["image"] else "echo-basic"
        assert pod["image_id"] in _image_ids(kube_node, role), pod

    # The report: the one core test ran and failed, the other core tests were skipped.
    assert run.failed_tests == (CORE_TEST,), run.tail()
    took = re.search(rf"--- FAIL: TestConformance/{CORE_TEST} \((\d+)\.\d+s\)", output)
    assert took is not None
    assert int(took.group(1)) < 60, "the 10 s address wait took the suite's default (180 s)"
    assert run.report is not None, f"no report at {run.report_path}:\n{run.tail()}"
    assert run.report.gateway_api_version == unserved_class.version
    assert run.report.gateway_api_channel == "standard"
    http_profile = run.report.profiles["GATEWAY-HTTP"]
    assert http_profile.core.failed_tests == (CORE_TEST,)
    assert (http_profile.core.failed, http_profile.core.passed) == (1, 0)
    assert http_profile.core.result == "failure"
    assert http_profile.core.skipped >= 30  # the rest of the profile's core tests (36 at v1.6.3)

    # The suite's namespaces are gone: a second run on this node starts clean.
    with kube_node.cluster.api_client() as api:
        names = {n.metadata.name for n in k8s.CoreV1Api(api).list_namespace().items}
    assert not names & set(gc.BASE_NAMESPACES)
