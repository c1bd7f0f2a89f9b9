"""Injection against Istio's own test data: every case of ``pkg/kube/inject/testdata/inject``.

Istio's injector tests (``inject_test.go`` ``TestInjection``) pair each input ``X.yaml`` with the
``.injected`` output its injector produces, some under extra settings. Each case here runs the
same input through ``meshctl inject`` and compares the result with Istio's, structurally:
objects and their order, skip decisions and refusals, labels, annotations, containers and init
containers and their order, the app containers whole (probe rewrites included), the proxy's
securityContext, probes, resources, lifecycle, restart policy, the env and ports and mounts a user
or an annotation asked for, the capture flags, volumes, pull secrets and the rest of the pod spec.

Deliberate differences are folded before comparing, each named in ``FOLDED`` and documented in
docs/inject.md ("Differences from Istio"): images, our command lines, the env and volumes of
Istio's agent that meshctl's proxy does not use, the Envoy metrics port. A case that needs a
setting meshctl does not have is listed in ``NEEDS`` with the reason (never run, never passed); a
case that runs but still differs is in ``DIFFERS`` with the reason, and is expected to fail
(strict: fixing it fails the test until the entry goes). Counts are in docs/inject.md.
"""

from __future__ import annotations

import copy
import ipaddress
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from meshctl.core.k8s.inject import kinds
from meshctl.core.k8s.inject.annotations import quantity
from meshctl.core.k8s.inject.documents import inject_documents, load
from meshctl.core.k8s.inject.errors import InjectError
from meshctl.core.k8s.inject.settings import InjectSettings
from tests.harness.istio import fetch_istio_module, istio_module_dir

DATA = "pkg/kube/inject/testdata/inject"

