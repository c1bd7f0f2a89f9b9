"""HTTPRoute attachment to listeners and each route's status.parents, backends included."""

from __future__ import annotations

from meshctl.core.gateway.matching import Outcome, Request, match

from .cluster import (
    GROUP,
    NOW,
    condition,
    gateway,
    gateway_class,
    grant,
    listener,
    namespace,
    parent,
    route,
    rule,
    run,
    service,
    status,
)

EARLIER = "2026-11-30T00:00:00Z"


def _accepted(result, name="web", ns="infra", index=0):
    return condition(parent(result, name, ns, index)["conditions"], "Accepted")


def _resolved(result, name="web", ns="infra"):
    return condition(parent(result, name, ns)["conditions"], "ResolvedRefs")


def test_a_route_attaches_and_its_parent_entry_echoes_the_parent_ref():
    ref = {"name": "gw", "namespace": "infra", "sectionName": "http"}
    result = run(gateway_class(), gateway(), route(parents=[ref]), service())
    entry = parent(result)
    assert entry["parentRef"] == ref
    assert entry["controllerName"] == "meshctl.io/gateway-controller"
    assert _accepted(result) == ("True", "Accepted")
    assert _resolved(result) == ("True", "ResolvedRefs")


def test_a_section_name_or_port_no_listener_has_is_no_matching_parent():
    for ref in (
        {"name": "gw", "namespace": "infra", "sectionName": "nope"},
        {"name": "gw", "namespace": "infra", "port": 81},
        {"name": "gw", "namespace": "infra", "sectionName": "http", "port": 81},
    ):
        result = run(gateway_class(), gateway(), route(parents=[ref]), service())
        assert _accepted(result) == ("False", "NoMatchingParent")
        assert not result.gateways[("infra", "gw")].ports[0].listeners[0].hosts


def test_a_route_from_another_namespace_is_not_allowed_by_a_same_namespace_listener():
    result = run(gateway_class(), gateway(), route(namespace="web"), service(namespace="web"))
    assert _accepted(result, ns="web") == ("False", "NotAllowedByListeners")
    assert status(result, "Gateway", "gw")["listeners"][0]["attachedRoutes"] == 0


def test_a_selector_allows_routes_from_namespaces_with_the_labels():
    selecting = listener(
        allowedRoutes={"namespaces": {"from": "Selector", "selector": {"matchLabels": {"a": "b"}}}}
    )
    objects = (gateway_class(), gateway(selecting), service(namespace="web"))
    allowed = run(*objects, route(namespace="web"), namespace("web", a="b"))
    assert _accepted(allowed, ns="web") == ("True", "Accepted")
    refused = run(*objects, route(namespace="web"), namespace("web", a="c"))
    assert _accepted(refused, ns="web") == ("False", "NotAllowedByListeners")


def test_all_namespaces_and_none_do_what_they_say():
    every = listener(allowedRoutes={"namespaces": {"from": "All"}})
    result = run(gateway_class(), gateway(every), route(namespace="web"), service(namespace="web"))
    assert _accepted(result, ns="web") == ("True", "Accepted")
    none = listener(allowedRoutes={"namespaces": {"from": "None"}})
    result = run(gateway_class(), gateway(none), route(), service())
    assert _accepted(result) == ("False", "NotAllowedByListeners")


def test_no_shared_hostname_is_no_matching_listener_hostname():
    result = run(
        gateway_class(),
        gateway(listener(hostname="*.example.com")),
        route(hostnames=["example.com", "a.example.net"]),
        service(),
    )
    assert _accepted(result) == ("False", "NoMatchingListenerHostname")


def test_hostnames_outside_the_listener_are_ignored_for_matching():
    result = run(
        gateway_class(),
        gateway(listener(hostname="*.example.com")),
        route(hostnames=["test.example.com", "test.example.net"]),
        service(),
    )
    assert _accepted(result) == ("True", "Accepted")
    [port] = result.gateways[("infra", "gw")].ports
    assert [vh.hostname for vh in port.listeners[0].hosts] == ["test.example.com"]


def test_a_route_with_a_regular_expression_is_rejected_as_unsupported():
    regex = {"matches": [{"path": {"type": "RegularExpression", "value": "/a.*"}}]}
    result = run(gateway_class(), gateway(), route("web", rule("svc", **regex)), service())
    assert _accepted(result) == ("False", "UnsupportedValue")
    assert "RegularExpression" in parent(result)["conditions"][0]["message"]
    assert not result.gateways[("infra", "gw")].ports[0].listeners[0].hosts


