from __future__ import annotations

import pytest

from meshctl.core.gateway.gatewayapi import (
    GROUP,
    GrantFacts,
    permits,
    read_gateway,
    read_parent,
    read_selector,
)
from meshctl.core.k8s import labelselector
from meshctl.core.k8s.cluster.objects import ObjectError


def test_parent_refs_take_the_api_defaults():
    ref = read_parent({"name": "gw"}, "app")
    assert (ref.group, ref.kind, ref.namespace, ref.section, ref.port) == (
        GROUP,
        "Gateway",
        "app",
        "",
        0,
    )
    assert ref.gateway == ("app", "gw")
    service = read_parent({"group": "", "kind": "Service", "name": "svc"}, "app")
    assert service.gateway is None


def test_listeners_take_the_api_defaults():
    gw = read_gateway(
        {
            "metadata": {"name": "gw", "namespace": "infra", "generation": 4},
            "spec": {
                "gatewayClassName": "meshctl",
                "listeners": [
                    {
                        "name": "https",
                        "port": 443,
                        "protocol": "HTTPS",
                        "hostname": "A.Example.com",
                        "tls": {"certificateRefs": [{"name": "cert"}]},
                    },
                ],
            },
        }
    )
    [listener] = gw.listeners
    assert gw.meta.generation == 4
    assert listener.hostname == "a.example.com"
    assert listener.tls_mode == "Terminate"
    assert listener.allowed.namespaces == "Same"
    [ref] = listener.certificate_refs
    assert (ref.group, ref.kind, ref.namespace, ref.name) == ("", "Secret", "infra", "cert")


def test_a_malformed_field_is_an_object_error_naming_it():
    with pytest.raises(ObjectError, match=r"metadata.generation is str"):
        read_gateway({"metadata": {"name": "gw", "namespace": "x", "generation": "1"}})


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ({"matchLabels": {"a": "b"}}, {"a": "b", "c": "d"}, True),
        ({"matchLabels": {"a": "b"}}, {"a": "c"}, False),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["x", "y"]}]},
            {"a": "y"},
            True,
        ),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
        ({"matchExpressions": [{"key": "a", "operator": "Sometimes"}]}, {"a": "b"}, False),
        ({}, {"anything": "x"}, True),
    ],
)
def test_label_selectors(selector, labels, expected):
    reqs = read_selector({"s": selector}, "s")
    assert labelselector.holds(reqs, labels) is expected


def test_grants_allow_by_source_namespace_and_target_kind_and_name():
    grants = [
        GrantFacts(
            namespace="backends",
            sources=((GROUP, "HTTPRoute", "app"),),
            targets=(("", "Service", "one"), ("", "Secret", "")),
        )
    ]
    route = (GROUP, "HTTPRoute", "app")
    assert permits(grants, route, ("", "Service", "app", "anything"))  # same namespace
    assert permits(grants, route, ("", "Service", "backends", "one"))
    assert not permits(grants, route, ("", "Service", "backends", "two"))
    assert permits(grants, route, ("", "Secret", "backends", "any-secret"))
    assert not permits(grants, (GROUP, "HTTPRoute", "other"), ("", "Service", "backends", "one"))
    assert not permits(grants, (GROUP, "Gateway", "app"), ("", "Service", "backends", "one"))
