"""One row per Deployment, pod or namespace from two scrapes: MESHED, attribution of ambient
pods to their node proxy, and a proxy that did not answer as the row's reason."""

from __future__ import annotations

from meshctl.core.stat import exposition as ex
from meshctl.core.stat.pods import MeshPod, mesh_pod
from meshctl.core.stat.rows import plan, rows


def pod(name: str, mode: str, node: str = "n1", workload: str = "web") -> MeshPod:
    return MeshPod(
        namespace="shop", name=name, workload=workload, node=node, mode=mode, running=True
    )  # type: ignore[arg-type]


ZT = MeshPod(
    namespace="meshctl-system", name="zt-a", workload="zt", node="n1", mode="", running=True
)


def opened(at: float, n: float, reporter: str = "destination") -> ex.Snapshot:
    labels = (
        ("destination_workload", "web"),
        ("destination_workload_namespace", "shop"),
        ("reporter", reporter),
    )
    return ex.Snapshot(at=at, values={(ex.TCP_OPENED, labels): n})


def test_a_deployment_sums_its_sidecars_and_counts_meshed_pods():
    pods = [pod("web-1", "sidecar"), pod("web-2", "sidecar"), pod("web-3", "")]
    p = plan(pods, [ZT])
    before = {("shop", "web-1"): opened(0, 0), ("shop", "web-2"): opened(0, 5)}
    after = {("shop", "web-1"): opened(10, 10), ("shop", "web-2"): opened(10, 15)}
    [row] = rows("deploy", pods=pods, plan=p, before=before, after=after, window=10,
                 deployments=[("shop", "web")])  # fmt: skip
    assert row["meshed"] == "2/3"
    assert row["connections"] == 20
    assert row["cps"] == 2.0
    assert row["reason"] is None


def test_a_proxy_that_does_not_answer_is_the_rows_reason_and_the_others_still_count():
    pods = [pod("web-1", "sidecar"), pod("web-2", "sidecar")]
    p = plan(pods, [])
    before = {("shop", "web-1"): opened(0, 0), ("shop", "web-2"): opened(0, 0)}
    after = {("shop", "web-1"): opened(10, 4), ("shop", "web-2"): "GET ... answered 503"}
    [row] = rows("deploy", pods=pods, plan=p, before=before, after=after, window=10,
                 deployments=[("shop", "web")])  # fmt: skip
    assert row["connections"] == 4
    assert row["reason"] == "pod web-2: GET ... answered 503"
    by_pod = rows("pod", pods=pods, plan=p, before=before, after=after, window=10)
    assert [r["reason"] for r in by_pod] == [None, "pod web-2: GET ... answered 503"]


def test_ambient_pods_are_read_through_their_nodes_proxy_and_say_when_they_share_it():
    pods = [pod("web-1", "ambient"), pod("web-2", "ambient"), pod("web-3", "ambient", node="n2")]
    p = plan(pods, [ZT])
    assert list(p.proxies) == [("meshctl-system", "zt-a")]
    key = ("meshctl-system", "zt-a")
    by_pod = rows("pod", pods=pods, plan=p, before={key: opened(0, 0)},
                  after={key: opened(5, 10)}, window=5)  # fmt: skip
    assert [r["connections"] for r in by_pod] == [10, 10, 0]
    assert "2 web pods on n1" in str(by_pod[0]["reason"])
    assert by_pod[2]["reason"] == "pod web-3: no node proxy runs on node n2"
    [deploy] = rows(
        "deploy",
        pods=pods,
        plan=p,
        before={key: opened(0, 0)},
        after={key: opened(5, 10)},
        window=5,
        deployments=[("shop", "web")],
    )
    assert deploy["connections"] == 10  # once, not once per pod
    assert deploy["meshed"] == "3/3"


def test_namespace_rows_add_up_their_workloads():
    pods = [pod("web-1", "sidecar"), pod("db-1", "sidecar", workload="db")]
    p = plan(pods, [])
    before = {("shop", "web-1"): opened(0, 0), ("shop", "db-1"): opened(0, 0)}
    after = {("shop", "web-1"): opened(2, 3), ("shop", "db-1"): opened(2, 5)}
    [row] = rows("ns", pods=pods, plan=p, before=before, after=after, window=2)
    assert (row["name"], row["connections"], row["meshed"]) == ("shop", 8, "2/2")


def test_mesh_pod_reads_the_mode_and_istios_workload_name():
    base = {
        "metadata": {
            "namespace": "shop",
            "name": "web-5d9c-x1",
            "generateName": "web-5d9c-",
            "labels": {"pod-template-hash": "5d9c"},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "web-5d9c", "controller": True}],
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }
    assert mesh_pod(base).workload == "web"
    assert mesh_pod(base).mode == ""
    sidecar = {**base, "spec": {"initContainers": [{"name": "istio-proxy"}], "containers": []}}
    assert mesh_pod(sidecar).mode == "sidecar"
    ambient = {
        **base,
        "metadata": {
            **base["metadata"],
            "annotations": {"ambient.istio.io/redirection": "enabled"},
        },
    }
    assert mesh_pod(ambient).mode == "ambient"


def test_ambient_pods_say_so_when_the_node_proxies_could_not_be_listed():
    pods = [pod("web-1", "ambient")]
    p = plan(pods, [], unseen="cannot list the node proxies: 403 forbidden")
    [row] = rows("pod", pods=pods, plan=p, before={}, after={}, window=1)
    assert row["reason"] == "pod web-1: cannot list the node proxies: 403 forbidden"


def test_gateway_pods_are_those_of_a_gateway_and_the_installed_ingress_gateway():
    for labels in ({"gateway.networking.k8s.io/gateway-name": "gw"}, {"istio": "ingressgateway"}):
        gateway = {
            "metadata": {"namespace": "infra", "name": "gw-1", "labels": labels},
            "spec": {"containers": [{"name": "gateway"}]},
            "status": {"phase": "Running"},
        }
        assert mesh_pod(gateway).mode == "gateway"
