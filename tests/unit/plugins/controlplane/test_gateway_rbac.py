"""The control plane's ClusterRole lets the gateway controller do what it does: read every
Gateway API kind it watches (GRPCRoute, TLSRoute and TCPRoute with HTTPRoute) and patch each
status it writes. A kind missing here is a 403 in a cluster and a route that never attaches."""

from __future__ import annotations

from meshctl_plugins.controlplane import gateway_controller, manifest

from meshctl.core.k8s.install.components import InstallValues


def granted() -> dict[str, set[str]]:
    """Verbs on each resource of the gateway API group in the rendered ClusterRole."""
    objs = manifest.objects(InstallValues(), manifest.ControlPlaneValues())
    (role,) = [o for o in objs if o["kind"] == "ClusterRole"]
    out: dict[str, set[str]] = {}
    for rule in role["rules"]:  # type: ignore[union-attr]
        if gateway_controller.GROUP in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault(resource, set()).update(rule["verbs"])
    return out


def test_every_status_the_controller_writes_is_readable_watchable_and_patchable():
    verbs = granted()
    group = gateway_controller.GROUP
    watched = [r for r in gateway_controller.STATUS_RESOURCES.values() if r.group == group]
    assert {r.kind for r in watched} >= {"HTTPRoute", "GRPCRoute", "TLSRoute", "TCPRoute"}
    for resource in watched:
        assert {"get", "list", "watch"} <= verbs.get(resource.plural, set()), resource.plural
        assert "patch" in verbs.get(f"{resource.plural}/status", set()), resource.plural
    assert {"get", "list", "watch"} <= verbs["referencegrants"]
