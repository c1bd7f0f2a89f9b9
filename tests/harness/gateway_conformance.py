"""The Gateway API conformance suite on the real test node.

Owns: finding the suite's cached build (``conformance.test``, the standard-channel CRDs; built by
tests/kube/build.sh from the wrapper module tests/kube/gateway-api), installing those CRDs,
importing the suite's images into the node (echo-basic under every tag its manifests use, CoreDNS),
running the suite's own ``TestConformance`` against a GatewayClass with a timeout, and reading the
``ConformanceReport`` YAML it writes. Nothing here plays a controller: everything the suite checks
is the gateway's to do. docs/testing-kube.md ("Gateway API conformance") has the figures.
"""

from __future__ import annotations

import contextlib
import http
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from meshctl import __version__
from tests.harness import workloads as wl
from tests.harness.kube import BUILD_HINT, REPO_ROOT, cache_root
from tests.harness.node import TestNode

SUITE_GO_MOD = REPO_ROOT / "tests" / "kube" / "gateway-api" / "go.mod"
SUITE_MODULE = "sigs.k8s.io/gateway-api/conformance"
# The suite's base manifests live here; its setup waits for every pod in them to be Ready.
BASE_NAMESPACES = (
    "gateway-conformance-infra",
    "gateway-conformance-app-backend",
    "gateway-conformance-web-backend",
)
DEFAULT_OUT_DIR = REPO_ROOT / "dist" / "gateway-conformance"
_FAILED_TEST = re.compile(r"^\s*--- FAIL: TestConformance/([^/\s]+) ", re.MULTILINE)


def pinned_version(go_mod: Path = SUITE_GO_MOD) -> str:
    """The suite's version the wrapper module requires (build.sh reads the same line)."""
    match = re.search(
        rf"^\s*(?:require\s+)?{re.escape(SUITE_MODULE)} (v\d+\.\d+\.\d+\S*)",
        go_mod.read_text(),
        re.MULTILINE,
    )
    if match is None:
        raise ValueError(f"{go_mod}: no {SUITE_MODULE} requirement")
    return match.group(1)


@dataclass(frozen=True, slots=True)
class Suite:
    """One cached build of the suite: ``<cache>/gateway-api/<version>/``."""

    version: str
    directory: Path

    @property
    def binary(self) -> Path:
        return self.directory / "conformance.test"

    @property
    def crd_dir(self) -> Path:
        """The standard channel: every CRD plus the safe-upgrades admission policy."""
        return self.directory / "crds" / "standard"


def locate_suite() -> Suite | str:
    """The suite's build, or the reason (with the fix) why it is not there."""
    version = pinned_version()
    suite = Suite(version, cache_root() / "gateway-api" / version)
    if not os.access(suite.binary, os.X_OK):
        return f"Gateway API conformance {version} not built ({suite.binary} missing): {BUILD_HINT}"
    if not any(suite.crd_dir.glob("*.yaml")):
        return f"Gateway API {version} CRDs not extracted ({suite.crd_dir} empty): {BUILD_HINT}"
    return suite


def crd_objects(crd_dir: Path) -> list[dict[str, Any]]:
    """Every object of the channel's YAML files, CRDs first (the admission policy names them)."""
    objects = [
        obj
        for path in sorted(crd_dir.glob("*.yaml"))
        for obj in yaml.safe_load_all(path.read_text())
        if obj
    ]
    return sorted(objects, key=lambda o: o["kind"] != "CustomResourceDefinition")


def install_crds(api: k8s.ApiClient, suite: Suite, timeout: float = 60) -> list[str]:
    """Applies the standard channel (idempotent) and waits until every CRD is Established."""
    objects = crd_objects(suite.crd_dir)
    wl.apply(api, objects)
    ext = k8s.ApiextensionsV1Api(api)
    names = [o["metadata"]["name"] for o in objects if o["kind"] == "CustomResourceDefinition"]

    def established() -> bool:
        for name in names:
            conditions = ext.read_custom_resource_definition(name).status.conditions or []
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                return False
        return True

    deadline = time.monotonic() + timeout
    while not established():
        if time.monotonic() > deadline:
            raise TimeoutError(f"Gateway API CRDs not Established within {timeout:.0f}s")
        time.sleep(0.2)
    return names


def uninstall_crds(api: k8s.ApiClient, suite: Suite, timeout: float = 120) -> None:
    """Removes the channel again (every Gateway API object with it), waiting until it is gone:
    later tests in the session (an install that brings its own CRDs) find the cluster as before."""
    wl.delete(api, crd_objects(suite.crd_dir), wait=timeout)


