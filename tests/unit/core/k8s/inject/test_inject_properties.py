"""Properties of injection over generated pod specs: idempotence, an exact uninject, and no
container of the input ever missing from an output.

Pods are generated with the features injection touches: labels and annotations it reads or
writes (with and without prior values: tlsMode, Prometheus scrape settings, resources, the
proxy's config, user volumes, a status port), HTTP, TCP, gRPC and exec probes on numbered and
named ports, lifecycle hooks, init containers and native sidecars, a user's own istio-proxy
override, volumes, image pull secrets, absent, empty and null fields; under settings that
include the mesh-wide defaults (network, interception mode, capture, status port, pull secrets,
a mesh ProxyConfig). Equality is checked on JSON text, so key
order counts too.
"""

from __future__ import annotations

import base64
import json
import string
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshctl.core.k8s.inject import admission
from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject.pipeline import inject_pod, uninject_pod
from meshctl.core.k8s.inject.settings import InjectSettings

NAMES = st.text(string.ascii_lowercase + string.digits, min_size=1, max_size=8).map(
    lambda s: "c" + s
)
VALUES = st.text(string.ascii_letters + string.digits + "-._", max_size=10)
PORT = st.integers(1, 65535).map(str)
PORTS = st.lists(PORT, max_size=3).map(",".join)
CIDR = st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 32)).map(
    lambda t: f"{t[0]}.{t[1]}.0.0/{t[2]}"
)
CIDRS = st.lists(CIDR, max_size=2).map(",".join)
IFACES = st.lists(st.sampled_from(["eth1", "net1", "veth0"]), max_size=2).map(",".join)

ANNOTATIONS = st.dictionaries(
    st.sampled_from(
        [
            ann.INCLUDE_OUTBOUND_IP_RANGES,
            ann.EXCLUDE_OUTBOUND_IP_RANGES,
            ann.INCLUDE_INBOUND_PORTS,
            ann.EXCLUDE_INBOUND_PORTS,
            ann.INCLUDE_OUTBOUND_PORTS,
            ann.EXCLUDE_OUTBOUND_PORTS,
            ann.EXCLUDE_INTERFACES,
            ann.KUBEVIRT_INTERFACES,
            ann.INTERCEPTION_MODE,
            ann.NATIVE_SIDECAR,
            ann.REWRITE_PROBES,
            ann.DEFAULT_CONTAINER,
            "other.example/note",
            "prometheus.io/port",
            "prometheus.io/path",
            "prometheus.io/scrape",
            ann.PROXY_CPU,
            ann.PROXY_MEMORY_LIMIT,
            "proxy.istio.io/config",
            ann.USER_VOLUME,
            ann.STATUS_PORT,
            "sidecar.istio.io/logLevel",
        ]
    ),
    st.just(""),
    max_size=6,
).flatmap(
    lambda keys: st.fixed_dictionaries(
        {key: _annotation_value(key) for key in keys},
    )
)


def _annotation_value(key: str) -> st.SearchStrategy[str]:
    return {
        ann.INCLUDE_OUTBOUND_IP_RANGES: st.one_of(st.just("*"), CIDRS),
        ann.EXCLUDE_OUTBOUND_IP_RANGES: CIDRS,
        ann.INCLUDE_INBOUND_PORTS: st.one_of(st.just("*"), PORTS),
        ann.EXCLUDE_INBOUND_PORTS: PORTS,
        ann.INCLUDE_OUTBOUND_PORTS: PORTS,
        ann.EXCLUDE_OUTBOUND_PORTS: PORTS,
        ann.EXCLUDE_INTERFACES: IFACES,
        ann.KUBEVIRT_INTERFACES: IFACES,
        ann.INTERCEPTION_MODE: st.sampled_from(["REDIRECT", "TPROXY", "NONE"]),
        ann.NATIVE_SIDECAR: st.sampled_from(["true", "false"]),
        ann.REWRITE_PROBES: st.sampled_from(["true", "false"]),
        "prometheus.io/port": st.sampled_from(["8080", "9090"]),
        "prometheus.io/path": st.sampled_from(["/metrics", "/m"]),
        "prometheus.io/scrape": st.sampled_from(["true", "false"]),
        ann.PROXY_CPU: st.sampled_from(["50m", "4000m"]),
        ann.PROXY_MEMORY_LIMIT: st.sampled_from(["2Gi"]),
        "proxy.istio.io/config": st.sampled_from(
            [
                "holdApplicationUntilProxyStarts: true",
                '{"proxyMetadata": {"A": "b"}, "concurrency": 2}',
                "terminationDrainDuration: 9s",
            ]
        ),
        ann.USER_VOLUME: st.just('{"uv":{"emptyDir":{}}}'),
        ann.STATUS_PORT: st.sampled_from(["15020", "15120", "0"]),
    }.get(key, VALUES)


