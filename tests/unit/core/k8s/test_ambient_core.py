"""Ambient decisions: Istio's enrollment rule, a pod's capture arguments, the node's probe rules."""

from __future__ import annotations

import pytest

from meshctl.core.capture import hostprobe
from meshctl.core.capture.parse import parse
from meshctl.core.capture.render import render
from meshctl.core.capture.rules import Family
from meshctl.core.capture.settings import settings_from_args
from meshctl.core.k8s import ambient
from meshctl.core.k8s.inject.errors import InvalidAnnotationError

AMBIENT = {ambient.DATAPLANE_MODE: ambient.MODE_AMBIENT}
NONE = {ambient.DATAPLANE_MODE: ambient.MODE_NONE}


def pod(labels=None, *, annotations=None, **spec) -> dict:
    return {
        "metadata": {
            "name": "p",
            "namespace": "shop",
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": {"containers": [{"name": "app"}], **spec},
        "status": {"phase": "Running"},
    }


def ns(labels=None) -> dict:
    return {"metadata": {"name": "shop", "labels": labels or {}}}


@pytest.mark.parametrize(
    ("the_pod", "namespace", "enrolled", "why"),
    [
        (pod(), ns(AMBIENT), True, "namespace label"),
        (pod(AMBIENT), ns(), True, "pod label"),
        (pod(AMBIENT), None, True, "pod label"),  # the pod's label needs no namespace
        (pod(NONE), ns(AMBIENT), False, "opted out"),
        (pod(), ns(), False, "no istio.io/dataplane-mode"),
        (pod(), None, False, "namespace unknown"),
        (pod(AMBIENT, hostNetwork=True), ns(), False, "hostNetwork"),
        (pod(annotations={"sidecar.istio.io/status": "{}"}), ns(AMBIENT), False, "sidecar"),
        (
            {**pod(), "spec": {"containers": [{"name": "app"}, {"name": "istio-proxy"}]}},
            ns(AMBIENT),
            False,
            "sidecar",
        ),
        ({**pod(AMBIENT), "status": {"phase": "Succeeded"}}, ns(), False, "succeeded"),
        (
            {**pod(AMBIENT), "metadata": {**pod()["metadata"], "deletionTimestamp": "x"}},
            ns(),
            False,
            "being deleted",
        ),
    ],
)
def test_enrollment_follows_istios_labels(the_pod, namespace, enrolled, why):
    decision = ambient.enrollment(the_pod, namespace)
    assert decision.enrolled is enrolled
    assert why in decision.reason


def test_excluded_namespaces_are_never_enrolled():
    decision = ambient.enrollment(pod(AMBIENT), ns(AMBIENT), excluded_namespaces=("shop",))
    assert not decision.enrolled


def test_capture_settings_are_what_iptables_apply_builds_from_the_same_flags():
    ambient_mode = ["--mode", "ambient"]
    assert ambient.capture_settings(pod()) == settings_from_args(ambient_mode)
    assert ambient.capture_settings(pod(), dns=True) == settings_from_args(
        [*ambient_mode, "--redirect-dns", "--capture-all-dns"]
    )
    assert ambient.capture_settings(pod(), ipv6=True) == settings_from_args(
        [*ambient_mode, "--dual-stack"]
    )
    virt = ambient.capture_settings(pod(annotations={ambient.VIRTUAL_INTERFACES: "tun0, tun1"}))
    assert virt == settings_from_args([*ambient_mode, "--kube-virt-interfaces", "tun0,tun1"])
    assert virt.kube_virt_interfaces == ("tun0", "tun1")
    asks = pod(annotations={ambient.DNS_CAPTURE: "true"})
    assert ambient.dns_requested(asks, default=False)
    assert not ambient.dns_requested(pod(annotations={ambient.DNS_CAPTURE: "false"}), default=True)
    assert ambient.dns_requested(pod(), default=True)


def test_a_virtual_interfaces_annotation_naming_no_interface_is_refused_naming_it():
    bad = pod(annotations={ambient.VIRTUAL_INTERFACES: "tun0, not an/interface"})
    with pytest.raises(InvalidAnnotationError) as caught:
        ambient.capture_settings(bad)
    assert ambient.VIRTUAL_INTERFACES in caught.value.message
    assert "interface name" in (caught.value.hint or "")


def test_pod_ips_from_status():
    assert ambient.pod_ips({"status": {"podIPs": [{"ip": "10.1.0.5"}, {"ip": "fd00::5"}]}}) == [
        "10.1.0.5",
        "fd00::5",
    ]
    assert ambient.pod_ips({"status": {"podIP": "10.1.0.5"}}) == ["10.1.0.5"]
    assert ambient.pod_ips({}) == []


def test_host_probe_rules_snat_node_traffic_to_enrolled_pods_and_read_back_equal():
    rules = hostprobe.build(["10.1.0.6", "10.1.0.5", "10.1.0.5", "fd00::5"], Family.IPV4)
    text = render(rules)
    assert "-A POSTROUTING -j MESH_POSTRT" in text
    lines = [ln for ln in text.splitlines() if ln.startswith("-A MESH_POSTRT")]
    snat = "-p tcp -m owner --socket-exists -j SNAT --to-source 169.254.7.127"
    assert lines == [
        f"-A MESH_POSTRT -d 10.1.0.5/32 {snat}",
        f"-A MESH_POSTRT -d 10.1.0.6/32 {snat}",
    ]
    # What iptables-save prints parses back to the same rules (check and clean compare them).
    assert parse(text, Family.IPV4).ours() == rules.ours()
    v6 = render(hostprobe.build(["fd00::5"], Family.IPV6))
    assert "-d fd00::5/128" in v6
    assert "fd16:9254:7127:1337:ffff:ffff:ffff:ffff" in v6
    assert hostprobe.build([], Family.IPV4).is_empty()


def test_host_probe_scope_ignores_everything_else_in_the_nodes_tables():
    node = parse(
        "*nat\n:POSTROUTING ACCEPT [0:0]\n:KUBE-POSTROUTING - [0:0]\n:MESH_OTHER - [0:0]\n"
        ":MESH_POSTRT - [0:0]\n-A POSTROUTING -j KUBE-POSTROUTING\n-A POSTROUTING -j MESH_OTHER\n"
        "-A POSTROUTING -j MESH_POSTRT\n-A MESH_POSTRT -d 10.1.0.5/32 -p tcp -m owner "
        "--socket-exists -j SNAT --to-source 169.254.7.127\nCOMMIT\n",
        Family.IPV4,
    )
    mine = hostprobe.scoped(node.ours())
    assert mine == hostprobe.build(["10.1.0.5"], Family.IPV4)


AGENT_DS = {"kind": "DaemonSet", "name": "meshctl-cni-node", "uid": "ds-1", "controller": True}


def _agent_pod(*owners: dict) -> dict:
    return {"metadata": {"name": "agent-x", "ownerReferences": list(owners)}}


def _daemonset(uid: str = "ds-1", *, deleting: bool = False) -> dict:
    meta = {"name": "meshctl-cni-node", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    return {"metadata": meta}


@pytest.mark.parametrize(
    ("own", "daemonset", "mode", "release", "why"),
    [
        (_agent_pod(AGENT_DS), None, "auto", True, "is gone"),
        (_agent_pod(AGENT_DS), _daemonset(deleting=True), "auto", True, "being deleted"),
        (_agent_pod(AGENT_DS), _daemonset(), "auto", False, "upgrade or a restart"),
        (_agent_pod(AGENT_DS), _daemonset("ds-2"), "auto", False, "reinstall"),
        (_agent_pod(), None, "auto", False, "no DaemonSet owner"),
        (None, None, "auto", False, "cannot be ruled out"),
        (None, None, "always", True, "told to release"),
        (_agent_pod(AGENT_DS), None, "never", False, "told to keep"),
    ],
)
def test_a_stopping_agent_releases_its_pods_only_when_its_daemonset_goes(
    own, daemonset, mode, release, why
):
    plan = ambient.exit_plan(own, daemonset, mode=mode)
    assert plan.release is release
    assert why in plan.reason


def _placed(name: str, node: str, redirection: str | None, phase: str = "Running") -> dict:
    annotations = {ambient.REDIRECTION: redirection} if redirection else {}
    return {
        "metadata": {"name": name, "namespace": "shop", "annotations": annotations},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


def test_pods_left_redirected_are_those_annotated_on_nodes_without_an_agent():
    pods = [
        _placed("a", "n1", "enabled"),
        _placed("b", "n2", "enabled"),
        _placed("c", "n2", "pending"),
        _placed("d", "n2", None),
        _placed("e", "n2", "enabled", phase="Succeeded"),
    ]
    assert ambient.left_captured(pods, ["n1"]) == ["shop/b (node n2)", "shop/c (node n2)"]
    assert ambient.left_captured(pods, ["n1", "n2"]) == []


def _proxy(name: str, created: str, *, phase: str = "Running", deleting: bool = False) -> dict:
    meta = {"name": name, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


def test_the_serving_node_proxy_is_the_new_one_during_a_handover():
    old = _proxy("old", "2026-01-01T00:00:00Z", deleting=True)
    new = _proxy("new", "2026-01-01T00:00:30Z")
    starting = _proxy("next", "2026-01-01T00:00:40Z", phase="Pending")
    assert ambient.serving_node_proxy([old, new, starting]) is new
    assert ambient.serving_node_proxy([new, old]) is new
    assert ambient.serving_node_proxy([old, starting]) is old  # still the only one serving
    assert ambient.serving_node_proxy([starting]) is None
