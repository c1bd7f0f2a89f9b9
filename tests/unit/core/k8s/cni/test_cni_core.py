"""CNI core: CNI_ARGS, pod decisions, and rules equal to what the init container applies."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from meshctl.core.capture import render
from meshctl.core.capture.plan import plan
from meshctl.core.capture.settings import settings_from_args
from meshctl.core.k8s.cni import spec
from meshctl.core.k8s.cni.pod import decide
from meshctl.core.k8s.inject.errors import InvalidAnnotationError
from meshctl.core.k8s.inject.interception import capture_args
from meshctl.core.k8s.inject.pipeline import inject_pod
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.errors import ConfigError
from tests.harness.cli import run_meshctl

INJECT = Path(__file__).parents[4] / "testdata" / "inject"
_key = st.text(
    st.characters(blacklist_characters=";=", min_codepoint=33, max_codepoint=126), min_size=1
)
_value = st.text(st.characters(blacklist_characters=";", min_codepoint=32, max_codepoint=126))


@given(st.dictionaries(_key, _value, max_size=6))
def test_cni_args_round_trip(pairs: dict[str, str]):
    text = ";".join(f"{k}={v}" for k, v in pairs.items())
    assert spec.parse_cni_args(text) == pairs


def cni_pod() -> dict:
    template = yaml.safe_load((INJECT / "cni-mode.yaml.injected").read_text())["spec"]["template"]
    return {"metadata": template["metadata"], "spec": template["spec"]}


def test_cni_mode_pod_is_captured_with_its_annotations_and_proxy_ids():
    pod = cni_pod()
    (proxy,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "istio-proxy"]
    proxy["securityContext"]["runAsUser"] = 2000
    decision = decide(pod)
    assert decision.capture
    assert decision.args == tuple(
        capture_args(pod["metadata"]["annotations"], proxy_uid=2000, proxy_gid=1337)
    )
    assert "-x" in decision.args
    assert "169.254.169.254/32" in decision.args


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda p: p["metadata"]["annotations"].pop("sidecar.istio.io/status"), "not injected"),
        (
            lambda p: p["metadata"]["labels"].update({"sidecar.istio.io/inject": "false"}),
            "opted out",
        ),
        (lambda p: p["spec"].update({"hostNetwork": True}), "hostNetwork"),
        (lambda p: p["spec"]["initContainers"].clear(), "no istio-proxy container"),
        (
            lambda p: p["metadata"]["annotations"].update(
                {"sidecar.istio.io/interceptionMode": "NONE"}
            ),
            "NONE",
        ),
    ],
)
def test_pods_that_must_not_be_captured(change, reason: str):
    pod = cni_pod()
    change(pod)
    decision = decide(pod)
    assert not decision.capture
    assert reason in decision.reason


def test_classic_injection_is_left_to_its_init_container():
    pod = yaml.safe_load((INJECT / "pod.yaml.injected").read_text())
    decision = decide(pod)
    assert not decision.capture
    assert "istio-init" in decision.reason


def test_bad_annotation_is_an_error_not_a_silent_skip():
    pod = cni_pod()
    pod["metadata"]["annotations"]["traffic.sidecar.istio.io/excludeOutboundIPRanges"] = "10.0/99"
    with pytest.raises(InvalidAnnotationError):
        decide(pod)


@pytest.mark.parametrize("name", ["cni-mode.yaml", "traffic-annotations.yaml", "tproxy.yaml"])
def test_cni_rules_equal_what_the_init_container_command_renders(name: str):
    doc = yaml.safe_load((INJECT / name).read_text())
    template = doc["spec"]["template"] if "template" in doc.get("spec", {}) else doc
    pod = {"metadata": copy.deepcopy(template["metadata"]), "spec": template["spec"]}
    injected = inject_pod(pod, InjectSettings(cni=True), workload_name="w").pod
    decision = decide(injected)
    assert decision.capture
    ours = plan(settings_from_args(decision.args))
    text = "".join(render.render(r) for r in ours.rulesets)
    # The init container's path: the `meshctl iptables` CLI parsing the same arguments.
    cli = run_meshctl("iptables", "render", *decision.args, env={"HOME": "/nonexistent"})
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.split("# policy routing")[0] == text


def test_unknown_or_valueless_capture_flag_is_refused():
    with pytest.raises(ConfigError, match="unknown capture flag"):
        settings_from_args(["--frobnicate", "1"])
    with pytest.raises(ConfigError, match="needs a value"):
        settings_from_args(["-p"])
    assert settings_from_args(["--redirect-dns", "--envoy-port=15011"]).proxy_port == 15011
