"""A Gateway's provisioned proxy: named after it, owned by it, running ``meshctl gateway run``
with the proxy env and mounts, allowed to bind low ports, exposing each listener port."""

from __future__ import annotations

import dataclasses

from meshctl.core.k8s import gatewaypod
from meshctl.core.k8s.inject.settings import InjectSettings

SETTINGS = InjectSettings(image="registry.example/meshctl:1.0", trust_domain="td.example")
PROXY = gatewaypod.GatewayProxy(
    namespace="infra",
    name="gw",
    uid="uid-1",
    class_name="meshctl",
    ports=gatewaypod.listener_ports(
        [
            {"name": "http", "port": 80, "protocol": "HTTP"},
            {"name": "https", "port": 443, "protocol": "HTTPS"},
            {"name": "other-host", "port": 80, "protocol": "HTTP"},
        ]
    ),
)


def by_kind(objects):
    return {o["kind"]: o for o in objects}


def test_three_objects_named_after_the_gateway_and_owned_by_it():
    objs = by_kind(gatewaypod.render_proxy(PROXY, SETTINGS))
    assert sorted(objs) == ["Deployment", "Service", "ServiceAccount"]
    for obj in objs.values():
        meta = obj["metadata"]
        assert (meta["namespace"], meta["name"]) == ("infra", "gw-meshctl")
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "Gateway",
                "name": "gw",
                "uid": "uid-1",
                "controller": True,
            }
        ]
        assert meta["labels"][gatewaypod.GATEWAY_NAME_LABEL] == "gw"


def test_the_pod_runs_the_gateway_with_the_proxy_env_and_binds_low_ports():
    deployment = by_kind(gatewaypod.render_proxy(PROXY, SETTINGS))["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example/meshctl:1.0"
    assert [*container["command"], *container["args"]] == [
        "meshctl",
        "gateway",
        "run",
        "--gateway",
        "infra/gw",
    ]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["TRUST_DOMAIN"] == "td.example"
    assert env["GATEWAY_NAME"] == "infra/gw"  # what ``gateway run`` reads for --gateway
    assert env["CA_ADDRESS"] == env["XDS_ADDRESS"] == SETTINGS.control_plane_address
    assert env["POD_NAMESPACE"] == {
        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}
    }
    assert {"POD_NAME", "SERVICE_ACCOUNT"} <= env.keys()
    assert pod["securityContext"]["sysctls"] == [
        {"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}
    ]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz/ready", "port": 15021}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["istio-token"] == "/var/run/secrets/tokens"
    assert volumes["istio-token"]["projected"]["sources"][0]["serviceAccountToken"]["audience"] == (
        SETTINGS.token_audience
    )
    assert volumes["istiod-ca-cert"]["configMap"]["name"] == SETTINGS.root_ca_configmap
    assert pod["serviceAccountName"] == "gw-meshctl"


def test_the_container_is_unprivileged_read_only_and_bounded_by_the_proxy_resources():
    settings = dataclasses.replace(
        SETTINGS,
        proxy_cpu="250m",
        proxy_memory="200Mi",
        proxy_cpu_limit="1",
        proxy_memory_limit="512Mi",
    )
    pod = by_kind(gatewaypod.render_proxy(PROXY, settings))["Deployment"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsUser": settings.proxy_uid,
        "runAsGroup": settings.gid,
        "runAsNonRoot": True,
    }
    assert container["resources"] == {
        "requests": {"cpu": "250m", "memory": "200Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"},
    }
    # What it writes (TLS pairs for ssl, metrics files) has a writable place: /tmp, an emptyDir.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[mounts["/tmp"]] == {"name": mounts["/tmp"], "emptyDir": {}}


def test_the_service_exposes_each_listener_port_once_and_the_status_port():
    service = by_kind(gatewaypod.render_proxy(PROXY, SETTINGS))["Service"]
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [
        ("http-80", 80),
        ("https-443", 443),
        ("status-port", 15021),
    ]
    assert service["spec"]["selector"] == {gatewaypod.GATEWAY_NAME_LABEL: "gw"}


def test_the_rendered_digest_changes_with_the_rendering_only():
    first = gatewaypod.render_proxy(PROXY, SETTINGS)
    again = gatewaypod.render_proxy(PROXY, SETTINGS)
    assert first == again
    moved = gatewaypod.render_proxy(dataclasses.replace(PROXY, ports=(("HTTP", 8080),)), SETTINGS)
    key = gatewaypod.RENDERED_ANNOTATION
    assert (
        by_kind(moved)["Service"]["metadata"]["annotations"][key]
        != (by_kind(first)["Service"]["metadata"]["annotations"][key])
    )
    assert (
        by_kind(moved)["ServiceAccount"]["metadata"]["annotations"][key]
        == (by_kind(first)["ServiceAccount"]["metadata"]["annotations"][key])
    )


def test_a_long_name_is_cut_to_a_label_and_stays_distinct():
    long_a = gatewaypod.resource_name("a" * 70, "meshctl")
    long_b = gatewaypod.resource_name("a" * 69 + "b", "meshctl")
    assert len(long_a) <= 63
    assert long_a != long_b