LABELS = st.dictionaries(
    st.sampled_from(
        [
            "app",
            "version",
            "app.kubernetes.io/name",
            ann.TLS_MODE_LABEL,
            ann.CANONICAL_NAME_LABEL,
            ann.CANONICAL_REVISION_LABEL,
            ann.NETWORK_LABEL,
            ann.WORKLOAD_NAME_LABEL,
            "tier",
        ]
    ),
    VALUES,
    max_size=4,
)

PROBE_PORT = st.integers(1, 65535).filter(lambda p: p != 15020)
HTTP_GET = st.fixed_dictionaries(
    {"path": st.just("/").map(str) | st.sampled_from(["/healthz", "/ready"]), "port": PROBE_PORT},
    optional={"scheme": st.sampled_from(["HTTP", "HTTPS"]), "host": st.just("127.0.0.1")},
)
NAMED_GET = st.fixed_dictionaries({"path": st.just("/n"), "port": st.just("http")})
PROBE = st.one_of(
    st.fixed_dictionaries(
        {"httpGet": HTTP_GET | NAMED_GET}, optional={"timeoutSeconds": st.integers(1, 5)}
    ),
    st.just({"exec": {"command": ["true"]}}),
    st.builds(lambda p: {"tcpSocket": {"port": p}}, st.sampled_from([80, "http"])),
    st.builds(lambda p: {"grpc": {"port": p}, "periodSeconds": 3}, PROBE_PORT),
)
HOOK = st.one_of(
    st.builds(lambda p: {"httpGet": {"path": "/stop", "port": p}}, st.sampled_from([80, "http"])),
    st.just({"tcpSocket": {"port": 81}}),
    st.just({"exec": {"command": ["stop"]}}),
)
OVERRIDE = st.fixed_dictionaries(
    {"name": st.just("istio-proxy"), "image": st.sampled_from(["auto", "my/proxy:1"])},
    optional={
        "resources": st.just({"requests": {"cpu": "123m"}}),
        "env": st.just([{"name": "EXTRA", "value": "1"}]),
        "securityContext": st.just({"runAsUser": 1234}),
    },
)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    split = draw(st.integers(0, len(names) - 1))
    init_names, app_names = names[:split], names[split:]

    def container(name: str, probes: bool) -> dict[str, Any]:
        c: dict[str, Any] = {"name": name, "image": f"registry.example/{name}:1"}
        if probes:
            c["ports"] = [{"name": "http", "containerPort": 8080}]
            for field in ("livenessProbe", "readinessProbe", "startupProbe"):
                if draw(st.booleans()):
                    c[field] = draw(PROBE)
            if draw(st.booleans()):
                c["lifecycle"] = {"preStop": draw(HOOK)}
        return c

    spec: dict[str, Any] = {"containers": [container(n, probes=True) for n in app_names]}
    if init_names or draw(st.booleans()):
        # Some init containers are native sidecars (restartable), with probes of their own.
        natives = [draw(st.booleans()) for _ in init_names]
        spec["initContainers"] = [
            {**container(n, probes=native), **({"restartPolicy": "Always"} if native else {})}
            for n, native in zip(init_names, natives, strict=True)
        ]
    if draw(st.integers(0, 3)) == 0:
        spec["containers"].append(draw(OVERRIDE))
    choice = draw(st.sampled_from(["absent", "null", "empty", "some"]))
    if choice != "absent":
        spec["volumes"] = {"null": None, "empty": [], "some": [{"name": "data", "emptyDir": {}}]}[
            choice
        ]
    if draw(st.booleans()):
        spec["serviceAccountName"] = "sa"
    secrets = draw(st.sampled_from(["absent", "null", "empty", "mine", "shared"]))
    if secrets != "absent":
        spec["imagePullSecrets"] = {
            "null": None,
            "empty": [],
            "mine": [{"name": "mine"}],
            "shared": [{"name": "mine"}, {"name": "mesh"}],  # one the settings add, too
        }[secrets]
    pod: dict[str, Any] = {"spec": spec}
    metadata_choice = draw(st.sampled_from(["absent", "null", "some"]))
    if metadata_choice == "null":
        pod["metadata"] = None
    elif metadata_choice == "some":
        metadata: dict[str, Any] = {}
        for section, strategy in (("labels", LABELS), ("annotations", ANNOTATIONS)):
            kind = draw(st.sampled_from(["absent", "null", "some"]))
            if kind != "absent":
                metadata[section] = None if kind == "null" else draw(strategy)
        pod["metadata"] = metadata
    # Metadata first or last: key order must survive too.
    if draw(st.booleans()) and "metadata" in pod:
        pod = {"metadata": pod["metadata"], "spec": spec}
    return pod