# (input, Istio's output) -> meshctl's settings for the case, where Istio's test sets something.
SETTINGS: dict[tuple[str, str], dict[str, Any]] = {
    ("hello.yaml", "hello.yaml.proxyImageName.injected"): {"image": "proxyTest"},
    ("hello.yaml", "hello.yaml.proxyInitImageName.injected"): {},
    ("hello.yaml", "hello-always.yaml.injected"): {"image_pull_policy": "Always"},
    ("hello.yaml", "hello-never.yaml.injected"): {"image_pull_policy": "Never"},
    ("proxy-override-runas.yaml", "proxy-override-runas.yaml.cni.injected"): {"cni": True},
    ("proxy-override-args.yaml", "proxy-override-args-native.yaml.injected"): {},
    # values.global.network + CNI: the network's env and topology label.
    ("hello.yaml", "hello.yaml.cni.injected"): {"cni": True, "network": "network1"},
    # meshConfig.defaultConfig.interceptionMode: TPROXY.
    ("hello.yaml", "hello-tproxy.yaml.injected"): {"interception_mode": "TPROXY"},
    ("proxy-override-runas.yaml", "proxy-override-runas.yaml.tproxy.injected"): {
        "interception_mode": "TPROXY"
    },
    # values.global.proxy.{include,exclude}IPRanges, excludeInboundPorts, statusPort.
    ("traffic-params.yaml", "traffic-params.yaml.injected"): {
        "include_ip_ranges": "127.0.0.1/24,10.96.0.1/24",
        "exclude_ip_ranges": "10.96.0.2/24,10.96.0.3/24",
        "exclude_inbound_ports": "4,5,6",
        "status_port": 0,
    },
    # values.global.proxy.statusPort and readiness*.
    **{
        (f"{name}.yaml", f"{name}.yaml.injected"): {
            "status_port": 123,
            "readiness_initial_delay_seconds": 100,
            "readiness_period_seconds": 200,
            "readiness_failure_threshold": 300,
        }
        for name in ("status_params", "kubevirtInterfaces", "reroute-virtual-interfaces")
    },
    # values.global.imagePullSecrets.
    ("hello.yaml", "hello-image-secrets-in-values.yaml.injected"): {
        "image_pull_secrets": ("barSecret",)
    },
    ("hello-image-pull-secret.yaml", "hello-multiple-image-secrets.yaml.injected"): {
        "image_pull_secrets": ("barSecret",)
    },
    # values.global.podDNSSearchNamespaces: Istio's template no longer reads it (no effect there
    # either), so the case runs with meshctl's defaults.
    ("hello.yaml", "hello-template-in-values.yaml.injected"): {},
    # values.global.proxy.holdApplicationUntilProxyStarts (a mesh-wide ProxyConfig field).
    **{
        pair: {"proxy_config": '{"holdApplicationUntilProxyStarts": true}'}
        for pair in (
            ("hello.yaml", "hello.proxyHoldsApplication.yaml.injected"),
            ("hello-probes.yaml", "hello-probes.proxyHoldsApplication.yaml.injected"),
            (
                "hello-probes-noProxyHoldApplication-ProxyConfig.yaml",
                "hello-probes-noProxyHoldApplication-ProxyConfig.yaml.injected",
            ),
            ("merge-probers.yaml", "merge-probers.yaml.injected"),
        )
    },
    # meshConfig.defaultConfig.proxyMetadata (the pod's proxy.istio.io/config wins per key).
    ("traffic-annotations.yaml", "traffic-annotations.yaml.injected"): {
        "proxy_config": (
            '{"proxyMetadata": {"ISTIO_META_TLS_CLIENT_KEY": '
            '"/etc/identity/client/keys/client-key.pem"}}'
        )
    },
    # OpenShift with CNI, in TPROXY mode: the proxy runs as root, so the namespace's uid range
    # (the OpenShift-specific part) does not show.
    ("hello-openshift-tproxy.yaml", "hello-openshift-tproxy.yaml.injected"): {"cni": True},
    # values.global.proxy.resources, nulls as "" (no such request or limit).
    **{
        (f"{name}.yaml", f"{name}.yaml.injected"): {
            "proxy_cpu": "",
            "proxy_cpu_limit": "",
            "proxy_memory": "150Mi",
            "proxy_memory_limit": "500Mi",
        }
        for name in ("proxy-resources-null", "proxy-resources-null-no-init")
    },
    ("proxy-resources-zero.yaml", "proxy-resources-zero.yaml.injected"): {
        "proxy_cpu": "0",
        "proxy_cpu_limit": "0",
        "proxy_memory": "150Mi",
        "proxy_memory_limit": "500Mi",
    },
    ("proxy-resources-memory-null.yaml", "proxy-resources-memory-null.yaml.injected"): {
        "proxy_cpu": "50m",
        "proxy_cpu_limit": "100m",
        "proxy_memory": "",
        "proxy_memory_limit": "",
    },
    ("proxy-resources-mixed-null.yaml", "proxy-resources-mixed-null.yaml.injected"): {
        "proxy_cpu": "100m",
        "proxy_cpu_limit": "",
        "proxy_memory": "",
        "proxy_memory_limit": "500Mi",
        "proxy_ephemeral_storage": "1Gi",
    },
    **{
        (source, want): {"cni": True, "multus_network": "default/istio-cni"}
        for source, want in (
            ("hello.yaml", "hello-cncf-networks.yaml.injected"),
            ("hello-existing-cncf-networks.yaml", "hello-existing-cncf-networks.yaml.injected"),
            (
                "hello-existing-cncf-networks-json.yaml",
                "hello-existing-cncf-networks-json.yaml.injected",
            ),
        )
    },
    **{
        (f"{name}.yaml", f"{name}-old-version.yaml.injected"): {"native_sidecar": False}
        for name in (
            "hello",
            "cronjob",
            "daemonset",
            "job",
            "pod",
            "replicaset",
            "statefulset",
            "native-sidecar",
        )
    },
}
# (input, Istio's output) -> the Istio setting the case needs that meshctl has no equivalent of.
NEEDS: dict[tuple[str, str], str] = {
    # drainDuration is Envoy's hot-restart drain; meshctl's proxy has no hot restart (its
    # termination drain is terminationDrainDuration), and proxy-config refuses the field.
    ("format-duration.yaml", "format-duration.yaml.injected"): "mesh drainDuration (Envoy's)",
    ("hello.yaml", "hello-mount-mtls-certs.yaml.injected"): (
        "values.global.mountMtlsCerts (Istio's legacy /etc/certs Secret; meshctl's proxy reads "
        "workload-spiffe-credentials)"
    ),
    ("hello-tracing-disabled.yaml", "hello-tracing-disabled.yaml.injected"): "mesh tracing",
    ("hello-openshift.yaml", "hello-openshift.yaml.injected"): (
        "the OpenShift platform (the proxy uid from the namespace's UID range)"
    ),
    (
        "hello-openshift-custom-injection.yaml",
        "hello-openshift-custom-injection.yaml.injected",
    ): "the OpenShift platform (the proxy uid from the namespace's UID range)",
    ("hello-probes-localhost.yaml", "hello-probes-localhost.yaml.injected"): (
        "mesh inboundTrafficPolicy LOCALHOST"
    ),
    ("hello-otel-semconv.yaml", "hello-otel-semconv.yaml.injected"): "mesh extensionProviders",
    ("hello.yaml", "hello-fips-140-3.yaml.injected"): "the FIPS compliance policy",
    # Named templates meshctl refuses, each with a one-line reason (render.UNSUPPORTED_TEMPLATES).
    ("custom-template.yaml", "custom-template.yaml.injected"): "a user-defined template in values",
    ("sidecar-spire.yaml", "sidecar-spire.yaml.injected"): (
        "the SPIRE template (no SPIFFE Workload API client in meshctl's proxy)"
    ),
    ("gateway-spire.yaml", "gateway-spire.yaml.injected"): (
        "the SPIRE template (no SPIFFE Workload API client in meshctl's proxy)"
    ),
    # Cases the auto-discovery of inject_test.go adds whose input asks for a feature meshctl has
    # no equivalent of.
    ("grpc-agent.yaml", "grpc-agent.yaml.injected"): "the proxyless gRPC template",
    ("grpc-simple.yaml", "grpc-simple.yaml.injected"): "the proxyless gRPC template",
    ("hello-multiport-metrics.yaml", "hello-multiport-metrics.yaml.injected"): (
        "Prometheus scrape targets"
    ),
}
# Cases Istio's test expects to be refused: (input, what the error names).
REFUSED = {
    "traffic-annotations-bad-includeipranges.yaml": "includeOutboundIPRanges",
    "traffic-annotations-bad-excludeipranges.yaml": "excludeOutboundIPRanges",
    "traffic-annotations-bad-includeinboundports.yaml": "includeInboundPorts",
    "traffic-annotations-bad-excludeinboundports.yaml": "excludeInboundPorts",
    "traffic-annotations-bad-excludeoutboundports.yaml": "excludeOutboundPorts",
}
STATUS_PORT_DIFFERS = (
    "meshctl's proxy serves probes and merged metrics on the annotation's status port "
    "(and Prometheus is sent there); Istio excludes that port from capture but its agent "
    "stays on 15020 (PROXY_CONFIG {}), where it points Prometheus"
)
# Cases that run but still differ, with why (expected to fail, strictly).
DIFFERS: dict[str, str] = {
    "only-proxy-container.yaml.injected": (
        "Istio moves the only container into initContainers (containers: [], which the API "
        "server refuses); meshctl keeps the proxy a regular container"
    ),
    "status_annotations.yaml.injected": STATUS_PORT_DIFFERS,
    # The same with values.global.proxy.statusPort: Istio excludes 123 and rewrites probes to
    # it, but points Prometheus at 15020 and declares no port 123.
    "status_params.yaml.injected": STATUS_PORT_DIFFERS,
    "kubevirtInterfaces.yaml.injected": STATUS_PORT_DIFFERS,
    "reroute-virtual-interfaces.yaml.injected": STATUS_PORT_DIFFERS,
    "merge-probers.yaml.injected": (
        "the input is a pod injected by an older Istio: meshctl strips that injection and "
        "injects afresh (ISTIO_META_APP_CONTAINERS names the new app container); Istio merges "
        "the old proxy container over its template, keeping its stale env, readiness probe "
        "and postStart hook"
    ),
}

