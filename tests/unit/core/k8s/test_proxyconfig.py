"""proxy.istio.io/config and PROXY_CONFIG: the fields meshctl acts on, refusals, warnings."""

from __future__ import annotations

import json

import pytest

from meshctl.core.k8s import proxyconfig
from meshctl.core.k8s.inject.errors import InvalidAnnotationError
from meshctl.core.k8s.inject.pipeline import inject_pod, uninject_pod
from meshctl.core.k8s.inject.settings import InjectSettings

SETTINGS = InjectSettings(image="registry.example/meshctl:test")


def pod(config: str, **annotations: str) -> dict:
    return {
        "metadata": {"annotations": {proxyconfig.ANNOTATION: config, **annotations}},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]},
    }


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value") for e in container.get("env") or ()}


def test_yaml_and_json_read_the_same():
    yaml_text = "concurrency: 2\nterminationDrainDuration: 30s\nproxyMetadata: {A: b}\n"
    json_text = '{"concurrency": 2, "terminationDrainDuration": "30s", "proxyMetadata": {"A": "b"}}'
    assert proxyconfig.parse(yaml_text) == proxyconfig.parse(json_text)


def test_the_proxy_gets_its_settings_from_the_injected_env():
    config = proxyconfig.parse('{"terminationDrainDuration": "20s", "concurrency": 0}')
    again = proxyconfig.parse(config.to_env(), source=proxyconfig.ENV)
    assert again.ztunnel_settings(cpus=4) == {"drain-deadline": "20s", "workers": 4}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1]", "mapping"),
        ("concurrency: many", "concurrency must be a whole number"),
        ("terminationDrainDuration: soon", "duration"),
        ("holdApplicationUntilProxyStarts: maybe", "true or false"),
        ("proxyMetadata: {'BAD NAME': x}", "env names"),
        ("a: [", "not YAML"),
    ],
)
def test_bad_values_are_refused_naming_the_field(text, message):
    with pytest.raises(
        InvalidAnnotationError, match=r"for annotation 'proxy\.istio\.io/config'"
    ) as e:
        inject_pod(pod(text), SETTINGS, workload_name="app")
    assert message in (e.value.hint or "")


def test_metadata_is_env_of_the_proxy_and_the_init_container_and_uninject_restores():
    original = pod("proxyMetadata: {FOO: bar}")
    result = inject_pod(original, SETTINGS, workload_name="app").pod
    init, proxy = result["spec"]["initContainers"]
    assert env_of(proxy)["FOO"] == env_of(init)["FOO"] == "bar"
    assert json.loads(env_of(proxy)["PROXY_CONFIG"]) == {"proxyMetadata": {"FOO": "bar"}}
    assert uninject_pod(result) == original


def test_holding_the_app_puts_a_classic_proxy_first_with_a_wait_hook():
    original = pod(
        "holdApplicationUntilProxyStarts: true", **{"sidecar.istio.io/nativeSidecar": "false"}
    )
    result = inject_pod(original, SETTINGS, workload_name="app").pod
    first = result["spec"]["containers"][0]
    assert first["name"] == "istio-proxy"
    assert first["lifecycle"]["postStart"]["exec"]["command"] == ["meshctl", "ztunnel", "wait"]
    assert result["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] == "app"
    assert uninject_pod(result) == original


def test_fields_without_effect_are_warnings():
    outcome = inject_pod(pod("discoveryAddress: x:1\nstatusPort: 1\n"), SETTINGS, workload_name="a")
    assert [w.split("'")[1] for w in outcome.warnings] == ["discoveryAddress", "statusPort"]
