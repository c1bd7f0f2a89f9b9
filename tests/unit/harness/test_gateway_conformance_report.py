"""tests/harness/gateway_conformance.py without a node: the suite's flags as built from options,
its ConformanceReport YAML read into counts and names, failed tests read from `go test -v`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.harness import gateway_conformance as gc

# The shape conformance/apis/v1 marshals (statistics keys are Go field names: no json tags).
REPORT = """\
apiVersion: gateway.networking.k8s.io/v1
kind: ConformanceReport
date: "2026-12-06T05:30:00Z"
gatewayAPIChannel: standard
gatewayAPIVersion: v1.6.3
implementation:
  contact:
  - someone
  organization: meshctl
  project: meshctl
  url: https://meshctl.example.invalid
  version: 0.1.0
mode: default
profiles:
- core:
    failedTests:
    - HTTPRouteSimpleSameNamespace
    result: failure
    skippedTests:
    - GatewayClassObservedGenerationBump
    statistics:
      Failed: 1
      Passed: 33
      Skipped: 2
  extended:
    result: success
    statistics:
      Failed: 0
      Passed: 4
      Skipped: 0
    supportedFeatures:
    - HTTPRouteResponseHeaderModification
    unsupportedFeatures:
    - HTTPRouteCORS
  name: GATEWAY-HTTP
  summary: Core tests failed with 1 test failures.
- core:
    result: success
    statistics:
      Failed: 0
      Passed: 19
      Skipped: 0
  name: GATEWAY-TLS
  summary: Core tests succeeded.
"""


def test_a_report_gives_each_profiles_counts_and_names():
    report = gc.parse_report(REPORT)
    assert (report.gateway_api_version, report.gateway_api_channel, report.mode) == (
        "v1.6.3",
        "standard",
        "default",
    )
    assert report.implementation["organization"] == "meshctl"
    assert list(report.profiles) == ["GATEWAY-HTTP", "GATEWAY-TLS"]
    http = report.profiles["GATEWAY-HTTP"]
    assert http.core == gc.Status(
        result="failure",
        passed=33,
        skipped=2,
        failed=1,
        failed_tests=("HTTPRouteSimpleSameNamespace",),
        skipped_tests=("GatewayClassObservedGenerationBump",),
    )
    assert http.extended is not None
    assert (http.extended.passed, http.extended.failed) == (4, 0)
    assert http.supported_features == ("HTTPRouteResponseHeaderModification",)
    assert http.unsupported_features == ("HTTPRouteCORS",)
    tls = report.profiles["GATEWAY-TLS"]
    assert (tls.core.passed, tls.extended) == (19, None)
    assert report.summary().splitlines() == [
        (
            "GATEWAY-HTTP core: failure, 33 passed, 1 failed, 2 skipped "
            "(failed: HTTPRouteSimpleSameNamespace)"
        ),
        "GATEWAY-HTTP extended: success, 4 passed, 0 failed, 0 skipped",
        "GATEWAY-TLS core: success, 19 passed, 0 failed, 0 skipped",
    ]


PROFILE_P = "kind: ConformanceReport\nprofiles:\n- name: P\n"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("kind: Pod\n", "not a ConformanceReport"),
        ("- a\n", "not a ConformanceReport"),
        ("kind: ConformanceReport\nprofiles:\n- core: {}\n", "has no name"),
        (PROFILE_P, "P.core is not a mapping"),
        (f"{PROFILE_P}  core: {{result: x}}\n", "statistics"),
        (
            f"{PROFILE_P}  core:\n    statistics: {{Passed: -1}}\n",
            "P.core.statistics.Passed is not a count",
        ),
        (
            f"{PROFILE_P}  core:\n    statistics: {{}}\n    failedTests: oops\n",
            "not a list of names",
        ),
    ],
)
def test_what_is_not_a_report_is_refused(text, says):
    with pytest.raises(gc.ReportError, match=says):
        gc.parse_report(text)


def test_failed_tests_are_read_from_the_verbose_output():
    output = """\
=== RUN   TestConformance/HTTPRouteSimpleSameNamespace
    --- FAIL: TestConformance/HTTPRouteSimpleSameNamespace (10.03s)
        --- FAIL: TestConformance/HTTPRouteSimpleSameNamespace/Simple_HTTP_request (1.00s)
    --- PASS: TestConformance/GatewayClassObservedGenerationBump (0.50s)
    --- FAIL: TestConformance/HTTPRouteHeaderMatching (3.00s)
    --- SKIP: TestConformance/HTTPRouteCORS (0.00s)
--- FAIL: TestConformance (80.00s)
"""
    assert gc.failed_go_tests(output) == ["HTTPRouteSimpleSameNamespace", "HTTPRouteHeaderMatching"]


def test_options_become_the_suites_flags():
    options = gc.SuiteOptions(
        gateway_class="meshctl",
        supported_features=("Gateway", "HTTPRoute"),
        profiles=("GATEWAY-HTTP", "GATEWAY-TLS"),
        exempt_features=("HTTPRouteCORS",),
        skip_tests=("A", "B"),
        run_test="HTTPRouteSimpleSameNamespace",
        timeout_overrides={"RequestTimeout": 5, "GatewayMustHaveAddress": 10},
        implementation=gc.Implementation(version="9.9", contact=("a", "b")),
    )
    flags = options.flags(Path("/out/r.yaml"))
    assert flags == [
        "-gateway-class=meshctl",
        "-supported-features=Gateway,HTTPRoute",
        "-conformance-profiles=GATEWAY-HTTP,GATEWAY-TLS",
        "-report-output=/out/r.yaml",
        "-organization=meshctl",
        "-project=meshctl",
        "-url=https://meshctl.example.invalid",
        "-version=9.9",
        "-contact=a,b",
        "-exempt-features=HTTPRouteCORS",
        "-skip-tests=A,B",
        "-run-test=HTTPRouteSimpleSameNamespace",
        "-timeout-config-overrides=GatewayMustHaveAddress:10;RequestTimeout:5",
    ]
    minimal = gc.SuiteOptions(gateway_class="x").flags(Path("r"))
    optional = ("-run-test", "-skip-tests", "-exempt", "-timeout")
    assert not any(f.startswith(optional) for f in minimal)


def test_the_pinned_suite_version_is_read_from_the_wrapper_module(tmp_path: Path):
    assert gc.pinned_version().startswith("v1.")
    go_mod = tmp_path / "go.mod"
    go_mod.write_text("module m\n\nrequire (\n\tsigs.k8s.io/gateway-api/conformance v1.9.0\n)\n")
    assert gc.pinned_version(go_mod) == "v1.9.0"
    go_mod.write_text("module m\n")
    with pytest.raises(ValueError, match=re.escape("no sigs.k8s.io/gateway-api/conformance")):
        gc.pinned_version(go_mod)
