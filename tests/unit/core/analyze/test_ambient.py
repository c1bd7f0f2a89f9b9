"""MSH0205: a running pod that ambient mode should serve, never redirected by the node agent."""

from __future__ import annotations

from typing import Any

import pytest

from .objects import codes, healthy, namespace, node_proxy, pod, run

AMBIENT = {"istio.io/dataplane-mode": "ambient"}


def running(name: str, ns: str = "amb", **kw: Any) -> dict[str, Any]:
    obj = pod(name, ns, sidecar=False, **kw)
    obj["status"]["podIP"] = "10.1.0.7"
    return obj


def mesh() -> list[dict[str, Any]]:
    return [*healthy(), node_proxy(), namespace("amb", **AMBIENT)]


def test_a_running_pod_the_agent_never_redirected_is_an_error():
    found = run([*mesh(), running("r-0")])
    assert [f.code.id for f in found] == ["MSH0205"]
    assert "namespace label istio.io/dataplane-mode=ambient" in found[0].message
    assert "node agent has not redirected it" in found[0].message


def test_a_redirected_pod_is_silent():
    enrolled = running("r-0", annotations={"ambient.istio.io/redirection": "enabled"})
    assert codes([*mesh(), enrolled]) == []


@pytest.mark.parametrize(
    "obj",
    [
        running("r-0", labels={"app": "r", "istio.io/dataplane-mode": "none"}),
        running("r-0", hostNetwork=True),
        pod("r-0", "amb"),  # a sidecar
        pod("r-0", "amb", sidecar=False),  # no IP yet
    ],
)
def test_pods_ambient_does_not_serve_or_not_yet_are_silent(obj):
    assert codes([*mesh(), obj]) == []


def test_a_pod_labelled_ambient_in_a_plain_namespace_is_checked():
    labelled = running("r-0", "plain", labels={"app": "r", **AMBIENT})
    assert codes([*mesh(), labelled]) == ["MSH0205"]
