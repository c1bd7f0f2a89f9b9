"""The Gateway API conformance suite against meshctl's own GatewayClass on the real node.

``meshctl install`` (the default profile: the control plane with its gateway controller, the
Gateway API CRDs and the ``meshctl`` GatewayClass) from the node's meshctl image; then the suite's
own binary (v1.6.3, tests/kube/build.sh) runs profiles GATEWAY-HTTP, GATEWAY-TLS, GATEWAY-TCP and
GATEWAY-GRPC (one run each) against class ``meshctl``: its base Gateways are provisioned by the
controller (a Deployment + Service each, running ``meshctl gateway run``), its requests go from
this machine to the Gateways' addresses. The measure is the suite's ConformanceReport (written under
dist/gateway-conformance, its summary printed): every core test passes, and so does every
extended feature we declare.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.harness import gateway_conformance as gc
from tests.harness.mesh_install import Mesh, installed
from tests.harness.node import TestNode

pytestmark = pytest.mark.node

CLASS = "meshctl"
# The extended features of GATEWAY-HTTP the gateway implements (docs/gateway.md lists them),
# each passing its tests in the run below.
EXTENDED = (
    "HTTPRouteQueryParamMatching",
    "HTTPRouteMethodMatching",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteHostRewrite",
    "HTTPRoutePathRewrite",
    "HTTPRoutePathRedirect",
    "HTTPRouteSchemeRedirect",
    "HTTPRoutePortRedirect",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteRequestTimeout",
    "HTTPRouteBackendTimeout",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteParentRefPort",
    "GatewayPort8080",
    "GatewayHTTPListenerIsolation",
)
# Not declared: GatewayHTTPSListenerDetectMisdirectedRequests (the suite wants 421 for any host
# of another listener; we answer 421 only when that listener has another certificate, and route
# HTTP/2-coalesced requests the certificate covers: docs/gateway.md), and
# HTTPRouteBackendRequestHeaderModification (filters on a backendRef are not applied yet).
CORE_TESTS = 36  # GATEWAY-HTTP's core tests at v1.6.3 (../shared/notes/gateway.md)
# GATEWAY-TLS: its core features only. Not declared: TLSRouteModeTerminate and TLSRouteModeMixed
# (a TLS listener in Terminate mode is refused with UnsupportedValue: docs/gateway.md); the
# Gateway extended features are the HTTP run's (their tests need HTTPRoute).
TLS_FEATURES = ("Gateway", "ReferenceGrant", "TLSRoute")
TLS_CORE_TESTS = 19  # 10 Gateway tests and 9 TLSRoute tests at v1.6.3
# GATEWAY-TCP: its core features (its extended set at v1.6.3 is TCPRoute itself, already core).
TCP_FEATURES = ("Gateway", "ReferenceGrant", "TCPRoute")
TCP_CORE_TESTS = 18  # 10 Gateway tests and 8 TCPRoute tests at v1.6.3
# GATEWAY-GRPC: its core features and the one extended GRPCRoute feature there is (named rules;
# the profile's report counts only the Gateway extended features, so its test is read from the
# log).
GRPC_FEATURES = ("Gateway", "ReferenceGrant", "GRPCRoute", "GRPCRouteNamedRouteRule")
GRPC_CORE_TESTS = 14  # 10 Gateway tests and 4 GRPCRoute tests at v1.6.3


@pytest.fixture(scope="module")
def mesh(kube_node: TestNode) -> Iterator[Mesh]:
    with installed(Mesh(kube_node)) as mesh:
        yield mesh


def run_profile(kube_node: TestNode, profile: str, features: tuple[str, ...]) -> gc.SuiteRun:
    suite = gc.locate_suite()
    if isinstance(suite, str):
        pytest.skip(suite)
    # MESHCTL_CONFORMANCE_TEST=Name runs one test (for working on it); CI runs them all.
    only = os.environ.get("MESHCTL_CONFORMANCE_TEST") or None
    run = gc.run_suite(
        kube_node,
        suite,
        gc.SuiteOptions(
            gateway_class=CLASS,
            supported_features=features,
            profiles=(profile,),
            run_test=only,
        ),
        timeout=2400,
    )
    print(f"suite ran {run.seconds:.0f}s, exit {run.returncode}: {run.log_path} {run.report_path}")
    if run.report is not None:
        print(run.report.summary())
    assert not run.timed_out, run.tail()
    assert run.report is not None, f"no report at {run.report_path}:\n{run.tail()}"
    return run


def assert_core_passes(run: gc.SuiteRun, profile: str, core_tests: int) -> None:
    assert run.report is not None
    result = run.report.profiles[profile]
    assert result.core.failed_tests == (), run.tail(200)
    assert run.failed_tests == (), run.tail(200)
    if not os.environ.get("MESHCTL_CONFORMANCE_TEST"):
        assert result.core.passed == core_tests, run.report.summary()
        assert result.core.result == "success"
    assert run.returncode == 0, run.tail()


def test_gateway_http_core_conformance_passes(kube_node: TestNode, mesh: Mesh):
    features = ("Gateway", "HTTPRoute", "ReferenceGrant", *EXTENDED)
    run = run_profile(kube_node, "GATEWAY-HTTP", features)
    assert_core_passes(run, "GATEWAY-HTTP", CORE_TESTS)


def test_gateway_tls_core_conformance_passes(kube_node: TestNode, mesh: Mesh):
    run = run_profile(kube_node, "GATEWAY-TLS", TLS_FEATURES)
    assert_core_passes(run, "GATEWAY-TLS", TLS_CORE_TESTS)


def test_gateway_tcp_core_conformance_passes(kube_node: TestNode, mesh: Mesh):
    run = run_profile(kube_node, "GATEWAY-TCP", TCP_FEATURES)
    assert_core_passes(run, "GATEWAY-TCP", TCP_CORE_TESTS)


def test_gateway_grpc_core_conformance_passes(kube_node: TestNode, mesh: Mesh):
    run = run_profile(kube_node, "GATEWAY-GRPC", GRPC_FEATURES)
    assert_core_passes(run, "GATEWAY-GRPC", GRPC_CORE_TESTS)
    if not os.environ.get("MESHCTL_CONFORMANCE_TEST"):
        assert "--- PASS: TestConformance/GRPCRouteNamedRule " in run.log_path.read_text()
