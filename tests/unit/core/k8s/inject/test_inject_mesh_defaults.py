"""Mesh-wide injection settings (Istio's values and meshConfig.defaultConfig), the named
templates meshctl refuses, TPROXY's root proxy, OpenShift DeploymentConfigs and the workload
name label."""

from __future__ import annotations

import json
from typing import Any

import pytest

from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject.documents import inject_text
from meshctl.core.k8s.inject.errors import InjectError, InvalidAnnotationError
from meshctl.core.k8s.inject.pipeline import inject_pod, uninject_pod
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.errors import ConfigError


def pod(**annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "labels": {"app": "web"}, "annotations": dict(annotations)},
        "spec": {"containers": [{"name": "web", "image": "web:1"}]},
    }


def inject(p: dict[str, Any], **settings: Any) -> dict[str, Any]:
    return inject_pod(p, InjectSettings(image="x", **settings), workload_name="web").pod


def container(result: dict[str, Any], name: str) -> dict[str, Any]:
    spec = result["spec"]
    found = [c for c in [*spec.get("initContainers", ()), *spec["containers"]] if c["name"] == name]
    assert found, name
    return found[0]


def env(result: dict[str, Any], name: str = "istio-proxy") -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container(result, name).get("env", ())}


def args(result: dict[str, Any]) -> dict[str, str]:
    raw = container(result, "istio-init")["args"][2:]
    return dict(zip(raw[::2], raw[1::2], strict=True))


def test_the_network_setting_names_the_proxys_network_and_labels_the_pod():
    result = inject(pod(), network="network1")
    assert env(result)["ISTIO_META_NETWORK"] == "network1"
    assert result["metadata"]["labels"][ann.NETWORK_LABEL] == "network1"
    assert uninject_pod(result) == pod()
    assert "ISTIO_META_NETWORK" not in env(inject(pod()))


def test_a_network_label_the_user_set_stays():
    p = pod()
    p["metadata"]["labels"][ann.NETWORK_LABEL] = "mine"
    assert inject(p, network="network1")["metadata"]["labels"][ann.NETWORK_LABEL] == "mine"


def test_mesh_wide_tproxy_captures_in_tproxy_mode_with_a_root_proxy():
    result = inject(pod(), interception_mode="TPROXY")
    assert args(result)["-m"] == "TPROXY"
    security = container(result, "istio-proxy")["securityContext"]
    # The kubelet makes NET_ADMIN effective for uid 0 only; the capture exempts the proxy's gid.
    assert security["runAsUser"] == 0
    assert security["runAsNonRoot"] is False
    assert security["runAsGroup"] == 1337
    assert security["capabilities"]["add"] == ["NET_ADMIN"]
    assert args(result)["-g"] == "1337"


def test_a_pods_interception_annotation_wins_over_the_mesh_wide_mode():
    result = inject(pod(**{ann.INTERCEPTION_MODE: "REDIRECT"}), interception_mode="TPROXY")
    assert args(result)["-m"] == "REDIRECT"
    assert container(result, "istio-proxy")["securityContext"]["runAsUser"] == 1337


def test_mesh_wide_capture_ranges_and_ports_become_the_init_containers_flags():
    result = inject(
        pod(),
        include_ip_ranges="10.96.0.1/24",
        exclude_ip_ranges="10.96.0.2/24",
        exclude_inbound_ports="4,5",
        include_outbound_ports="80",
        exclude_outbound_ports="9000",
    )
    flags = args(result)
    assert flags["-i"] == "10.96.0.0/24"
    assert flags["-x"] == "10.96.0.0/24"
    assert flags["-d"] == "15090,15021,15020,4,5"
    assert flags["-q"] == "80"
    assert flags["-o"] == "9000"
    # The pod's own annotation replaces the mesh-wide list, as Istio's template does.
    own = inject(pod(**{ann.EXCLUDE_INBOUND_PORTS: "7"}), exclude_inbound_ports="4,5")
    assert args(own)["-d"] == "15090,15021,15020,7"


def test_mesh_wide_capture_settings_reach_the_cni_annotations():
    result = inject(pod(), cni=True, exclude_ip_ranges="10.0.0.0/8")
    annotations = result["metadata"]["annotations"]
    assert annotations[ann.EXCLUDE_OUTBOUND_IP_RANGES] == "10.0.0.0/8"
    assert uninject_pod(result) == pod()


def test_the_mesh_wide_status_port_and_readiness_settings_shape_the_proxy():
    result = inject(
        pod(),
        status_port=123,
        readiness_initial_delay_seconds=100,
        readiness_period_seconds=200,
        readiness_failure_threshold=300,
    )
    proxy = container(result, "istio-proxy")
    ready = proxy["readinessProbe"]
    assert (ready["initialDelaySeconds"], ready["periodSeconds"], ready["failureThreshold"]) == (
        100,
        200,
        300,
    )
    assert "123" in args(result)["-d"].split(",")
    assert json.loads(env(result)["PROXY_CONFIG"])["statusPort"] == 123
    assert result["metadata"]["annotations"]["prometheus.io/port"] == "123"


def test_status_port_zero_turns_probes_of_the_proxy_and_probe_rewriting_off():
    p = pod()
    p["spec"]["containers"][0]["readinessProbe"] = {"httpGet": {"path": "/r", "port": 8080}}
    result = inject(p, status_port=0)
    assert "readinessProbe" not in container(result, "istio-proxy")
    assert container(result, "web")["readinessProbe"] == {"httpGet": {"path": "/r", "port": 8080}}


