"""Service ports the mesh cannot classify: MSH0501 (unnamed), MSH0502 (unknown protocol)."""

from __future__ import annotations

import pytest

from meshctl.core.analyze.ports import protocol_of_name

from .objects import codes, healthy, run, service


@pytest.mark.parametrize(
    ("name", "protocol"),
    [
        ("http", "http"), ("http-web", "http"), ("HTTP2", "http2"), ("grpc-web", "grpc-web"),
        ("grpc-web-x", "grpc-web"), ("grpc-api", "grpc"), ("tcp-db", "tcp"), ("tls", "tls"),
        ("web", None), ("httpweb", None), ("http_web", None), ("dns-tcp", None),
    ],
)  # fmt: skip
def test_port_names_follow_istios_protocol_prefix_rule(name, protocol):
    assert protocol_of_name(name) == protocol


def test_an_unnamed_port_is_info_and_a_misnamed_one_a_warning():
    svc = service("api", "shop", [{"port": 80, "targetPort": 8080}, {"name": "web", "port": 81}])
    found = run([*healthy(), svc])
    assert [(f.code.id, f.level.label) for f in found] == [
        ("MSH0502", "Warning"),
        ("MSH0501", "Info"),
    ]
    assert "web (81)" in found[0].message


def test_app_protocol_wins_over_the_name():
    known = service("a", "shop", [{"name": "web", "port": 80, "appProtocol": "http"}])
    h2c = service("b", "shop", [{"port": 80, "appProtocol": "kubernetes.io/h2c"}])
    unknown = service("c", "shop", [{"name": "http", "port": 80, "appProtocol": "thrift"}])
    assert codes([*healthy(), known, h2c]) == []
    assert codes([*healthy(), unknown]) == ["MSH0502"]


def test_the_meshs_own_services_are_not_checked():
    gateway = service(
        "meshctl-ingressgateway", "meshctl-system", [{"name": "status-port", "port": 15021}]
    )
    assert codes([*healthy(), gateway]) == ["MSH0502"]
    gateway["metadata"]["labels"] = {"app.kubernetes.io/part-of": "meshctl"}
    assert codes([*healthy(), gateway]) == []


def test_udp_ports_system_namespaces_and_external_names_are_not_checked():
    udp = service("dns", "shop", [{"name": "dns", "port": 53, "protocol": "UDP"}])
    system = service("kube-dns", "kube-system", [{"name": "dns-tcp", "port": 53}])
    external = service("ext", "shop", [{"name": "db", "port": 5432}])
    external["spec"] = {"type": "ExternalName", "externalName": "db.example.com"}
    assert codes([*healthy(), udp, system, external]) == []
