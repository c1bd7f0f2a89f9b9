"""verify's gateway findings: read from the status the controller wrote, never from a stale one."""

from __future__ import annotations

from typing import Any

from meshctl.core.gateway.gatewayapi import CONTROLLER
from meshctl.core.gateway.health import findings

CLASSES = [
    {"metadata": {"name": "meshctl"}, "spec": {"controllerName": CONTROLLER}},
    {"metadata": {"name": "other"}, "spec": {"controllerName": "example.com/other"}},
]


def cond(kind: str, status: str = "True", generation: int = 1, reason: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "observedGeneration": generation,
        "reason": reason or kind,
        "message": "" if status == "True" else "because",
    }


def gateway(name: str, *conditions: dict[str, Any], cls: str = "meshctl", generation: int = 1):
    return {
        "metadata": {"namespace": "web", "name": name, "generation": generation},
        "spec": {"gatewayClassName": cls},
        "status": {"conditions": list(conditions)},
    }


def route(name: str, parents: list[dict[str, Any]], *refs: dict[str, Any], generation: int = 1):
    return {
        "metadata": {"namespace": "web", "name": name, "generation": generation},
        "spec": {"parentRefs": list(refs)},
        "status": {"parents": parents},
    }


def parent(ref: dict[str, Any], *conditions: dict[str, Any], controller: str = CONTROLLER):
    return {"parentRef": ref, "controllerName": controller, "conditions": list(conditions)}


def test_a_programmed_gateway_and_an_attached_route_are_fine():
    gws = [gateway("gw", cond("Accepted"), cond("Programmed"))]
    ref = {"name": "gw"}
    routes = [route("r", [parent(ref, cond("Accepted"), cond("ResolvedRefs"))], ref)]
    found = findings(CLASSES, gws, routes)
    assert found.gateways == ("web/gw",)
    assert found.unprogrammed == ()
    assert (found.routes, found.unattached) == (1, ())


def test_a_gateway_not_programmed_says_the_controllers_reason():
    gws = [
        gateway("gw", cond("Accepted"), cond("Programmed", "False", reason="AddressNotAssigned"))
    ]
    found = findings(CLASSES, gws, [])
    assert found.unprogrammed == ("web/gw: Programmed=False AddressNotAssigned: because",)


def test_a_status_for_an_older_generation_is_stale_not_current():
    gws = [gateway("gw", cond("Accepted"), cond("Programmed"), generation=2)]
    found = findings(CLASSES, gws, [])
    assert found.unprogrammed == ("web/gw: Accepted is for generation 1, the object is at 2",)


def test_gateways_of_other_controllers_and_their_routes_are_left_out():
    gws = [gateway("theirs", cls="other")]
    routes = [route("r", [], {"name": "theirs"})]
    found = findings(CLASSES, gws, routes)
    assert (found.gateways, found.routes, found.unattached) == ((), 0, ())


def test_a_route_without_our_status_or_refused_is_unattached():
    gws = [gateway("gw", cond("Accepted"), cond("Programmed"))]
    a, b = {"name": "gw", "sectionName": "http"}, {"name": "gw", "sectionName": "https"}
    refused = parent(b, cond("Accepted", "False", reason="NotAllowedByListeners"))
    theirs = parent(a, cond("Accepted"), controller="example.com/other")
    routes = [route("r", [refused, theirs], a, b)]
    found = findings(CLASSES, gws, routes)
    assert found.unattached == (
        "HTTPRoute web/r -> web/gw: Accepted=False NotAllowedByListeners: because",
        "HTTPRoute web/r -> web/gw: no status from the controller for this parent yet",
    )


def test_unresolved_refs_make_an_accepted_route_unattached():
    gws = [gateway("gw", cond("Accepted"), cond("Programmed"))]
    ref = {"name": "gw", "namespace": "web"}
    bad = parent(
        {"name": "gw"}, cond("Accepted"), cond("ResolvedRefs", "False", reason="BackendNotFound")
    )
    found = findings(CLASSES, gws, [route("r", [bad], ref)])
    assert found.unattached == (
        "HTTPRoute web/r -> web/gw: ResolvedRefs=False BackendNotFound: because",
    )
