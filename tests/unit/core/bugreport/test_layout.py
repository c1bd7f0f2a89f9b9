"""Roles of pods, what is collected from each, and the size budget of the archive."""

from __future__ import annotations

import importlib

import pytest

from meshctl.core.bugreport import layout
from meshctl.core.bugreport.layout import Member, Role, fit


def pod(name: str, labels: dict[str, str] | None = None, containers=("app",), init=()):
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": labels or {}},
        "spec": {
            "containers": [{"name": c} for c in containers],
            "initContainers": [{"name": c} for c in init],
        },
    }


def test_roles_come_from_the_labels_install_gives_and_the_injected_container():
    assert (
        layout.role_of(pod("cp", {layout.NAME_LABEL: "meshctl-controlplane"})) is Role.CONTROL_PLANE
    )
    assert (
        layout.role_of(pod("cp", {layout.NAME_LABEL: "meshctl-controlplane-canary"}))
        is Role.CONTROL_PLANE
    )
    assert layout.role_of(pod("z", {layout.NAME_LABEL: "meshctl-ztunnel"})) is Role.NODE_PROXY
    assert layout.role_of(pod("c", {layout.NAME_LABEL: "meshctl-cni-node"})) is Role.CNI_AGENT
    assert layout.role_of(pod("g", {layout.GATEWAY_MANAGED_LABEL: "true"})) is Role.GATEWAY
    # A native sidecar: the injected proxy is a restartable init container.
    assert layout.role_of(pod("w", init=("istio-proxy",))) is Role.SIDECAR
    assert layout.role_of(pod("w")) is Role.OTHER


@pytest.mark.parametrize(
    ("module", "constant", "ours"),
    [
        ("meshctl_plugins.ztunnel.manifest", "NAME", layout.NODE_PROXY_NAME),
        ("meshctl_plugins.cni.manifest", "NAME", layout.CNI_AGENT_NAME),
        ("meshctl_plugins.cni.manifest", "READINESS_PORT", layout.CNI_STATUS_PORT),
        ("meshctl_plugins.gateway.component", "NAME", layout.GATEWAY_NAME),
    ],
)
def test_the_names_the_report_looks_for_are_the_ones_install_gives(module, constant, ours):
    assert getattr(importlib.import_module(module), constant) == ours


def test_a_workloads_own_containers_are_not_logged_only_the_injected_ones():
    workload = pod("w", containers=("app", "istio-proxy"), init=("istio-validation",))
    assert layout.logged_containers(workload, Role.SIDECAR) == ["istio-validation", "istio-proxy"]
    node_proxy = pod("z", {layout.NAME_LABEL: "meshctl-ztunnel"}, containers=("ztunnel",))
    assert layout.logged_containers(node_proxy, Role.NODE_PROXY) == ["ztunnel"]
    assert layout.logged_containers(pod("x"), Role.OTHER) == []
    assert [r for r in Role if layout.has_admin(r)] == [Role.NODE_PROXY, Role.GATEWAY, Role.SIDECAR]


def test_member_names_lay_the_archive_out_by_kind_namespace_and_pod():
    assert layout.log_member("ns", "p", "c") == "logs/ns/p/c.log"
    assert layout.log_member("ns", "p", "c", previous=True) == "logs/ns/p/c.previous.log"
    assert layout.dump_member("ns", "p") == "proxies/ns/p/config_dump.json"
    assert layout.conflist_member("node-1") == "cni/node-1/conflist.json"
    assert layout.objects_member(None, "Node") == "objects/_cluster/Node.yaml"


def test_everything_fits_under_the_cap_in_priority_order():
    members = [Member("b", b"x" * 10, 5), Member("a", b"y" * 10, 1), Member("c", b"z", 5)]
    fitted = fit(members, 100)
    assert [m.name for m in fitted.members] == ["a", "b", "c"]
    assert fitted.cut == []
    assert fitted.left_out == []


def test_over_the_cap_the_lowest_priority_is_cut_then_left_out_and_both_named():
    big = 20_000
    members = [
        Member("objects", b"o" * big, 1),
        Member("log-1", b"l" * big, 7),
        Member("log-2", b"m" * big, 7),
    ]
    fitted = fit(members, big + 10_000)
    assert [m.name for m in fitted.members] == ["objects", "log-1"]
    assert sum(len(m.data) for m in fitted.members) == big + 10_000
    assert fitted.members[1].data.endswith(b"not kept\n")
    kept = fitted.members[1].data.count(b"l")
    assert 9_900 < kept < 10_000  # what was left, less the note saying so
    assert fitted.cut == [f"log-1: kept {kept} of {big} bytes"]
    assert fitted.left_out == [f"log-2 ({big} bytes)"]


def test_a_member_that_would_keep_only_a_sliver_is_left_out_not_cut():
    fitted = fit([Member("a", b"a" * 100, 1), Member("b", b"b" * 10_000, 2)], 100 + 1000)
    assert [m.name for m in fitted.members] == ["a"]
    assert fitted.left_out == ["b (10000 bytes)"]


def test_restart_counts_of_init_and_app_containers():
    restarted = {
        "status": {
            "initContainerStatuses": [{"name": "istio-proxy", "restartCount": 2}],
            "containerStatuses": [{"name": "app", "restartCount": 0}],
        }
    }
    assert layout.restarts(restarted) == {"istio-proxy": 2}