# --- folding ----------------------------------------------------------------------------------

FOLDED = {
    # Env of Istio's agent (pilot-agent + Envoy) that meshctl's proxy has no use for, or has
    # under its own name; CA_ADDR points at each mesh's own CA.
    "env": {
        "PILOT_CERT_PROVIDER",
        "CA_ADDR",
        "ISTIO_CPU_LIMIT",
        "PROXY_CONFIG",
        "ISTIO_META_POD_PORTS",
        "GOMEMLIMIT",
        "GOMAXPROCS",
        "ISTIO_META_NODE_NAME",  # ours: NODE_NAME
        "ISTIO_META_OWNER",
        "ISTIO_META_MESH_ID",  # ours only when a mesh id is set
        "ISTIO_PROMETHEUS_ANNOTATIONS",
    },
    # Our own env on the proxy, which Istio's has not.
    # XDS_ADDRESS: ztunnel's name for where workloads come from (Istio's agent reads its
    # discoveryAddress from the proxy config instead).
    "our_env": {"NODE_NAME", "CANONICAL_SERVICE", "CANONICAL_REVISION", "XDS_ADDRESS"},
    # Istio's template volumes and mounts (their agent's sockets, Envoy's files, the CRL) and
    # ours (a writable /tmp for the one-file binary).
    "volumes": {
        "workload-socket",
        "credential-socket",
        "workload-certs",
        "istio-envoy",
        "istio-data",
        "istio-podinfo",
        "istio-token",
        "istiod-ca-cert",
        "istio-ca-crl",
        "meshctl-tmp",
    },
    "proxy_ports": {15090, 15001, 15006, 15008, 15020, 15021},
    "annotations": {"inject.meshctl.io/undo"},
}
INJECTED = {"istio-proxy", "istio-init", "istio-validation"}
CAPTURE_FLAGS = ("-p", "-z", "-u", "-m", "-i", "-x", "-b", "-d", "-q", "-o", "-k", "-c")


