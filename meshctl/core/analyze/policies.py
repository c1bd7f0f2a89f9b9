"""Checks on AuthorizationPolicies (``security.istio.io``): a selector that matches no workload
(MSH0101), ``to.operation.ports`` naming a port no workload in the policy's scope listens on
(MSH0102), and what the control plane's own conversion to the node proxy's L4 form leaves out
(MSH0103: HTTP attributes, invalid values, actions other than ALLOW/DENY) or cannot read at all
(MSH0104), as ``meshctl.core.k8s.cluster.policies.read_policy`` reports them.

Scope as the control plane applies it (meshctl/core/k8s/cluster/policies.py): a policy with a
selector applies to the pods it selects in its namespace (in the mesh's root namespace: in every
namespace); without one, to every pod of its namespace. A port is known when a selected pod or
template declares it as a containerPort, or a Service selecting one has it as a numeric
targetPort; a policy port equal to a Service ``port`` but not to a target is named as such (a
policy matches the port the workload listens on). With nothing known about the ports (no declared
container ports, no Service) the port check stays silent. Policies aimed at a waypoint
(``targetRef(s)``) are not checked.
"""

from __future__ import annotations

from collections.abc import Iterator

from meshctl.core.k8s import layout
from meshctl.core.k8s.cluster.objects import ObjectError
from meshctl.core.k8s.cluster.policies import read_policy

from . import codes
from .findings import Finding
from .snapshot import Item, Snapshot, Workload, field, mapping, sequence, string_map

GROUP = "security.istio.io"
KIND = "AuthorizationPolicy"
ROOT_NAMESPACE = layout.MESH_NAMESPACE


def check(snapshot: Snapshot) -> Iterator[Finding]:
    workloads = snapshot.workloads()
    services = snapshot.of_kind("Service")
    for policy in snapshot.of_kind(KIND, GROUP):
        yield from _conversion(policy)
        spec = mapping(policy.obj.get("spec"))
        if spec.get("targetRef") or spec.get("targetRefs"):
            continue
        selector = string_map(field(spec, "selector", "matchLabels"))
        in_scope = [
            w
            for w in workloads
            if policy.namespace in (ROOT_NAMESPACE, w.namespace)
            and all(w.labels.get(k) == v for k, v in selector.items())
        ]
        if selector and not in_scope:
            yield _selects_nothing(policy, selector)
            continue
        yield from _ports(policy, spec, in_scope, services)


def _conversion(policy: Item) -> Iterator[Finding]:
    try:
        facts = read_policy(policy.obj, root_namespace=ROOT_NAMESPACE)
    except ObjectError as exc:
        yield Finding(
            codes.POLICY_UNREADABLE,
            policy.subject,
            f"The control plane cannot read the policy ({exc}): it enforces none of it",
            "fix the field named (kubectl explain authorizationpolicy.spec)",
            (policy.namespace,),
        )
        return
    for warning in facts.warnings:
        yield Finding(
            codes.POLICY_NOT_ENFORCED_AS_WRITTEN,
            policy.subject,
            f"The node proxy enforces policies at L4: {warning}",
            "express the rule with L4 attributes only (ports, principals, namespaces, IP "
            "blocks), or aim an L7 policy at a waypoint with targetRefs",
            (policy.namespace,),
        )


def _selects_nothing(policy: Item, selector: dict[str, str]) -> Finding:
    labels = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    where = "any namespace" if policy.namespace == ROOT_NAMESPACE else policy.namespace
    return Finding(
        codes.POLICY_SELECTS_NOTHING,
        policy.subject,
        f"The selector {labels} matches no pod or pod template in {where}: the policy "
        "enforces nothing",
        f"correct spec.selector.matchLabels to the labels of the pods it is for (kubectl get "
        f"pods -n {policy.namespace} --show-labels), or delete the policy",
        (policy.namespace,),
    )


def _ports(
    policy: Item, spec: object, in_scope: list[Workload], services: list[Item]
) -> Iterator[Finding]:
    container = {p for w in in_scope for p in w.ports}
    targets: set[int] = set()
    service_ports: dict[int, str] = {}
    for service in services:
        sel = string_map(field(service.obj, "spec", "selector"))
        if not sel or not any(
            w.namespace == service.namespace and all(w.labels.get(k) == v for k, v in sel.items())
            for w in in_scope
        ):
            continue
        for entry in sequence(field(service.obj, "spec", "ports")):
            port = mapping(entry)
            target = port.get("targetPort", port.get("port"))
            if isinstance(target, int):
                targets.add(target)
            elif isinstance(target, str):
                targets.update(w.port_names[target] for w in in_scope if target in w.port_names)
            if isinstance(port.get("port"), int):
                service_ports[int(port["port"])] = service.name
    known = container | targets
    if not known:
        return
    named = sorted(
        str(p)
        for rule in sequence(mapping(spec).get("rules"))
        for to in sequence(mapping(rule).get("to"))
        for p in sequence(field(to, "operation", "ports"))
    )
    for text in dict.fromkeys(named):
        if not text.isdigit() or int(text) in known:
            continue  # not a number: the conversion's finding (MSH0103) says so
        number = int(text)
        listed = ", ".join(str(p) for p in sorted(known))
        if number in service_ports:
            message = (
                f"Port {number} is a port of Service {service_ports[number]}, not one the "
                f"workloads listen on ({listed}): policies match the workload's port"
            )
        else:
            message = (
                f"Port {number} is not a port of any workload the policy applies to ({listed})"
            )
        yield Finding(
            codes.POLICY_UNKNOWN_PORT,
            policy.subject,
            message,
            f"use the container (target) port in to.operation.ports: one of {listed}",
            (policy.namespace,),
        )
