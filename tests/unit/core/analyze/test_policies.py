"""AuthorizationPolicy checks: MSH0101 (selects nothing) and MSH0102 (a port nobody has)."""

from __future__ import annotations

from .objects import codes, deployment, healthy, pod, policy, run, service


def test_the_healthy_mesh_has_no_findings():
    assert run(healthy()) == []


def test_a_policy_whose_selector_matches_no_pod_is_reported():
    found = run([*healthy(), policy("typo", selector={"app": "wbe"})])
    assert [f.code.id for f in found] == ["MSH0101"]
    assert found[0].subject.ref == "AuthorizationPolicy shop/typo"
    assert "app=wbe" in found[0].message


def test_a_policy_selecting_a_deployment_template_is_silent():
    objects = [
        *healthy(),
        deployment("api", "shop", {"app": "api"}),
        policy("api", selector={"app": "api"}),
    ]
    assert codes(objects) == []


def test_a_policy_selecting_pods_of_another_namespace_only_is_reported():
    objects = [*healthy(), pod("db", "other", {"app": "db"}), policy("db", selector={"app": "db"})]
    assert codes(objects) == ["MSH0101"]


def test_a_policy_in_the_root_namespace_selects_across_namespaces():
    root = policy("all-web", "meshctl-system", selector={"app": "web"})
    assert codes([*healthy(), root]) == []


def test_a_policy_without_selector_or_aimed_at_a_waypoint_is_not_a_selects_nothing():
    waypoint = policy("wp", selector={"app": "nothing"})
    waypoint["spec"]["targetRefs"] = [{"kind": "Service", "name": "web"}]
    assert codes([*healthy(), policy("ns-wide"), waypoint]) == []


def test_a_policy_port_that_is_the_service_port_not_the_target_is_reported_as_such():
    found = run([*healthy(), policy("p80", selector={"app": "web"}, ports=["80"])])
    assert [f.code.id for f in found] == ["MSH0102"]
    assert "port of Service web" in found[0].message
    assert "8080" in found[0].fix


def test_a_policy_port_no_workload_has_is_reported_and_a_known_one_is_silent():
    assert codes([*healthy(), policy("p9", selector={"app": "web"}, ports=["9090"])]) == ["MSH0102"]
    assert codes([*healthy(), policy("p8", selector={"app": "web"}, ports=["8080"])]) == []


def test_a_named_target_port_resolves_in_the_pods():
    objects = [
        *healthy(),
        service("named", "shop", [{"name": "http", "port": 81, "targetPort": "http-9000"}]),
        pod("web-2", ports=(9000,)),
        policy("p", selector={"app": "web"}, ports=["9000"]),
    ]
    assert codes(objects) == []


def test_ports_are_not_judged_when_nothing_declares_any():
    objects = [*healthy(), deployment("bare", "shop", {"app": "bare"})]
    objects.append(policy("bare", selector={"app": "bare"}, ports=["1234"]))
    assert codes(objects) == []


def test_a_port_that_is_no_number_drops_the_allow_rule():
    found = run([*healthy(), policy("p", selector={"app": "web"}, ports=["http"])])
    assert [f.code.id for f in found] == ["MSH0103"]
    assert "rules[0] dropped (matches nothing)" in found[0].message
    assert "'http' is not a port number" in found[0].message


def test_http_attributes_drop_an_allow_rule_and_widen_a_deny_rule():
    allow = policy("allow", selector={"app": "web"}, ports=["8080"])
    allow["spec"]["rules"][0]["to"][0]["operation"]["paths"] = ["/admin"]
    deny = policy("deny", selector={"app": "web"}, ports=["8080"])
    deny["spec"]["action"] = "DENY"
    deny["spec"]["rules"][0]["to"][0]["operation"]["methods"] = ["POST"]
    found = run([*healthy(), allow, deny])
    assert [(f.code.id, f.subject.name) for f in found] == [
        ("MSH0103", "allow"),
        ("MSH0103", "deny"),
    ]
    assert "dropped (matches nothing): rules[0].to[0].operation.paths" in found[0].message
    assert "enforced without: rules[0].to[0].operation.methods" in found[1].message


def test_an_action_the_node_proxy_does_not_enforce_is_reported():
    custom = policy("ext", selector={"app": "web"})
    custom["spec"]["action"] = "CUSTOM"
    assert codes([*healthy(), custom]) == ["MSH0103"]


def test_a_policy_the_control_plane_cannot_read_is_an_error():
    unquoted = policy("unquoted", selector={"app": "web"}, ports=[8080])  # YAML's 8080, not "8080"
    found = run([*healthy(), unquoted])
    assert [(f.code.id, f.level.label) for f in found] == [("MSH0104", "Error")]
    assert "must be a list of strings" in found[0].message