def _zero(value: Any) -> Any:
    """The same object in one spelling: Go's YAML writer drops zero values, the API server
    defaults ``fieldRef.apiVersion`` to v1, and a quantity has many spellings (``2`` is
    ``2000m``). Applied to both sides."""
    if isinstance(value, dict):
        out = {k: _zero(v) for k, v in value.items() if k != "creationTimestamp"}
        if "fieldPath" in out and out.get("apiVersion") == "v1":
            del out["apiVersion"]
        for section in ("requests", "limits"):
            if isinstance(out.get(section), dict):
                out[section] = {
                    k: format(quantity(str(v)).normalize(), "f") for k, v in out[section].items()
                }
        return {k: v for k, v in out.items() if v not in (None, {}, [], "", 0, False)}
    if isinstance(value, list):
        return [_zero(v) for v in value]
    return value


def _flags(args: list[str], *, theirs: bool) -> dict[str, Any]:
    """Capture flags by name, from ``istio-iptables ...`` or ``iptables apply|validate ...``.

    Lists are compared as sets in canonical form: meshctl writes CIDRs with host bits cleared
    and drops duplicates (the rules are the same), and the order of ports in one multiport
    match does not matter."""
    args = args[1:] if theirs else args[2:]
    out: dict[str, Any] = {}
    for flag, value in zip(args[::2], args[1::2], strict=False):
        if flag in CAPTURE_FLAGS and value:
            out[flag] = value
            if flag in ("-i", "-x") and value != "*":
                out[flag] = {str(ipaddress.ip_network(v, strict=False)) for v in value.split(",")}
            elif flag in ("-b", "-d", "-q", "-o") and value != "*":
                out[flag] = {int(p) for p in value.split(",") if p}
    return out