SETTINGS = st.builds(
    InjectSettings,
    image=st.sampled_from(["registry.example/meshctl:1", "registry.example/meshctl:2"]),
    revision=st.sampled_from(["default", "canary"]),
    native_sidecar=st.booleans(),
    cni=st.booleans(),
    proxy_uid=st.sampled_from([1337, 2102]),
    # Mesh-wide defaults (Istio's values and meshConfig.defaultConfig).
    network=st.sampled_from(["", "network1"]),
    interception_mode=st.sampled_from(["REDIRECT", "TPROXY", "NONE"]),
    exclude_ip_ranges=st.sampled_from(["", "10.96.0.0/24"]),
    exclude_inbound_ports=st.sampled_from(["", "4,5"]),
    status_port=st.sampled_from([15020, 123, 0]),
    image_pull_secrets=st.sampled_from([(), ("mesh",), ("mesh", "other")]),
    proxy_config=st.sampled_from(
        ["", '{"holdApplicationUntilProxyStarts": true, "proxyMetadata": {"A": "mesh"}}']
    ),
)


def text(value: Any) -> str:
    return json.dumps(value)  # order-sensitive equality


def injected(pod: dict[str, Any], settings_: InjectSettings) -> dict[str, Any]:
    return inject_pod(pod, settings_, workload_name="wl").pod


def container_names(pod: dict[str, Any]) -> set[str]:
    spec = pod["spec"]
    return {c["name"] for field in ("initContainers", "containers") for c in spec.get(field) or ()}


@settings(max_examples=300, deadline=None)
@given(pod=pods(), settings_=SETTINGS)
def test_no_container_of_the_input_is_ever_missing_from_an_output(pod, settings_):
    once = injected(pod, settings_)
    for output in (once, injected(once, settings_), uninject_pod(once)):
        assert container_names(pod) <= container_names(output)


@settings(max_examples=300, deadline=None)
@given(pod=pods(), settings_=SETTINGS)
def test_inject_is_idempotent(pod, settings_):
    once = injected(pod, settings_)
    assert text(injected(once, settings_)) == text(once)


@settings(max_examples=300, deadline=None)
@given(pod=pods(), settings_=SETTINGS)
def test_uninject_restores_the_pod_exactly(pod, settings_):
    assert text(uninject_pod(injected(pod, settings_))) == text(pod)


@settings(max_examples=150, deadline=None)
@given(pod=pods(), first=SETTINGS, second=SETTINGS)
def test_reinjecting_with_other_settings_equals_injecting_once(pod, first, second):
    assert text(injected(injected(pod, first), second)) == text(injected(pod, second))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=pods(), settings_=SETTINGS)
def test_the_webhook_patch_gives_the_same_pod(pod, settings_):
    # Through JSON, as the API server sends it (generated pods may share one probe object).
    obj = json.loads(json.dumps({"apiVersion": "v1", "kind": "Pod", **pod}))
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u", "namespace": "ns", "object": obj},
    }
    answer = admission.handle(
        admission.Request("POST", "/inject", "application/json", json.dumps(review).encode()),
        settings_,
    )
    assert answer.status == 200
    response = json.loads(answer.body)["response"]
    patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    expected = inject_pod(obj, settings_, workload_name="", namespace="ns").pod
    assert jsonpatch.apply_patch(obj, patch) == expected


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    request=st.dictionaries(
        st.sampled_from(["uid", "kind", "operation", "object", "namespace", "subResource"]),
        JSON,
    ),
    obj=st.fixed_dictionaries({}, optional={"metadata": JSON, "spec": JSON}),
)
def test_the_handler_answers_any_admission_review_without_raising(request, obj):
    request.setdefault("object", obj)
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    answer = admission.handle(
        admission.Request("POST", "/inject", "application/json", json.dumps(body).encode()),
        InjectSettings(),
    )
    assert answer.status in {200, 400}