# ---------------------------------------------------------------------------------------------
# The report (conformance/apis/v1 in the suite's module: ConformanceReport, ProfileReport, Status)


@dataclass(frozen=True, slots=True)
class Status:
    """One half (core or extended) of a profile's result."""

    result: str  # success | partial | failure
    passed: int
    skipped: int
    failed: int
    failed_tests: tuple[str, ...] = ()
    skipped_tests: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ProfileReport:
    name: str
    summary: str
    core: Status
    extended: Status | None
    supported_features: tuple[str, ...] = ()
    unsupported_features: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ConformanceReport:
    gateway_api_version: str
    gateway_api_channel: str
    mode: str
    implementation: Mapping[str, Any]
    profiles: Mapping[str, ProfileReport]
    succeeded_provisional_tests: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line per profile: what CI prints after a run."""
        lines = []
        for profile in self.profiles.values():
            for kind, status in (("core", profile.core), ("extended", profile.extended)):
                if status is None:
                    continue
                line = (
                    f"{profile.name} {kind}: {status.result}, {status.passed} passed, "
                    f"{status.failed} failed, {status.skipped} skipped"
                )
                if status.failed_tests:
                    line += f" (failed: {', '.join(status.failed_tests)})"
                lines.append(line)
        return "\n".join(lines)


class ReportError(ValueError):
    """The report file is not a ConformanceReport of the shape this module reads."""


def _names(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ReportError(f"{what} is not a list of names: {value!r}")
    return tuple(value)


def _status(body: Any, what: str) -> Status:
    if not isinstance(body, Mapping):
        raise ReportError(f"{what} is not a mapping: {body!r}")
    stats = body.get("statistics")
    if not isinstance(stats, Mapping):
        raise ReportError(f"{what} has no statistics")
    counts = {}
    for key in ("Passed", "Skipped", "Failed"):  # the Go struct's field names: it has no json tags
        value = stats.get(key, 0)
        if not isinstance(value, int) or value < 0:
            raise ReportError(f"{what}.statistics.{key} is not a count: {value!r}")
        counts[key] = value
    return Status(
        result=str(body.get("result", "")),
        passed=counts["Passed"],
        skipped=counts["Skipped"],
        failed=counts["Failed"],
        failed_tests=_names(body.get("failedTests"), f"{what}.failedTests"),
        skipped_tests=_names(body.get("skippedTests"), f"{what}.skippedTests"),
    )


def parse_report(text: str) -> ConformanceReport:
    """The suite's report YAML; ``ReportError`` when it is not one."""
    body = yaml.safe_load(text)
    if not isinstance(body, Mapping) or body.get("kind") != "ConformanceReport":
        raise ReportError("not a ConformanceReport")
    profiles = {}
    for number, item in enumerate(body.get("profiles") or []):
        if not isinstance(item, Mapping) or not item.get("name"):
            raise ReportError(f"profiles[{number}] has no name")
        name = str(item["name"])
        extended = item.get("extended")
        profiles[name] = ProfileReport(
            name=name,
            summary=str(item.get("summary", "")),
            core=_status(item.get("core"), f"{name}.core"),
            extended=_status(extended, f"{name}.extended") if extended is not None else None,
            supported_features=_names(
                (extended or {}).get("supportedFeatures"), f"{name}.supportedFeatures"
            ),
            unsupported_features=_names(
                (extended or {}).get("unsupportedFeatures"), f"{name}.unsupportedFeatures"
            ),
        )
    return ConformanceReport(
        gateway_api_version=str(body.get("gatewayAPIVersion", "")),
        gateway_api_channel=str(body.get("gatewayAPIChannel", "")),
        mode=str(body.get("mode", "")),
        implementation=dict(body.get("implementation") or {}),
        profiles=profiles,
        succeeded_provisional_tests=_names(
            body.get("succeededProvisionalTests"), "succeededProvisionalTests"
        ),
    )


def failed_go_tests(output: str) -> list[str]:
    """The conformance tests ``go test -v`` output reports as failed (subtests folded)."""
    return list(dict.fromkeys(_FAILED_TEST.findall(output)))


# ---------------------------------------------------------------------------------------------
# A run


@dataclass(frozen=True, slots=True)
class Implementation:
    """Who the report names. The suite refuses to write a report with any field empty."""

    organization: str = "meshctl"
    project: str = "meshctl"
    # No public home yet: a reserved name that resolves nowhere, until a report is published.
    url: str = "https://meshctl.example.invalid"
    version: str = __version__
    contact: tuple[str, ...] = ("meshctl maintainers",)