def _env(container: dict[str, Any], *, theirs: bool) -> dict[str, Any]:
    folded = FOLDED["env"] if theirs else FOLDED["env"] | FOLDED["our_env"]
    out = {}
    for entry in container.get("env") or ():
        if entry["name"] in folded:
            continue
        value = entry.get("value", entry.get("valueFrom"))
        if entry["name"] == "ISTIO_KUBE_APP_PROBERS":
            value = json.loads(value)
        out[entry["name"]] = value
    return out


def _container(container: dict[str, Any], *, theirs: bool) -> dict[str, Any]:
    c = copy.deepcopy(container)
    if c["name"] in ("istio-init", "istio-validation"):
        c["args"] = _flags(c.get("args") or [], theirs=theirs)
        c.pop("command", None)
        c["volumeMounts"] = [
            m for m in c.get("volumeMounts") or () if m["name"] not in FOLDED["volumes"]
        ]
    elif c["name"] == "istio-proxy":
        c["env"] = _env(c, theirs=theirs)
        c["ports"] = [
            p for p in c.get("ports") or () if p["containerPort"] not in FOLDED["proxy_ports"]
        ]
        c["volumeMounts"] = [
            m for m in c.get("volumeMounts") or () if m["name"] not in FOLDED["volumes"]
        ]
        for key in ("args", "command"):
            c.pop(key, None)
        hooks = c.get("lifecycle") or {}
        # Istio's native sidecar drains through its agent's preStop; meshctl's proxy drains on
        # SIGTERM, which the kubelet sends after the app containers stopped.
        if "pilot-agent" in json.dumps(hooks.get("preStop", "")):
            hooks.pop("preStop")
    else:
        return _zero(c)
    c.pop("image", None)
    if c.get("imagePullPolicy") == "IfNotPresent":
        c.pop("imagePullPolicy")  # ours always says it, Istio's unless values set one
    return _zero(c)


def _pod(template: dict[str, Any], *, theirs: bool) -> dict[str, Any]:
    pod = copy.deepcopy(template)
    metadata = pod.setdefault("metadata", {}) or {}
    annotations = dict(metadata.get("annotations") or {})
    for key in FOLDED["annotations"]:
        annotations.pop(key, None)
    if "sidecar.istio.io/status" in annotations:
        status = json.loads(annotations["sidecar.istio.io/status"])
        status["volumes"] = [v for v in status.get("volumes") or () if v not in FOLDED["volumes"]]
        annotations["sidecar.istio.io/status"] = _zero(status)
    if "proxy.istio.io/overrides" in annotations:
        annotations["proxy.istio.io/overrides"] = "(present)"
    metadata["annotations"] = annotations
    spec = pod.get("spec") or {}
    for field in ("containers", "initContainers"):
        spec[field] = [_container(c, theirs=theirs) for c in spec.get(field) or ()]
    spec["volumes"] = [v for v in spec.get("volumes") or () if v["name"] not in FOLDED["volumes"]]
    return _zero(pod)


def comparable(obj: Any, *, theirs: bool) -> Any:
    """``obj`` with each pod template folded (the rest as Go's YAML writer leaves it)."""
    if not isinstance(obj, dict):
        return obj
    if kinds.is_list(obj):
        return _zero({**obj, "items": [comparable(i, theirs=theirs) for i in obj["items"]]})
    path = kinds.template_path(obj)
    if path is None:
        return _zero(obj)
    out = copy.deepcopy(obj)
    if theirs and obj.get("kind") == "CronJob":
        # Istio labels and annotates the Job template of a CronJob; meshctl the pod template,
        # where the pods get them (FOLDED, docs/inject.md).
        job = out["spec"]["jobTemplate"]
        moved = job.pop("metadata", None) or {}
        pod_meta = job["spec"]["template"].setdefault("metadata", {})
        for section in ("labels", "annotations"):
            merged = {**(pod_meta.get(section) or {}), **(moved.get(section) or {})}
            pod_meta[section] = merged
    holder = out
    for part in path[:-1]:
        holder = holder[part]
    if path:
        holder[path[-1]] = _pod(holder[path[-1]], theirs=theirs)
        return _zero({k: v for k, v in out.items() if k != "status"})
    return _pod(out, theirs=theirs)


