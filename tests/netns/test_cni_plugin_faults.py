"""The CNI plugin (served by its node agent) against a real pod namespace: bad input and a dead
API server install nothing."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshctl.core.k8s.cni import spec
from tests.harness.cni import NodeAgent, exec_plugin, install_launcher, mesh_rules, network_config
from tests.harness.kube import free_port

pytestmark = pytest.mark.netns


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[NodeAgent]:
    """The node agent's request endpoint, serving ``tmp_path/run`` (the configs' run dir)."""
    with NodeAgent(tmp_path / "run") as running:
        yield running


@pytest.fixture
def plugin(tmp_path: Path, agent: NodeAgent) -> Path:
    return install_launcher(tmp_path / "bin", agent.run_dir)


@pytest.mark.parametrize(
    ("stdin", "env", "code"),
    [
        ("{not json", {}, spec.DECODE_FAILURE),
        ({"cniVersion": "1.0.0", "name": "n", "type": "meshctl-cni"}, {}, spec.INVALID_CONFIG),
        (network_config("0.1.0"), {}, spec.INCOMPATIBLE_VERSION),
        (network_config(), {"CNI_ARGS": ""}, spec.INVALID_ENVIRONMENT),
    ],
)
def test_bad_input_installs_no_rules_in_the_pod_netns(plugin, netns, stdin, env, code):
    run = exec_plugin(plugin, "ADD", stdin, netns=netns.path, env=env)
    assert (run.returncode, run.json["code"]) == (1, code)
    assert mesh_rules(netns.name) == []


def test_unreachable_api_server_fails_add_closed(plugin: Path, netns, tmp_path: Path):
    # A loopback port nobody listens on: connections are refused at once, as for a stopped
    # API server; the plugin must not let the pod start uncaptured.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        textwrap.dedent(f"""
        apiVersion: v1
        kind: Config
        clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{free_port()}"}}}}]
        users: [{{name: u, user: {{token: t}}}}]
        contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
        current-context: x
        """)
    )
    conf = network_config(
        kubeconfig=str(kubeconfig), run_dir=str(tmp_path / "run"), pod_lookup_timeout=1
    )
    started = time.monotonic()
    run = exec_plugin(plugin, "ADD", conf, netns=netns.path, pod=("shop", "cart-1"))
    elapsed = time.monotonic() - started

    assert run.returncode == 1
    error = run.json
    assert error["code"] == spec.TRY_AGAIN_LATER
    assert "cannot read pod shop/cart-1" in error["msg"]
    assert "fail closed" in error["msg"]
    assert "unreachable" in error["details"]
    assert mesh_rules(netns.name) == []
    assert 0.9 < elapsed < 10, "retries briefly (pod_lookup_timeout), then gives up"
    assert "fail closed" in (tmp_path / "run" / "meshctl-cni.log").read_text()


def test_missing_kubeconfig_fails_add_closed_too(plugin: Path, netns, tmp_path: Path):
    conf = network_config(run_dir=str(tmp_path / "run"))
    run = exec_plugin(plugin, "ADD", conf, netns=netns.path, pod=("shop", "cart-1"))
    assert (run.returncode, run.json["code"]) == (1, spec.TRY_AGAIN_LATER)
    assert "meshctl cni install" in run.json["details"]
    assert mesh_rules(netns.name) == []


INJECTED_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "cart-1",
        "namespace": "shop",
        "annotations": {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'},
    },
    "spec": {"nodeName": "laptop", "containers": [{"name": "app"}, {"name": "istio-proxy"}]},
}


def test_without_an_api_server_the_pod_comes_from_the_local_inventory(
    plugin: Path, netns, tmp_path: Path
):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [INJECTED_POD]}))
    conf = network_config(local_inventory=str(inventory), run_dir=str(tmp_path / "run"))
    status_conf = network_config("1.1.0", local_inventory=str(inventory))
    status = exec_plugin(plugin, "STATUS", status_conf, netns=netns.path, pod=None)
    assert status.returncode == 0, status.stdout
    run = exec_plugin(plugin, "ADD", conf, netns=netns.path, pod=("shop", "cart-1"))
    assert run.returncode == 0, run.stdout
    assert any("MESH_INBOUND" in line for line in mesh_rules(netns.name))


def test_a_pod_missing_from_the_local_inventory_fails_add_closed(
    plugin: Path, netns, tmp_path: Path
):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [INJECTED_POD]}))
    conf = network_config(
        local_inventory=str(inventory), run_dir=str(tmp_path / "run"), pod_lookup_timeout=0.5
    )
    run = exec_plugin(plugin, "ADD", conf, netns=netns.path, pod=("shop", "other"))
    assert (run.returncode, run.json["code"]) == (1, spec.TRY_AGAIN_LATER)
    assert f"cannot find pod shop/other in the local inventory {inventory}" in run.json["msg"]
    assert "fail closed" in run.json["msg"]
    assert run.json["details"] == "pod shop/other is not in it"
    assert mesh_rules(netns.name) == []
    inventory.write_text("kind: Service\nmetadata: {name: x}\n")
    bad = exec_plugin(plugin, "ADD", conf, netns=netns.path, pod=("shop", "cart-1"))
    assert (bad.returncode, bad.json["code"]) == (1, spec.TRY_AGAIN_LATER)
    assert "kind 'Service'" in bad.json["details"]
    assert mesh_rules(netns.name) == []
    inventory.unlink()
    status_conf = network_config("1.1.0", local_inventory=str(inventory))
    gone = exec_plugin(plugin, "STATUS", status_conf, netns=netns.path, pod=None)
    assert (gone.returncode, gone.json["code"]) == (1, spec.NOT_AVAILABLE)


def test_an_ambient_pod_from_the_local_inventory_fails_closed_without_the_agent(
    plugin: Path, netns, tmp_path: Path
):
    namespace = {
        "kind": "Namespace",
        "metadata": {"name": "shop", "labels": {"istio.io/dataplane-mode": "ambient"}},
    }
    pod = {"kind": "Pod", "metadata": {"name": "cart-1", "namespace": "shop"}}
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(json.dumps({"kind": "List", "items": [namespace, pod]}))
    conf = network_config(
        local_inventory=str(inventory),
        run_dir=str(tmp_path / "run"),
        ambient_enabled=True,
        agent_timeout=1,
    )
    run = exec_plugin(plugin, "ADD", conf, netns=netns.path, pod=("shop", "cart-1"))
    assert (run.returncode, run.json["code"]) == (1, spec.AGENT_UNAVAILABLE)
    assert "namespace label istio.io/dataplane-mode=ambient" in run.json["msg"]


def test_ambient_del_cleans_a_pod_the_agent_did_not_capture(tmp_path: Path, netns):
    # A sidecar pod captured by the plugin's request itself, on an ambient node: the ambient
    # agent knows the pod from its inventory only (no ADD reported it), so the request's own
    # DEL removes its rules.
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(json.dumps({"kind": "List", "items": [INJECTED_POD]}))
    run = tmp_path / "run"
    told: list[str] = []

    def stand_in(route: str, text: str) -> Any:
        async def handler(event: dict[str, Any]) -> tuple[int, str]:
            told.append(route)
            return 200, text

        return handler

    ambient = {
        "/cmdadd": stand_in("/cmdadd", "noted"),
        "/cmddel": stand_in("/cmddel", "pod shop/cart-1: its sandbox was not reported"),
    }
    conf = network_config(local_inventory=str(inventory), run_dir=str(run), ambient_enabled=True)
    with NodeAgent(run, ambient=ambient):
        plugin = install_launcher(tmp_path / "bin", run)
        added = exec_plugin(plugin, "ADD", conf, netns=netns.path, pod=("shop", "cart-1"))
        assert added.returncode == 0, added.stdout
        assert mesh_rules(netns.name) != []
        deleted = exec_plugin(plugin, "DEL", conf, netns=netns.path, pod=("shop", "cart-1"))
    assert deleted.returncode == 0, deleted.stdout
    assert told == ["/cmddel"]
    assert mesh_rules(netns.name) == []