@dataclass(frozen=True, slots=True)
class SuiteRun:
    argv: tuple[str, ...]
    returncode: int | None  # None: killed at the timeout
    seconds: float
    log_path: Path
    report_path: Path
    report: ConformanceReport | None
    failed_tests: tuple[str, ...]  # from the test output: present even when no report was written

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output().splitlines()[-lines:])


@dataclass(frozen=True, slots=True, kw_only=True)
class SuiteOptions:
    """The suite's flags (conformance/utils/flags/flags.go in its module)."""

    gateway_class: str
    supported_features: Sequence[str] = ("Gateway", "HTTPRoute", "ReferenceGrant")
    profiles: Sequence[str] = ("GATEWAY-HTTP",)
    exempt_features: Sequence[str] = ()
    skip_tests: Sequence[str] = ()
    run_test: str | None = None
    # Seconds per wait, by the suite's TimeoutConfig field names ({"GatewayMustHaveAddress": 30}).
    timeout_overrides: Mapping[str, int] = field(default_factory=dict)
    implementation: Implementation = Implementation()
    extra_flags: Sequence[str] = ()

    def flags(self, report_path: Path) -> list[str]:
        impl = self.implementation
        flags = [
            f"-gateway-class={self.gateway_class}",
            f"-supported-features={','.join(self.supported_features)}",
            f"-conformance-profiles={','.join(self.profiles)}",
            f"-report-output={report_path}",
            f"-organization={impl.organization}",
            f"-project={impl.project}",
            f"-url={impl.url}",
            f"-version={impl.version}",
            f"-contact={','.join(impl.contact)}",
        ]
        if self.exempt_features:
            flags.append(f"-exempt-features={','.join(self.exempt_features)}")
        if self.skip_tests:
            flags.append(f"-skip-tests={','.join(self.skip_tests)}")
        if self.run_test:
            flags.append(f"-run-test={self.run_test}")
        if self.timeout_overrides:
            # The suite's syntax: Name:seconds;Name:seconds (it ignores a pair it cannot read).
            pairs = ";".join(f"{k}:{v}" for k, v in sorted(self.timeout_overrides.items()))
            flags.append(f"-timeout-config-overrides={pairs}")
        return [*flags, *self.extra_flags]


def suite_images(node: TestNode) -> dict[str, str]:
    """Imports the suite's images into the node (once per start); skips (fails under CI)
    when they were not built."""
    return {role: node.image(role) for role in ("echo-basic", "coredns")}


def run_suite(
    node: TestNode,
    suite: Suite,
    options: SuiteOptions,
    *,
    out_dir: Path | None = None,
    timeout: float = 3600,
) -> SuiteRun:
    """Runs the suite against ``options.gateway_class`` on the node and reads its report.

    Installs the CRDs and imports the images first; runs the binary in its own process group with
    ``-test.timeout`` = ``timeout`` (Go's dump names the test that hung) and kills the group 30 s
    later if it is still there. The report and the full output go to ``out_dir`` (default
    dist/gateway-conformance). Afterwards the suite's namespaces are gone, so another run starts
    clean.
    """
    cluster = node.cluster
    suite_images(node)
    with cluster.api_client() as api:
        install_crds(api, suite)
    out = (out_dir or DEFAULT_OUT_DIR).resolve()
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{options.gateway_class}-{'-'.join(options.profiles).lower()}"
    report_path, log_path = out / f"{stem}-report.yaml", out / f"{stem}.log"
    report_path.unlink(missing_ok=True)
    argv = (
        str(suite.binary),
        "-test.run=^TestConformance$",
        "-test.v",
        f"-test.timeout={int(timeout)}s",
        *options.flags(report_path),
    )
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    started = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            returncode: int | None = proc.wait(timeout=timeout + 30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            returncode = None
    seconds = time.monotonic() - started
    with cluster.api_client() as api:
        clear_namespaces(api, BASE_NAMESPACES)
    report = parse_report(report_path.read_text()) if report_path.is_file() else None
    output = log_path.read_text(errors="replace")
    return SuiteRun(
        argv=argv,
        returncode=returncode,
        seconds=seconds,
        log_path=log_path,
        report_path=report_path,
        report=report,
        failed_tests=tuple(failed_go_tests(output)),
    )


def clear_namespaces(api: k8s.ApiClient, names: Iterable[str], timeout: float = 120) -> None:
    """The suite deletes its namespaces without waiting; a next run needs them gone."""
    core = k8s.CoreV1Api(api)
    for name in names:
        try:
            core.read_namespace(name)
        except ApiException as exc:
            if exc.status == http.HTTPStatus.NOT_FOUND:
                continue
            raise
        wl.delete_namespace_now(api, name, timeout=timeout)