# --- cases ------------------------------------------------------------------------------------


def cases(folder: Path) -> list[tuple[str, str]]:
    """Every (input, output) pair Istio's TestInjection runs: its explicit table (SETTINGS,
    NEEDS) and one per remaining input with its ``.injected`` twin."""
    explicit = {**SETTINGS, **NEEDS}
    taken = {want for _, want in explicit}
    found = [
        (p.name, p.name + ".injected")
        for p in sorted(folder.glob("*.yaml"))
        if not p.name.endswith(".iop.yaml")
        and p.name + ".injected" not in taken
        and p.name not in REFUSED
    ]
    return sorted(explicit) + found


@pytest.fixture(scope="module")
def folder() -> Path:
    return istio_module_dir() / DATA


def run_case(folder: Path, source: str, want: str) -> str:
    """ "match", or raises AssertionError naming the first difference."""
    values = {"image": "registry.example/meshctl:parity", **SETTINGS.get((source, want), {})}
    settings = InjectSettings(**values)
    text = (folder / source).read_text()
    if source in REFUSED:
        with pytest.raises(InjectError, match=REFUSED[source]):
            inject_documents(load(text, source), source, settings)
        return "match"
    ours, _ = inject_documents(load(text, source), source, settings)
    theirs = [d.data for d in load((folder / want).read_text(), want)]
    assert len(ours) == len(theirs), "number of documents"
    for mine, istio in zip(ours, theirs, strict=True):
        assert comparable(mine, theirs=False) == comparable(istio, theirs=True)
    return "match"


def test_every_istio_case_is_compared_or_has_a_reason(folder: Path):
    outputs = {p.name for p in folder.glob("*.injected")}
    covered = {want for _, want in cases(folder)}
    assert outputs <= covered, sorted(outputs - covered)
    assert set(REFUSED) <= {p.name for p in folder.glob("*.yaml")}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" not in metafunc.fixturenames:
        return
    found = fetch_istio_module()
    if not isinstance(found, Path):  # the fixture-based test above skips or fails with why
        metafunc.parametrize("case", [])
        return
    folder = found / DATA
    params = []
    for source, want in cases(folder):
        if (source, want) in NEEDS:
            continue
        marks = []
        if want in DIFFERS:
            marks.append(pytest.mark.xfail(reason=DIFFERS[want], strict=True))
        params.append(pytest.param((source, want), id=want, marks=marks))
    for source in sorted(REFUSED):
        params.append(pytest.param((source, ""), id=source))
    metafunc.parametrize("case", params)


def test_meshctl_injects_as_istio_does(folder: Path, case: tuple[str, str]):
    assert run_case(folder, *case) == "match"


def counts(folder: Path) -> Counter[str]:
    """match / differ / needs-a-setting counts (for docs/inject.md)."""
    tally: Counter[str] = Counter()
    for source, want in cases(folder):
        if (source, want) in NEEDS:
            tally["skipped"] += 1
            continue
        try:
            run_case(folder, source, want)
            tally["match"] += 1
        except AssertionError:
            tally["differ"] += 1
    tally["refused as Istio does"] = sum(1 for _ in REFUSED)
    return tally


def test_cases_that_need_other_settings_still_inject_or_refuse_cleanly(folder: Path):
    """Not compared (NEEDS), but run with meshctl's defaults: a result or a one-line refusal
    (an unknown template, say), never a crash."""
    settings = InjectSettings(image="registry.example/meshctl:parity")
    outcomes: Counter[str] = Counter()
    for source, _ in NEEDS:
        try:
            inject_documents(load((folder / source).read_text(), source), source, settings)
            outcomes["injected"] += 1
        except InjectError:
            outcomes["refused"] += 1
    assert sum(outcomes.values()) == len(NEEDS)