def test_mesh_image_pull_secrets_go_first_and_only_the_added_ones_are_recorded():
    p = pod()
    p["spec"]["imagePullSecrets"] = [{"name": "mine"}, {"name": "shared"}]
    result = inject(p, image_pull_secrets=("shared", "mesh"))
    assert result["spec"]["imagePullSecrets"] == [
        {"name": "mesh"},
        {"name": "mine"},
        {"name": "shared"},
    ]
    status = json.loads(result["metadata"]["annotations"][ann.STATUS])
    assert status["imagePullSecrets"] == ["mesh"]
    assert uninject_pod(result) == p
    settings = InjectSettings(image="x", image_pull_secrets=("shared", "mesh"))
    again = inject_pod(result, settings, workload_name="web")
    assert again.pod == result
    bare = inject(pod(), image_pull_secrets=("mesh",))
    assert uninject_pod(bare) == pod()  # the field did not exist: it goes again


def test_an_empty_resource_setting_means_no_such_request_or_limit():
    result = inject(
        pod(), proxy_cpu="", proxy_cpu_limit="", proxy_memory="150Mi", proxy_ephemeral_storage="1Gi"
    )
    assert container(result, "istio-proxy")["resources"] == {
        "requests": {"memory": "150Mi", "ephemeral-storage": "1Gi"},
        "limits": {"memory": "1Gi"},
    }
    assert (
        container(result, "istio-init")["resources"]
        == container(result, "istio-proxy")["resources"]
    )


def test_a_mesh_wide_proxy_config_is_merged_under_the_pods_field_by_field():
    mesh = json.dumps(
        {
            "holdApplicationUntilProxyStarts": True,
            "terminationDrainDuration": "9s",
            "proxyMetadata": {"B": "mesh", "C": "mesh"},
        }
    )
    own = json.dumps({"terminationDrainDuration": "3s", "proxyMetadata": {"C": "pod", "A": "pod"}})
    result = inject(pod(**{"proxy.istio.io/config": own}), proxy_config=mesh, native_sidecar=False)
    config = json.loads(env(result)["PROXY_CONFIG"])
    assert config["holdApplicationUntilProxyStarts"] is True
    assert config["terminationDrainDuration"] == "3s"
    assert config["proxyMetadata"] == {"A": "pod", "B": "mesh", "C": "pod"}
    # proxyMetadata is env of the proxy and of the init container, in name order (Istio's).
    names = [e["name"] for e in container(result, "istio-init")["env"]]
    assert names == ["A", "B", "C"]
    # hold: the classic proxy goes first, with its wait hook.
    assert result["spec"]["containers"][0]["name"] == "istio-proxy"
    assert "postStart" in result["spec"]["containers"][0]["lifecycle"]


def test_a_mesh_wide_proxy_config_field_the_proxy_cannot_act_on_is_refused():
    with pytest.raises(ConfigError, match="proxy-config") as caught:
        InjectSettings(proxy_config="drainDuration: 23s")
    assert "drainDuration" in str(caught.value.hint)
    with pytest.raises(ConfigError, match="proxy-config") as caught:
        InjectSettings(proxy_config="statusPort: 123")
    assert "status-port" in str(caught.value.hint)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"interception_mode": "BOGUS"}, "interception-mode"),
        ({"exclude_ip_ranges": "not-a-cidr"}, "exclude-ip-ranges"),
        ({"exclude_inbound_ports": "99999"}, "exclude-inbound-ports"),
        ({"network": "a b"}, "network"),
        ({"image_pull_secrets": ("a b",)}, "image-pull-secrets"),
        ({"status_port": 70000}, "status-port"),
        ({"readiness_period_seconds": 0}, "readiness-period-seconds"),
        ({"proxy_ephemeral_storage": "2Gi", "proxy_ephemeral_storage_limit": "1Gi"}, "ephemeral"),
    ],
)
def test_a_bad_mesh_wide_setting_is_refused_naming_the_setting(values, named):
    with pytest.raises(ConfigError, match=named):
        InjectSettings(**values)


@pytest.mark.parametrize(
    ("templates", "why"),
    [
        ("sidecar,spire", "SPIFFE Workload API"),
        ("gateway,spire", "SPIFFE Workload API"),
        ("grpc-agent", "proxyless gRPC"),
        ("grpc-simple", "proxyless gRPC"),
    ],
)
def test_istio_templates_meshctl_cannot_honour_are_refused_with_the_reason(templates, why):
    with pytest.raises(InjectError, match=why) as caught:
        inject(pod(**{ann.TEMPLATES: templates}))
    assert not isinstance(caught.value, InvalidAnnotationError)
    assert caught.value.hint
    assert "\n" not in str(caught.value)


DEPLOYMENT_CONFIG = """\
apiVersion: {api}
kind: DeploymentConfig
metadata:
  name: hello
spec:
  template:
    metadata:
      labels:
        app: hello
        service.istio.io/workload-name: named-workload
    spec:
      containers:
      - name: hello
        image: hello:1
"""


@pytest.mark.parametrize("api", ["apps.openshift.io/v1", "v1"])
def test_an_openshift_deployment_config_is_injected(api):
    out, _ = inject_text(DEPLOYMENT_CONFIG.format(api=api), "dc.yaml", InjectSettings(image="x"))
    assert "istio-proxy" in out
    assert "value: named-workload" in out  # ISTIO_META_WORKLOAD_NAME from Istio's label


def test_a_deployment_config_of_another_group_passes_through():
    text = DEPLOYMENT_CONFIG.format(api="example.com/v1")
    out, _ = inject_text(text, "dc.yaml", InjectSettings(image="x"))
    assert "istio-proxy" not in out
