"""Whose an object is, and which foreign webhook configurations would inject the pods ours does.

An object is ours when it carries the install's component label or our field manager applied
it (``managedFields``, operation Apply); an object with our name that is neither is foreign (a
failed or other tool's install, seed 003): install explains it and touches it only with
``--force``. Two mutating webhooks overlap when both intercept pod creation and some namespace
and pod could match both (their label selectors are jointly satisfiable): then a pod would be
injected twice, or refused when the other webhook's service is gone (``failurePolicy: Fail``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshctl.core.k8s.install.manifest import COMPONENT_LABEL, FIELD_MANAGER

Object = Mapping[str, Any]


def managers(live: Object) -> list[str]:
    """The field managers of a live object, in the order the API lists them."""
    found = []
    for entry in (live.get("metadata") or {}).get("managedFields") or ():
        manager = str(entry.get("manager") or "")
        if manager and manager not in found:
            found.append(manager)
    return found


def applied_by(live: Object) -> list[str]:
    """The managers that server-side applied the object (``operation: Apply``)."""
    entries = (live.get("metadata") or {}).get("managedFields") or ()
    return [str(e.get("manager")) for e in entries if e.get("operation") == "Apply"]


def is_ours(live: Object) -> bool:
    """Our label, or our install's server-side apply. An update under the name ``meshctl`` is
    not enough: the control plane patches the caBundle into any webhook configuration with its
    name (its client's manager is ``meshctl`` too), a foreign one included."""
    labels = (live.get("metadata") or {}).get("labels") or {}
    return COMPONENT_LABEL in labels or FIELD_MANAGER in applied_by(live)


def foreign_reason(live: Object) -> str:
    """Why ``live`` is not ours, in one clause naming who manages it."""
    who = managers(live)
    by = f"managed by {', '.join(who)}" if who else "with no field manager recorded"
    return f"not installed by meshctl (no {COMPONENT_LABEL} label; {by})"


# -- webhook overlap ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Overlap:
    configuration: str  # the foreign MutatingWebhookConfiguration
    webhook: str  # its webhook
    ours: str  # our webhook it overlaps
    target: str  # where it sends pods ("service istio-system/istiod" or the URL)
    service: tuple[str, str] | None  # (namespace, name) when it calls a Service
    failure_policy: str


def intercepts_pod_creation(webhook: Object) -> bool:
    for rule in webhook.get("rules") or ():
        groups = rule.get("apiGroups") or ()
        resources = rule.get("resources") or ()
        operations = rule.get("operations") or ()
        if (
            any(g in ("", "*") for g in groups)
            and any(r in ("pods", "*", "*/*") for r in resources)
            and any(o in ("CREATE", "*") for o in operations)
        ):
            return True
    return False


def _requirements(selector: Object | None) -> list[tuple[str, str, frozenset[str]]]:
    if not selector:
        return []
    reqs = [
        (str(k), "In", frozenset([str(v)])) for k, v in (selector.get("matchLabels") or {}).items()
    ]
    for expr in selector.get("matchExpressions") or ():
        values = frozenset(str(v) for v in expr.get("values") or ())
        reqs.append((str(expr.get("key")), str(expr.get("operator")), values))
    return reqs


def satisfiable(selectors: Iterable[Object | None]) -> bool:
    """Whether one label set can match every selector at once (an empty selector matches all)."""
    allowed: dict[str, frozenset[str]] = {}
    excluded: dict[str, set[str]] = {}
    present: dict[str, bool] = {}
    for selector in selectors:
        for key, op, values in _requirements(selector):
            if op == "In":
                allowed[key] = allowed[key] & values if key in allowed else values
                if present.get(key) is False:
                    return False
                present[key] = True
            elif op == "NotIn":
                excluded.setdefault(key, set()).update(values)
            elif op == "Exists":
                if present.get(key) is False:
                    return False
                present[key] = True
            elif op == "DoesNotExist":
                if present.get(key) is True:
                    return False
                present[key] = False
            else:
                return False  # an operator the API would refuse: treat as matching nothing
    return all(values - excluded.get(key, set()) for key, values in allowed.items())


def _target(webhook: Object) -> tuple[str, tuple[str, str] | None]:
    config = webhook.get("clientConfig") or {}
    service = config.get("service")
    if isinstance(service, Mapping):
        ns, name = str(service.get("namespace", "")), str(service.get("name", ""))
        return f"service {ns}/{name}", (ns, name)
    return f"URL {config.get('url', '?')}", None


def overlaps(foreign: Object, ours: Sequence[Object]) -> list[Overlap]:
    """The webhooks of ``foreign`` that intercept the pods some webhook of ``ours`` does."""
    found: list[Overlap] = []
    name = str((foreign.get("metadata") or {}).get("name", ""))
    mine = [
        (str(configuration["metadata"]["name"]), hook)
        for configuration in ours
        for hook in configuration.get("webhooks") or ()
        if intercepts_pod_creation(hook)
    ]
    for hook in foreign.get("webhooks") or ():
        if not intercepts_pod_creation(hook):
            continue
        for _, our_hook in mine:
            if satisfiable(
                [hook.get("namespaceSelector"), our_hook.get("namespaceSelector")]
            ) and satisfiable([hook.get("objectSelector"), our_hook.get("objectSelector")]):
                target, service = _target(hook)
                found.append(
                    Overlap(
                        configuration=name,
                        webhook=str(hook.get("name", "")),
                        ours=str(our_hook.get("name", "")),
                        target=target,
                        service=service,
                        failure_policy=str(hook.get("failurePolicy") or "Fail"),
                    )
                )
                break
    return found