def test_parent_refs_to_gateways_that_are_not_ours_get_no_entry():
    other = gateway(name="theirs", gatewayClassName="other")
    refs = [{"name": "theirs", "namespace": "infra"}, {"name": "gw", "namespace": "infra"}]
    result = run(gateway_class(), gateway(), other, route(parents=refs), service())
    parents = status(result, "HTTPRoute", "web")["parents"]
    assert [p["parentRef"]["name"] for p in parents] == ["gw"]


def test_other_controllers_entries_stay_and_our_stale_ones_go():
    web = route(parents=[{"name": "elsewhere", "namespace": "infra"}])
    theirs = {"parentRef": {"name": "x"}, "controllerName": "example.io/other", "conditions": []}
    ours = {"parentRef": {"name": "gw"}, "controllerName": "meshctl.io/gateway-controller"}
    web["status"] = {"parents": [theirs, ours]}
    result = run(gateway_class(), gateway(), web)
    assert status(result, "HTTPRoute", "web") == {"parents": [theirs]}


def test_routes_we_never_wrote_for_and_do_not_reference_us_get_no_update():
    result = run(gateway_class(), gateway(), route(parents=[{"name": "elsewhere"}]))
    assert not [u for u in result.statuses if u.kind == "HTTPRoute"]


def test_a_cross_namespace_backend_needs_a_reference_grant():
    web = route("web", rule("svc"))
    web["spec"]["rules"][0]["backendRefs"][0]["namespace"] = "backends"
    objects = (gateway_class(), gateway(), web, service(namespace="backends"))
    denied = run(*objects)
    assert _accepted(denied) == ("True", "Accepted")
    assert _resolved(denied) == ("False", "RefNotPermitted")
    table = denied.gateways[("infra", "gw")]
    decision = match(table, Request(port=80, host="a"))
    assert (decision.outcome, decision.status) == (Outcome.NO_BACKEND, 500)
    allow = grant("backends", [(GROUP, "HTTPRoute", "infra")], [("", "Service", "")])
    allowed = run(*objects, allow)
    assert _resolved(allowed) == ("True", "ResolvedRefs")
    decision = match(allowed.gateways[("infra", "gw")], Request(port=80, host="a"))
    assert decision.outcome is Outcome.FORWARD
    assert decision.backends[0].label == "backends/svc:80"


def test_backend_problems_are_reasons_in_resolved_refs():
    cases = {
        "BackendNotFound": rule("missing"),
        "InvalidKind": {"backendRefs": [{"group": "x.io", "kind": "Thing", "name": "svc"}]},
    }
    for reason, spec in cases.items():
        result = run(gateway_class(), gateway(), route("web", spec), service())
        assert _resolved(result) == ("False", reason)
    wrong_port = run(gateway_class(), gateway(), route("web", rule("svc:81")), service())
    assert _resolved(wrong_port) == ("False", "BackendNotFound")
    message = parent(wrong_port)["conditions"][1]["message"]
    assert message == "Service infra/svc has no port 81"


def test_recomputing_over_our_own_status_changes_nothing_and_keeps_the_times():
    objects = [gateway_class(), gateway(listener(), listener("tcp", 9, "TCP")), route(), service()]
    first = run(*objects, now=EARLIER)
    for update in first.statuses:
        for obj in objects:
            meta = obj["metadata"]
            if (obj["kind"], meta.get("namespace", ""), meta["name"]) == (
                update.kind,
                update.namespace,
                update.name,
            ):
                obj["status"] = update.status
    second = run(*objects, now=NOW)
    assert [u.changed for u in second.statuses] == [False] * len(second.statuses)
    assert second.statuses == tuple(
        type(u)(kind=u.kind, namespace=u.namespace, name=u.name, status=u.status, changed=False)
        for u in first.statuses
    )


def test_a_new_generation_updates_observed_generation_but_not_transition_times():
    web = route(generation=1)
    web["status"] = run(gateway_class(), gateway(), web, service(), now=EARLIER).statuses[-1].status
    web["metadata"]["generation"] = 2
    result = run(gateway_class(), gateway(), web, service())
    [accepted, resolved] = parent(result)["conditions"]
    assert accepted["observedGeneration"] == resolved["observedGeneration"] == 2
    assert accepted["lastTransitionTime"] == EARLIER


def test_the_same_backend_problem_is_said_once():
    web = route("web", rule("missing", path="/a"), rule("missing", path="/b"))
    result = run(gateway_class(), gateway(), web, service())
    assert parent(result)["conditions"][1]["message"] == "Service infra/missing not found"


def test_a_listener_taking_no_httproutes_says_so():
    tcp_only = listener(allowedRoutes={"kinds": [{"kind": "TCPRoute"}]})
    result = run(gateway_class(), gateway(tcp_only), route(), service())
    accepted = parent(result)["conditions"][0]
    assert (accepted["reason"], accepted["message"]) == (
        "NotAllowedByListeners",
        "no listener of infra/gw takes HTTPRoutes at all",
    )
